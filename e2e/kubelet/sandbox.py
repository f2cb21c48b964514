"""Starting one container process in its pod's network and mount namespaces.

Where it sits: the process kubelet's ``agent`` calls :func:`start` per
container. The process joins the pod's network namespace (``nsenter``), gets
a private mount and UTS namespace (``unshare``) where the pod's /etc/hosts,
resolv.conf, termination-log and volumes are bind-mounted, and then execs
the container command, so the PID we hold is the container's main process.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from pathlib import Path

from e2e.cluster.layout import REPO_ROOT
from e2e.kubelet.podspec import Mount

TERMINATION_LOG = "/dev/termination-log"
# The agent image's WORKDIR (docker/agent.Dockerfile), where it ships
# examples/. Images are not run here: the checkout stands in for the image,
# seen at this path through an overlay whose writes stay in the pod (a
# container's writable layer), so a manifest written for the image runs
# unchanged.
IMAGE_WORKDIR = "/workspace"
# Directories a container has to itself, as in its image: the host's content
# shows through, what the pod writes there stays in the pod (a tmpfs-backed
# overlay). Without it every pod shared the host's /tmp (a managed etcd pod's
# /tmp/etcd-data outlived its job and was found by the next one).
PRIVATE_DIRS = ("/tmp",)


def hiding_mounts(mounts: list[Mount], needed: list[Path]) -> list[Mount]:
    """Mounts whose target is (an ancestor of) a host path the pod runs from.

    Pods here run from the checkout and its virtualenv on the host; a volume
    mounted over, say, /tmp while the checkout lives under /tmp would hide
    the program, its volumes' sources and the pod's own state directory.
    """
    out = []
    for m in mounts:
        target = Path(m.target)
        if any(path == target or target in path.parents for path in needed):
            out.append(m)
    return out


def _venv_dirs() -> list[Path]:
    """The checkout's environment and the shared one its .pth line names
    (scripts/venv.sh): pods run from both."""
    layer = (REPO_ROOT / ".venv").resolve()
    shared = [
        Path(line.strip())
        for pth in layer.glob("lib/python*/site-packages/torchflex-shared-venv.pth")
        for line in pth.read_text().splitlines()
        if line.strip()
    ]
    return [layer, *shared]


def existing_ancestor(target: str) -> Path:
    """The deepest directory of ``target``'s path that exists on the host."""
    path = Path(target).parent
    while not path.is_dir():
        path = path.parent
    return path


def overlay_dirs(targets: list[str]) -> list[Path]:
    """Host directories to overlay so the missing ``targets`` can be created
    in the pod only: each one's deepest existing ancestor, unless that is the
    root (new top-level names go into the pod's private root) or lies under
    another one already in the list."""
    found = {existing_ancestor(t) for t in targets if not os.path.lexists(t)}
    found.discard(Path("/"))
    return sorted(p for p in found if not any(q in p.parents for q in found))


