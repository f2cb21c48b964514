"""The process kubelet never mounts a volume over the host paths a pod runs from."""

from __future__ import annotations

from pathlib import Path

from e2e.kubelet.podspec import Mount
from e2e.kubelet.sandbox import _script, hiding_mounts


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
