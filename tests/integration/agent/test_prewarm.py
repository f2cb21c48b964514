"""The worker fork server with real processes: env, argv, exit codes, lifetime.

Scripts here are small stdlib programs (no torch), run the way the agent
runs a training script: ``python script.py args`` or ``python -m module``,
forked by a real zygote process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.agent.tfagent_helpers import pid_alive
from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousResult
from torchflex_agent.workers.group import LaunchContext, WorkerGroup, set_pdeathsig
from torchflex_agent.workers.logic import GroupState
from torchflex_agent.workers.prewarm import ForkedProc, ForkServer, python_launch

SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys
    import localmod  # beside the script: must be imported by the worker, not the zygote
    if os.environ.get("MODE") == "raise":
        raise ValueError("boom-" + os.environ["RANK"])
    if os.environ.get("MODE") == "sleep":
        print("sleeping", flush=True)
        import time; time.sleep(60)
    if os.environ.get("MODE") == "finalizers":  # torch.library's stand-in, and a script's own
        import types, weakref
        lib = sys.modules["torch.library"] = types.ModuleType("torch.library")
        lib._del_library = lambda: print("torch.library teardown ran", flush=True)
        class Held: pass
        held = [Held(), Held()]
        weakref.finalize(held[0], lib._del_library)
        weakref.finalize(held[1], print, "script finalizer ran", flush=True)
    print(json.dumps({"name": __name__, "argv": sys.argv, "rank": os.environ["RANK"],
                      "cwd": os.getcwd(), "path0": sys.path[0], "local": localmod.SEEN,
                      "frozen": gc.get_freeze_count()}))
    sys.exit(int(os.environ.get("CODE", "0")))
    """
)
LOCALMOD = textwrap.dedent(
    """
    import os
    SEEN = os.environ.get("RANK")
    with open(os.environ["MARKER"], "a") as f:
        f.write(f"{os.getpid()} {SEEN}\\n")
    """
)


@pytest.fixture()
def script_dir(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    d.mkdir()
    (d / "train.py").write_text(SCRIPT)
    (d / "localmod.py").write_text(LOCALMOD)
    return d


@pytest.fixture()
def server(script_dir: Path, tmp_path: Path) -> Iterator[ForkServer]:
    launch = python_launch([sys.executable, str(script_dir / "train.py"), "--flag", "x"])
    assert launch is not None
    env = dict(os.environ, MARKER=str(tmp_path / "marker"))
    fs = ForkServer(launch, env, set_pdeathsig)
    try:
        assert fs.wait_ready(60), "fork server never got ready"
        yield fs
    finally:
        fs.close()


def run(server: ForkServer, env: dict[str, str], timeout: float = 30) -> tuple[int, str, str]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = server.spawn(env, out_w, err_w)
    finally:
        os.close(out_w)
        os.close(err_w)
    code = proc.wait(timeout)
    with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
        return code, out.read().decode(), err.read().decode()


def worker_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "MARKER": str(tmp_path / "marker"), "RANK": "3", **extra}


@pytest.mark.timeout(90)
def test_forked_worker_runs_script_as_main(
    server: ForkServer, script_dir: Path, tmp_path: Path
) -> None:
    import json

    # The zygote preloaded without the script's folder: localmod not imported yet.
    assert not (tmp_path / "marker").exists()
    code, out, err = run(server, worker_env(tmp_path, CODE="7"))
    assert code == 7, err
    got = json.loads(out)
    assert got["name"] == "__main__"
    assert got["argv"] == [str(script_dir / "train.py"), "--flag", "x"]
    assert got["rank"] == "3"
    assert got["local"] == "3"  # imported in the worker, with the worker's env
    assert got["path0"] == str(script_dir)
    assert got["cwd"] == os.getcwd()
    # The preloaded objects came frozen: the worker's collections never scan them.
    assert got["frozen"] > 0
    # A second worker gets a fresh fork (its own import of localmod).
    code, out, _ = run(server, worker_env(tmp_path, RANK="4"))
    assert code == 0 and json.loads(out)["local"] == "4"
    assert len((tmp_path / "marker").read_text().splitlines()) == 2


@pytest.mark.timeout(90)
def test_worker_exit_skips_torch_library_teardown_only(server: ForkServer, tmp_path: Path) -> None:
    code, out, err = run(server, worker_env(tmp_path, MODE="finalizers"))
    assert code == 0, err
    # atexit still runs the script's finalizer; torch.library's, which only
    # unregister operators in the dying process, are dropped before it.
    assert "script finalizer ran" in out
    assert "torch.library teardown ran" not in out


