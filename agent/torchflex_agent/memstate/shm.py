"""Where the state API's in-memory copies live: a folder in ``/dev/shm`` owned by the agent.

Where it sits: the agent (``loop.agent``) creates one folder at start-up with
:func:`create_dir`, names it in every worker's env (``env.STATE_DIR``, through
``workers.group.LaunchContext``), and removes it when it exits; the worker-side API
(``state``) writes and reads copies through :class:`CopyStore`. Stdlib only,
no torch: the agent imports this module, never ``state``.

Why a tmpfs file and not the worker's own memory: a copy must outlive the
worker (SIGKILLed by the agent on every re-form, or dead with a peer in a
collective) and be readable by the next round's worker without touching disk.
``/dev/shm`` is memory; in a pod it is the pod's own and goes with it. The
file is written by the worker, but the folder is the agent's: it exists for
the agent's whole life, across rounds, and the agent removes it. A folder
left by an agent that was SIGKILLed on this host is removed by the next agent
that starts here (:func:`sweep_dead`: its name carries the dead agent's PID).

One copy per local worker (``copy-<LOCAL_RANK>``): a node keeps its local
ranks across rounds while global ranks change. A write is one temp file
renamed over the copy (a reader sees the old or the new copy, never half),
checked against the fence (``fence.check``) before and right before the
rename, and never over a copy with a newer key (``memstate.logic.copies.may_write``).
No fsync: nothing reads a copy after a reboot.

In-place re-forming (gloo): a worker that can re-create its process group
without exiting says so with ``in-place-<LOCAL_RANK>`` (its PID); when the
agent keeps such workers across a re-form it hands each one its next round as
``round-<LOCAL_RANK>.json`` (the worker env a launch would have given it),
which the worker polls (:meth:`CopyStore.next_round`); ``kept-<LOCAL_RANK>``
says at once, before the new round forms, that it was kept (a worker whose
collective failed for another reason gives up quickly instead of waiting).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from torchflex_agent import fence
from torchflex_agent.memstate.logic.copies import CopyMeta, may_write
from torchflex_agent.memstate.logic.shards import OWN
from torchflex_contract import env as tfenv

log = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")
_PREFIX = "torchflex-state-"
_MAX_HEADER_BYTES = 4096


def create_dir(root: Path | None = None) -> Path:
    """The agent's folder for its workers' copies: in ``/dev/shm`` when the host has one
    (else the temp folder: still correct, only no longer memory-backed)."""
    base = root if root is not None else (SHM_ROOT if SHM_ROOT.is_dir() else None)
    if base is not None:
        sweep_dead(base)
    return Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base))


def in_place_pids(folder: Path, nproc: int) -> list[int | None]:
    """Per local rank, the PID of the worker that declared it re-forms in place (or None)."""
    out: list[int | None] = []
    for local_rank in range(nproc):
        try:
            out.append(int((folder / f"in-place-{local_rank}").read_text()))
        except (OSError, ValueError):
            out.append(None)
    return out


def mark_kept(folder: Path, local_rank: int, round_no: int) -> None:
    """Tell a worker at once that its agent keeps it past ``round_no`` (a new round follows)."""
    _write_text(folder / f"kept-{local_rank}", str(round_no))


def hand_round(folder: Path, local_rank: int, round_no: int, env: Mapping[str, str]) -> None:
    """Tell a kept worker its next round: the env a launch for ``round_no`` would give it."""
    text = json.dumps({"round": round_no, "env": dict(env)})
    _write_text(folder / f"round-{local_rank}.json", text)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def sweep_dead(root: Path) -> list[Path]:
    """Remove folders of agents that died without removing theirs (SIGKILL); returns them."""
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            name = entry.name
            if not name.startswith(_PREFIX):
                continue
            pid_text = name[len(_PREFIX) :].split("-", 1)[0]
            if not pid_text.isdigit() or _pid_alive(int(pid_text)):
                continue
            remove_dir(entry)
            removed.append(entry)
    return removed


class CopyStore:
    """One worker's view of its agent's folder (``env.STATE_DIR``); absent: no copies kept."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._environ = environ
        folder = env.get(tfenv.STATE_DIR, "")
        self.directory = Path(folder) if folder else None
        self.local_rank = int(env.get("LOCAL_RANK", "0") or "0")

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    @property
    def path(self) -> Path | None:
        return self.file(OWN)

    def file(self, slot: str) -> Path | None:
        """This worker's file of ``slot`` (:data:`OWN`, or a slot of sharded state,
        ``peer.ring``): ``<slot>-<LOCAL_RANK>``."""
        return None if self.directory is None else self.directory / f"{slot}-{self.local_rank}"

    def declare_in_place(self) -> None:
        """This worker re-creates its process group in place when the agent keeps it."""
        if self.directory is not None:
            _write_text(self.directory / f"in-place-{self.local_rank}", str(os.getpid()))

    def kept_past(self, round_no: int) -> bool:
        """Whether the agent said it keeps this worker past ``round_no``."""
        if self.directory is None:
            return False
        try:
            return int((self.directory / f"kept-{self.local_rank}").read_text()) >= round_no
        except (OSError, ValueError):
            return False

    def next_round(self, after: int) -> tuple[int, dict[str, str]] | None:
        """The round (and env) the agent handed this worker, if newer than ``after``."""
        if self.directory is None:
            return None
        try:
            raw = json.loads((self.directory / f"round-{self.local_rank}.json").read_text())
            round_no, env = int(raw["round"]), {str(k): str(v) for k, v in raw["env"].items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("unreadable round file: %s", exc)
            return None
        return (round_no, env) if round_no > after else None

    def fence_check(self) -> fence.FenceCheck:
        return fence.check(self._environ)

    def read_meta(self, slot: str = OWN) -> CopyMeta | None:
        """This worker's node copy's key, or None (none yet, or unreadable)."""
        path = self.file(slot)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return CopyMeta.from_header(f.readline(_MAX_HEADER_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("unreadable state copy %s: %s", path, exc)
            return None

    def read(self, slot: str = OWN) -> tuple[CopyMeta, bytes] | None:
        """The copy's key and payload, or None."""
        path = self.file(slot)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                meta = CopyMeta.from_header(f.readline(_MAX_HEADER_BYTES))
                return meta, f.read()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("unreadable state copy %s: %s", path, exc)
            return None

    def write(
        self,
        meta: CopyMeta,
        payload: bytes | memoryview,
        slot: str = OWN,
        previous: str | None = None,
    ) -> str | None:
        """Replace the copy; None when it landed, else why it was refused. ``previous``:
        the slot that keeps the copy replaced (:meth:`keep_previous`), only once the
        write is sure to land. A failed write (``/dev/shm`` full: its size limit) is a
        refusal too: the caller's ring stays in lockstep, the step goes on."""
        path = self.file(slot)
        if path is None:
            return "no state folder (not run by torchflex-agent)"
        first = self.fence_check()
        if not first.verdict.may_write:
            return f"fenced ({first.verdict.value})"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(meta.header())
                f.write(payload)
            # Checked again at the commit point: serializing may have outlasted the lease.
            now = self.fence_check()
            if not now.verdict.may_write:
                return f"fenced ({now.verdict.value})"
            current = self.read_meta(slot)
            if not may_write(current, meta):
                return f"the copy held is newer ({current})"
            if previous is not None:
                self.keep_previous(slot, previous)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("state copy %s not written: %s", path, exc)
            return f"not written ({exc})"
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return None

    def keep_previous(self, slot: str, previous: str) -> None:
        """Make ``previous`` the copy ``slot`` holds now, before ``slot`` is replaced.

        A hard link renamed over ``previous``: ``slot`` never goes missing and
        nothing is copied. Sharded state keeps one step more than it resumes
        from (``peer.ring``): a shard whose newest step died with its peer is
        still whole one step back.
        """
        src, dst = self.file(slot), self.file(previous)
        if src is None or dst is None:
            return
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        try:
            os.link(src, tmp)
        except FileNotFoundError:
            return
        os.replace(tmp, dst)
