"""Worker env, error files, the health endpoint and the termination log."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from torchflex_agent.loop.health import HealthServer, termination_log_path, write_termination_log
from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousResult
from torchflex_agent.workers.group import LaunchContext, read_error_file, worker_env
from torchflex_contract import env as tfenv
from torchflex_contract.progress import MAX_TERMINATION_MESSAGE, AgentReport, AgentState


@pytest.mark.parametrize(
    ("node_rank", "local_rank", "rank"), [(0, 0, 0), (0, 1, 1), (1, 0, 2), (2, 1, 5)]
)
def test_worker_env(tmp_path: Path, node_rank: int, local_rank: int, rank: int) -> None:
    nodes = tuple(NodeDescriptor(f"n{i}", f"10.0.0.{i}", 4000 + i, 2) for i in range(3))
    result = RendezvousResult(round=7, node_rank=node_rank, nodes=nodes)
    ctx = LaunchContext("job-1", restart_count=2, max_restarts=5, nproc=2, error_dir=tmp_path)
    env = worker_env({"OMP_NUM_THREADS": "4", "KEEP": "x"}, result, ctx, local_rank)
    expected = {
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": "3",
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": "6", "ROLE_NAME": "default",
        "MASTER_ADDR": "10.0.0.0", "MASTER_PORT": "4000", "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "5", "TORCHELASTIC_RUN_ID": "job-1",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "OMP_NUM_THREADS": "4", "KEEP": "x",
    }  # fmt: skip
    assert {k: env[k] for k in expected} == expected
    assert env["TORCHELASTIC_ERROR_FILE"].startswith(str(tmp_path))
    assert f"rank_{rank}" in env["TORCHELASTIC_ERROR_FILE"]
    assert worker_env({}, result, ctx, 0)["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"message": {"message": "ValueError: boom", "extraInfo": {}}}', "ValueError: boom"),
        ('{"message": "plain"}', "plain"),
        ("not json", None),
        ("[1]", None),
    ],
)
def test_read_error_file(tmp_path: Path, content: str, expected: str | None) -> None:
    path = tmp_path / "error.json"
    path.write_text(content)
    assert read_error_file(path) == expected
    assert read_error_file(tmp_path / "missing.json") is None


@pytest.mark.timeout(20)
def test_health_server_serves_status() -> None:
    report = AgentReport(state=AgentState.RUNNING, round=3, world_size=4)
    server = HealthServer("127.0.0.1", 0, lambda: report)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{base}/status", timeout=5) as resp:
            assert AgentReport.from_json(resp.read().decode()) == report
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/nope", timeout=5)
    finally:
        server.stop()


def test_termination_log_is_trimmed_json(tmp_path: Path) -> None:
    path = tmp_path / "term.log"
    environ = {tfenv.TERMINATION_LOG: str(path)}
    assert termination_log_path(environ) == path
    report = AgentReport(state=AgentState.FAILED, message='x"\n' * 5000)
    write_termination_log(report, environ)
    text = path.read_text()
    assert len(text) <= MAX_TERMINATION_MESSAGE
    parsed = json.loads(text)
    assert parsed["state"] == "Failed" and parsed["message"].startswith('x"\n')