@pytest.mark.timeout(90)
def test_uncaught_exception_exits_1_with_traceback(server: ForkServer, tmp_path: Path) -> None:
    code, _out, err = run(server, worker_env(tmp_path, MODE="raise"))
    assert code == 1
    assert "ValueError: boom-3" in err
    assert "Traceback" in err


@pytest.mark.timeout(90)
def test_signals_and_zygote_death(server: ForkServer, tmp_path: Path) -> None:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    procs: list[ForkedProc] = []
    try:
        for _ in range(2):
            procs.append(server.spawn(worker_env(tmp_path, MODE="sleep"), out_w, err_w))
    finally:
        os.close(out_w)
        os.close(err_w)
    seen = b""
    with os.fdopen(out_r, "rb") as out:
        while seen.count(b"sleeping") < 2:  # both started (writes may interleave)
            chunk = out.read1(64)
            assert chunk, "a worker exited early"
            seen += chunk
    os.close(err_r)
    first, second = procs
    # Workers run in their own session: the agent signals the group.
    assert os.getpgid(first.pid) == first.pid
    os.killpg(first.pid, signal.SIGTERM)
    assert first.wait(10) == -signal.SIGTERM
    assert second.poll() is None
    # The zygote dies (as it would with its agent): its workers die too.
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)
    assert not pid_alive(second.pid, wait=5.0)
    assert second.wait(10) == -signal.SIGKILL
    assert not server.alive


@pytest.mark.timeout(90)
def test_module_mode(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text(
        "import os, sys\nprint(__name__, sys.argv[1:], os.environ['RANK'])\nsys.exit(3)\n"
    )
    launch = python_launch([sys.executable, "-m", "pkg.job", "a"])
    assert launch is not None
    cwd = os.getcwd()
    os.chdir(tmp_path)  # python -m finds modules from the working directory
    try:
        fs = ForkServer(launch, dict(os.environ), set_pdeathsig)
        try:
            code, out, err = run(fs, dict(os.environ, RANK="5"))
        finally:
            fs.close()
    finally:
        os.chdir(cwd)
    assert code == 3, err
    assert out.strip() == "__main__ ['a'] 5"


@pytest.mark.timeout(90)
def test_worker_group_uses_fork_server_and_falls_back(
    server: ForkServer, script_dir: Path, tmp_path: Path
) -> None:
    nodes = (NodeDescriptor("n", "127.0.0.1", 1, 2),)
    result = RendezvousResult(0, 0, nodes)
    ctx = LaunchContext("r", 0, 0, 2, tmp_path / "errors")
    cmd = [sys.executable, str(script_dir / "train.py"), "--flag", "x"]
    env = {**os.environ, "MARKER": str(tmp_path / "marker"), "CODE": "0"}
    group = WorkerGroup(cmd, result, ctx, env, server)
    group.start()
    assert group.forked == 2
    assert group.wait(30)
    assert group.poll() == (GroupState.SUCCEEDED, [])
    group.stop(1.0)
    # Fork server gone: the next group spawns normally and still works.
    server.close()
    cold = WorkerGroup(cmd, result, ctx, {**env, "CODE": "4"}, server)
    cold.start()
    assert cold.forked == 0
    assert cold.wait(60)
    state, failures = cold.poll()
    assert state is GroupState.FAILED
    assert [f.exitcode for f in failures] == [4, 4]
    cold.stop(1.0)


@pytest.mark.timeout(90)
def test_agent_sigkill_takes_zygote_and_workers(tmp_path: Path) -> None:
    """A stand-in agent starts a fork server and a worker, then is SIGKILLed."""
    agent = textwrap.dedent(
        f"""
        import os, sys, time
        from torchflex_agent.workers.prewarm import ForkServer, python_launch
        from torchflex_agent.workers.group import set_pdeathsig
        launch = python_launch([sys.executable, {str(tmp_path / "sleep.py")!r}])
        fs = ForkServer(launch, dict(os.environ), set_pdeathsig)
        assert fs.wait_ready(60)
        r, w = os.pipe()
        p = fs.spawn(dict(os.environ), w, w)
        print(fs.proc.pid, p.pid, flush=True)
        time.sleep(60)
        """
    )
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        zygote_pid, worker_pid = (int(x) for x in proc.stdout.readline().split())
        assert pid_alive(worker_pid, wait=0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        start = time.monotonic()
        assert not pid_alive(zygote_pid, wait=5.0), "zygote outlived its agent"
        assert not pid_alive(worker_pid, wait=5.0), "worker outlived its agent"
        assert time.monotonic() - start < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