def _submounts(under: Path) -> list[str]:
    """Mount points strictly below ``under`` (the top-most ones), as the host sees them."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4].replace("\\040", " ")
        if under in Path(point).parents:
            points.append(point)
    # A path can be listed twice (mounts stacked on one point): once is enough.
    return sorted({p for p in points if not any(Path(q) in Path(p).parents for q in points)})


def _root_lines(root: Path, overlays: Path, mounts: list[Mount]) -> list[str]:
    """A private root: a tmpfs holding the host's top-level entries (recursive
    bind mounts, symlinks as symlinks). Mount points the host lacks are made
    in it or in a tmpfs-backed overlay of their deepest existing ancestor,
    so a pod's volume never creates a directory or file on the host."""
    q = shlex.quote
    lines = [f"mount -t tmpfs -o mode=0755 tfroot {q(str(root))}"]
    for entry in sorted(Path("/").iterdir()):
        dest = q(str(root / entry.name))
        if entry.is_symlink():
            lines.append(f"ln -s {q(os.readlink(entry))} {dest}")
        elif entry.is_dir():
            lines += [f"mkdir {dest}", f"mount --rbind {q(str(entry))} {dest}"]
        else:
            lines += [f"touch {dest}", f"mount --bind {q(str(entry))} {dest}"]
    # The rbind that holds the pod directory also copied this tmpfs into itself.
    lines.append(f"umount -l {q(str(root) + str(root))} 2>/dev/null || true")
    private = [Path(d) for d in PRIVATE_DIRS if os.path.isdir(d)]
    # Under a private directory a mount point is made in its overlay already.
    layers = [
        layer
        for layer in overlay_dirs([m.target for m in mounts])
        if not any(p == layer or p in layer.parents for p in private)
    ]
    lines.append(f"mount -t tmpfs tfoverlays {q(str(overlays))}")
    if not os.path.lexists(IMAGE_WORKDIR):
        upper, work = overlays / "image" / "upper", overlays / "image" / "work"
        inside = q(str(root) + IMAGE_WORKDIR)
        lines += [
            f"mkdir -p {q(str(upper))} {q(str(work))} {inside}",
            f"mount -t overlay tfimage -o lowerdir={REPO_ROOT},upperdir={upper},workdir={work}"
            f" {inside}",
        ]
    for i, layer in enumerate([*private, *layers]):
        upper, work = overlays / f"{i}" / "upper", overlays / f"{i}" / "work"
        inside = q(str(root) + str(layer))
        lines += [
            f"mkdir -p {q(str(upper))} {q(str(work))}",
            f"mount -t overlay tfoverlay -o lowerdir={inside},upperdir={upper},workdir={work}"
            f" {inside}",
            # The overlay hides what was mounted below it: put it back.
            *(f"mount --rbind {q(p)} {q(str(root) + p)}" for p in _submounts(layer)),
        ]
    return lines


def _script(hostname: str, mounts: list[Mount], workdir: str, root: Path | None = None) -> str:
    lines = ["set -e", f"hostname {shlex.quote(hostname)}"]
    needed = [REPO_ROOT, *_venv_dirs(), *(m.source for m in mounts)]
    skipped = hiding_mounts(mounts, needed)
    for m in skipped:
        # The one place this kubelet departs from a real one: the host path
        # stays visible (and writable) instead of the volume. Said in the log.
        note = f"[process-kubelet] not mounting a volume at {m.target}: it would hide {REPO_ROOT}"
        lines.append(f"echo {shlex.quote(note)} >&2")
    kept = [m for m in mounts if m not in skipped]
    prefix = ""
    if root is not None:
        # Symlinks on the way (/var/run -> /run) resolved as the pod will see
        # them, since the private root's links are absolute host links.
        kept = [dataclasses.replace(m, target=os.path.realpath(m.target)) for m in kept]
        lines += _root_lines(root / "root", root / "overlays", kept)
        prefix = str(root / "root")
    for m in kept:
        target = shlex.quote(prefix + m.target)
        if m.source.is_dir():
            lines.append(f"mkdir -p {target}")
        else:
            lines.append(f"[ -e {target} ] || {{ mkdir -p $(dirname {target}); touch {target}; }}")
        lines.append(f"mount --bind {shlex.quote(str(m.source))} {target}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    if root is None:
        lines += [f"cd {shlex.quote(workdir)}", 'exec "$@"']
    else:
        cd = 'cd -- "$0" && exec "$@"'
        lines.append(
            f"exec chroot {shlex.quote(prefix)} /bin/sh -c {shlex.quote(cd)} "
            f'{shlex.quote(workdir)} "$@"'
        )
    return "\n".join(lines)


def start(
    *,
    netns: str,
    hostname: str,
    argv: list[str],
    env: dict[str, str],
    workdir: str,
    mounts: list[Mount],
    log_path: Path,
    root: Path | None = None,
) -> subprocess.Popen[bytes]:
    """``root``: a directory of the pod's own where its private root and
    overlays are mounted (in the pod's mount namespace only)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if root is not None:
        (root / "root").mkdir(parents=True, exist_ok=True)
        (root / "overlays").mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    try:
        return subprocess.Popen(
            [
                "nsenter", f"--net=/run/netns/{netns}", "--",
                "unshare", "--mount", "--uts", "--propagation", "private", "--",
                "sh", "-c", _script(hostname, mounts, workdir, root), "sh", *argv,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    finally:
        log.close()
