"""The health server drops a prober that went away without printing a traceback."""

from __future__ import annotations

import pytest

from torchflex_agent.loop.health import HealthServer
from torchflex_contract.progress import AgentReport, AgentState


@pytest.mark.timeout(20)
def test_client_gone_is_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    server = HealthServer("127.0.0.1", 0, lambda: AgentReport(state=AgentState.RUNNING))
    server.start()
    try:
        for exc in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise exc
            except ConnectionError:
                server._server.handle_error(None, ("127.0.0.1", 1))  # what socketserver calls
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a real bug")
        except ValueError:
            server._server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a real bug" in capsys.readouterr().err
    finally:
        server.stop()
