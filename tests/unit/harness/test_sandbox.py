"""The process kubelet never mounts a volume over the host paths a pod runs from."""

from __future__ import annotations

from pathlib import Path

from e2e.kubelet.podspec import Mount
from e2e.kubelet.sandbox import _script, _venv_dirs, existing_ancestor, hiding_mounts, overlay_dirs


def test_volume_over_an_ancestor_of_the_checkout_is_not_mounted() -> None:
    scratch = Mount(Path("/var/lib/x/pods/p/volumes/tmp"), "/tmp")
    token = Mount(Path("/tmp/co/.cluster/pods/p/volumes/token"), "/run/secrets/sa")
    data = Mount(Path("/var/lib/x/data"), "/data")
    needed = [Path("/tmp/co"), Path("/tmp/co/.venv"), token.source]
    assert hiding_mounts([scratch, token, data], needed) == [scratch]
    assert hiding_mounts([data], [Path("/tmp/co")]) == []


def test_script_mounts_the_others_and_says_what_it_skipped(tmp_path: Path) -> None:
    src = tmp_path / "vol"
    src.mkdir()
    over_root = Mount(src, "/")
    keep = Mount(src, "/data")
    text = _script("h", [over_root, keep], "/")
    assert "mount --bind" in text and "/data" in text
    assert "not mounting a volume at /" in text
    assert f"mount --bind {src} /\n" not in text + "\n"


def test_missing_mount_points_are_overlaid_at_their_deepest_existing_ancestor(
    tmp_path: Path,
) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    targets = [
        str(tmp_path / "a" / "b" / "new" / "deep"),  # under a/b
        str(tmp_path / "a" / "other"),  # under a: covers a/b too
        "/tf-no-such-top-level/x",  # new top-level name: the private root, no overlay
        str(tmp_path),  # exists: mounted over, nothing created
    ]
    assert overlay_dirs(targets) == [tmp_path / "a"]
    assert existing_ancestor(targets[0]) == tmp_path / "a" / "b"


def test_script_with_a_private_root_mounts_inside_it_and_chroots(tmp_path: Path) -> None:
    src = tmp_path / "vol"
    src.mkdir()
    root = tmp_path / "fs"
    text = _script("h", [Mount(src, "/workspace")], "/workspace", root)
    assert f"mount --bind {src} {root}/root/workspace" in text
    assert f"exec chroot {root}/root" in text
    assert "mkdir -p /workspace\n" not in text


def test_targets_through_symlinks_are_resolved_before_mounting(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "var").symlink_to(tmp_path / "run")
    src = tmp_path / "token"
    src.mkdir()
    root = tmp_path / "fs"
    text = _script("h", [Mount(src, f"{tmp_path}/var/secrets")], "/", root)
    assert f"{root}/root{tmp_path}/run/secrets" in text


def test_tmp_is_private_and_covers_mount_points_below_it(tmp_path: Path) -> None:
    src = tmp_path / "vol"
    src.mkdir()
    root = tmp_path / "fs"
    target = "/tmp/tf-sandbox-unit-missing/mnt"  # only named, never created
    text = _script("h", [Mount(src, target)], "/", root)
    overlays = [ln for ln in text.splitlines() if ln.startswith("mount -t overlay tfoverlay")]
    # One overlay, of /tmp itself: the missing directory is made inside it.
    assert len(overlays) == 1
    assert overlays[0].endswith(f" {root}/root/tmp")
    assert f"mkdir -p {root}/root{target}" in text


def test_a_volume_over_the_shared_environment_is_not_mounted(tmp_path: Path) -> None:
    src = tmp_path / "vol"
    src.mkdir()
    # The last of them is the shared site-packages named by the layer's .pth.
    over = _venv_dirs()[-1].parent
    text = _script("h", [Mount(src, str(over))], "/")
    assert f"not mounting a volume at {over}" in text
