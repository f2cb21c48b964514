"""The local control plane's kube-scheduler configuration (issue 32): its connection and the
pod backoff a platform team would set for gang jobs beside cluster-autoscaler."""

from __future__ import annotations

from pathlib import Path

import yaml

from e2e.cluster.controlplane import SCHEDULER_POD_MAX_BACKOFF_S, Ports, scheduler_argv
from e2e.cluster.layout import Layout


def test_the_scheduler_runs_with_its_config_file_and_the_short_backoff(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    argv = scheduler_argv(tmp_path / "bin", lay, Ports(1, 2, 3, 4, 5, 6))
    config_flag = next(a for a in argv if a.startswith("--config="))
    config = yaml.safe_load(Path(config_flag.split("=", 1)[1]).read_text())
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["clientConnection"]["kubeconfig"] == str(tmp_path / "scheduler.kubeconfig")
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["podInitialBackoffSeconds"] == 1
    assert config["podMaxBackoffSeconds"] == SCHEDULER_POD_MAX_BACKOFF_S == 1
    assert "--secure-port=5" in argv and any(a.startswith("--feature-gates=") for a in argv)


def test_the_benchmark_can_ask_for_the_kubernetes_default(tmp_path: Path) -> None:
    argv = scheduler_argv(tmp_path / "bin", Layout(tmp_path), Ports(1, 2, 3, 4, 5, 6), 10)
    config_flag = next(a for a in argv if a.startswith("--config="))
    assert (
        yaml.safe_load(Path(config_flag.split("=", 1)[1]).read_text())["podMaxBackoffSeconds"] == 10
    )
