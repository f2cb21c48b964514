"""Table tests of flag/env parsing and of the CLI's usage errors."""

from __future__ import annotations

import pytest

from torchflex_agent.cli import USAGE_HINT, main
from torchflex_agent.errors import ConfigError
from torchflex_agent.loop.logic.config import parse_args, resolve_nproc
from torchflex_agent.stores.logic import Endpoint
from torchflex_contract import env as tfenv
from torchflex_contract.exit_codes import ExitCode

BASE = ["--rdzv-id", "job-1", "--rdzv-endpoint", "store:29400"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--nnodes", "3:2", *BASE], "--nnodes"),
        (["--nnodes", "x", *BASE], "--nnodes"),
        (["--nnodes", "0", *BASE], "--nnodes"),
        (["--nnodes", "1:2:3", *BASE], "--nnodes"),
        (["--nproc-per-node", "0", *BASE], "--nproc-per-node"),
        (["--nproc-per-node", "tpu", *BASE], "--nproc-per-node"),
        (["--rdzv-backend", "zk", *BASE], "--rdzv-backend"),
        (["--rdzv-id", "none", "--rdzv-endpoint", "h:1"], "--rdzv-id"),
        (["--rdzv-endpoint", "h:1"], "--rdzv-id"),
        (["--rdzv-id", "j"], "--rdzv-endpoint"),
        (["--rdzv-id", "j", "--rdzv-endpoint", "h:notaport"], "--rdzv-endpoint"),
        (["--rdzv-id", "j", "--rdzv-endpoint", "h:99999"], "--rdzv-endpoint"),
        (["--rdzv-id", "j", "--rdzv-endpoint", "http://h:1"], "--rdzv-endpoint"),
        (["--rdzv-last-call", "-1", *BASE], "--rdzv-last-call"),
        (["--rdzv-join-timeout", "soon", *BASE], "--rdzv-join-timeout"),
        (["--max-restarts", "1.5", *BASE], "--max-restarts"),
        (["--health-port", "-3", *BASE], "--health-port"),
        (["--liveness-timeout", "0.3", "--heartbeat-interval", "0.2", *BASE], "--liveness-timeout"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse_args([*argv, "--", "python", "train.py"], env={})


def test_missing_command() -> None:
    with pytest.raises(ConfigError, match="command"):
        parse_args(BASE, env={})


def test_defaults_come_from_env() -> None:
    env = {
        tfenv.NNODES: "2:5",
        tfenv.NPROC_PER_NODE: "cpu",
        tfenv.RDZV_BACKEND: "etcd",
        tfenv.RDZV_ENDPOINT: "https://e1:2379,e2",
        tfenv.RDZV_ID: "ns-job-uid",
        tfenv.RDZV_LAST_CALL: "0.25",
        tfenv.MAX_RESTARTS: "7",
        tfenv.HEALTH_PORT: "0",
        tfenv.POD_IP: "10.1.2.3",
    }
    cfg = parse_args(["--", "python", "-c", "pass"], env=env)
    assert (cfg.min_nodes, cfg.max_nodes, cfg.nproc_spec, cfg.rdzv_backend) == (2, 5, "cpu", "etcd")
    assert cfg.endpoints == (Endpoint("https", "e1", 2379), Endpoint("http", "e2", 2379))
    assert (cfg.run_id, cfg.last_call, cfg.max_restarts, cfg.health_port) == (
        "ns-job-uid", 0.25, 7, 0,
    )  # fmt: skip
    assert cfg.node_addr == "10.1.2.3"
    assert cfg.command == ("python", "-c", "pass")


def test_flags_override_env_and_torchrun_spelling() -> None:
    cfg = parse_args(
        ["--nnodes", "3", "--nproc_per_node", "2", "--rdzv_id", "x", "--rdzv_endpoint", "[::1]:5",
         "train.py", "--lr", "1"],
        env={tfenv.NNODES: "1:9"},
    )  # fmt: skip
    assert (cfg.min_nodes, cfg.max_nodes, cfg.nproc_spec) == (3, 3, "2")
    assert cfg.endpoints == (Endpoint("http", "::1", 5),)
    assert cfg.command == ("train.py", "--lr", "1")


@pytest.mark.parametrize(
    ("spec", "gpu_limit", "cuda", "expected"),
    [
        ("4", None, 8, 4),
        ("cpu", "2", 2, 1),
        ("auto", None, 0, 1),
        ("auto", None, 4, 4),
        ("auto", "2", 8, 2),  # the container limit wins over what the host shows
        ("gpu", "1", 0, 1),
        ("auto", "0", 8, 1),
    ],
)
def test_resolve_nproc(spec: str, gpu_limit: str | None, cuda: int, expected: int) -> None:
    assert resolve_nproc(spec, gpu_limit, lambda: cuda) == expected


@pytest.mark.parametrize(("spec", "gpu_limit"), [("gpu", None), ("auto", "two")])
def test_resolve_nproc_errors(spec: str, gpu_limit: str | None) -> None:
    with pytest.raises(ConfigError):
        resolve_nproc(spec, gpu_limit, lambda: 0)


def test_cli_usage_error_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nnodes", "5:1", "--rdzv-id", "j", "--", "true"]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--nnodes" in err[0]
    assert err[1] == USAGE_HINT
    assert main(["--bogus-flag", "--", "true"]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert "--bogus-flag" in err[0] and err[1] == USAGE_HINT


def test_help_lists_every_flag_with_its_env_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--nnodes", "--rdzv-endpoint", "--max-restarts", "--liveness-timeout"):
        assert flag in out
    assert tfenv.MAX_RESTARTS in out


def test_empty_env_value_counts_as_unset() -> None:
    cfg = parse_args([*BASE, "--", "true"], env={tfenv.MAX_RESTARTS: "", tfenv.NNODES: ""})
    assert cfg.max_restarts == tfenv.DEFAULT_MAX_RESTARTS
    assert (cfg.min_nodes, cfg.max_nodes) == (1, 1)
