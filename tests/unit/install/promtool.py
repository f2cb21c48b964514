"""promtool, built from Prometheus' Go module on first use, for the chart's alert tests.

Where it sits: imported by ``tests/unit/install/test_chart_alerts.py``. The binary is
cached under ``~/.cache/torchflex/bin`` keyed by the module version and the Go
version, so a fresh machine builds it once (``go install``; minutes cold, most of it
Prometheus' Kubernetes discovery code, which promtool links whatever the tags) and
every later run finds it. ``remove_all_sd`` leaves out the cloud service
discoveries, which nothing here checks. The Go proxy serves the module; its go.mod has
no replace directives, so ``go install pkg@version`` builds the release as published.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

# github.com/prometheus/prometheus's module version of Prometheus 3.16.0.
PROMETHEUS_MODULE_VERSION = "v0.316.0"
PACKAGE = "github.com/prometheus/prometheus/cmd/promtool"
# Cold, on a 2-core machine at load 15-30: 25.5 min wall for 4.5 min of CPU (most of it
# Prometheus' Kubernetes discovery code); warm Go caches: seconds.
BUILD_TIMEOUT_S = 2400


def cache_root() -> Path:
    return Path(os.environ.get("TORCHFLEX_CACHE") or Path.home() / ".cache" / "torchflex")


def go_version() -> str:
    out = subprocess.run(
        ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.strip()


def promtool_path() -> Path:
    """The cached promtool, built first when it is missing (one build at a time)."""
    root = cache_root()
    bin_dir = root / "bin" / f"promtool-{PROMETHEUS_MODULE_VERSION}_{go_version()}"
    tool = bin_dir / "promtool"
    if tool.exists():
        return tool
    bin_dir.mkdir(parents=True, exist_ok=True)
    with (bin_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it
        if not tool.exists():
            build(bin_dir, root)
    return tool


def build(bin_dir: Path, root: Path) -> None:
    staging = bin_dir / "staging"
    env = {
        **os.environ,
        # The toolchain's Go caches (e2e/toolchain/build.sh): shared modules stay warm.
        "GOMODCACHE": os.environ.get("GOMODCACHE") or str(root / "gomod"),
        "GOCACHE": os.environ.get("GOCACHE") or str(root / "gobuild"),
        "GOFLAGS": "-trimpath",
        "CGO_ENABLED": "0",
        "GOBIN": str(staging),
    }
    log = bin_dir / "build.log"
    with log.open("w") as out:
        done = subprocess.run(
            ["go", "install", "-tags", "remove_all_sd", f"{PACKAGE}@{PROMETHEUS_MODULE_VERSION}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"building promtool failed (rc {done.returncode}; {log}):\n{tail}")
    (staging / "promtool").rename(bin_dir / "promtool")  # whole or absent, never half
