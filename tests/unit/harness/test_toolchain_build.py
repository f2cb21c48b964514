"""``e2e/toolchain/build.sh`` builds only the parts asked for, one progress line per
step, the Go chatter in a log file that a failure names (issue 31).

Where it sits: ``tests/unit/harness``. build.sh runs for real against a stand-in
``go`` on PATH (a few lines of shell, below): it prints ``go: downloading`` and
writes an executable where ``go build -o``/``go install`` would, or fails for the
package named in ``FAKE_GO_FAIL``. So the plan, the lines, the log and the
cache layout are build.sh's own, in a temporary cache, in milliseconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from e2e.toolchain.versions import ETCD_VERSION, KUBERNETES_VERSION, KWOK_VERSION

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "e2e" / "toolchain" / "build.sh"
PROGRESS = REPO / "scripts" / "progress.sh"

FAKE_GO = r"""#!/bin/bash
set -eu
cmd="$1"; shift
out="" pkg=""
while (( $# )); do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    -ldflags | -tags | -f) shift 2 ;;
    -json | -m) shift ;;
    *) pkg="$1"; shift ;;
  esac
done
case "$cmd" in
  env) echo go0.0-fake; exit 0 ;;
  mod) printf '{\n\t"GoMod": "%s"\n}\n' "$FAKE_GO_DIR/helm.mod"; exit 0 ;;
  list) echo "$FAKE_GO_DIR/kueue"; exit 0 ;;
esac
echo "go: downloading $pkg v9.9.9" >&2
if [[ -n "${FAKE_GO_FAIL:-}" && "$pkg" == *"$FAKE_GO_FAIL"* ]]; then
  echo "$pkg: undefined: theAnswer" >&2
  exit 1
fi
if [[ "$cmd" == install ]]; then
  name="${pkg%@*}"; out="$GOBIN/${name##*/}"
fi
printf '#!/bin/sh\n' > "$out"
chmod +x "$out"
"""


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    fake = tmp / "fakego"
    if not fake.exists():
        fake.mkdir()
        (fake / "go").write_text(FAKE_GO)
        (fake / "go").chmod(0o755)
        (fake / "helm.mod").write_text(
            "module helm.sh/helm/v3\nrequire (\n\tk8s.io/client-go v0.37.1\n)\n"
        )
        crds = fake / "kueue" / "config" / "components" / "crd" / "bases"
        crds.mkdir(parents=True)
        (crds / "kueue.x-k8s.io_clusterqueues.yaml").write_text("kind: CustomResourceDefinition\n")
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "HOME": str(tmp / "home"),
        "TORCHFLEX_CACHE": str(tmp / "cache"),
        "FAKE_GO_DIR": str(fake),
    }
    env.update(extra)
    return env


def _build(tmp: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BUILD), *args],
        env=_env(tmp, **extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _progress(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("[toolchain ")]


def _log_named(stderr: str) -> Path:
    found = re.search(r"their output: (\S+\.log)$", stderr, re.MULTILINE)
    assert found, stderr
    return Path(found.group(1))


def test_the_demo_part_builds_the_control_plane_alone_one_line_a_step(tmp_path: Path) -> None:
    out = _build(tmp_path, "control-plane")
    assert out.returncode == 0, out.stderr
    bin_dir = Path(out.stdout.strip())
    assert bin_dir.parent == tmp_path / "cache" / "bin"
    built = sorted(p.name for p in bin_dir.iterdir() if not p.name.startswith("."))
    assert built == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
    whats = [re.sub(r" \(\d+s so far\)$", "", line) for line in _progress(out.stderr)]
    assert whats == [
        f"[toolchain 1/5] building etcd {ETCD_VERSION}",
        f"[toolchain 2/5] building kube-apiserver {KUBERNETES_VERSION}",
        f"[toolchain 3/5] building kube-controller-manager {KUBERNETES_VERSION}",
        f"[toolchain 4/5] building kube-scheduler {KUBERNETES_VERSION}",
        f"[toolchain 5/5] building kwok {KWOK_VERSION}",
    ]
    # The chatter is in the log, not on the terminal; the log is under the cache.
    assert "go: downloading" not in out.stderr
    log = _log_named(out.stderr)
    assert log.parent == tmp_path / "cache" / "logs"
    assert log.read_text().count("go: downloading") == 5
    # Warm: nothing to build, nothing said.
    again = _build(tmp_path, "control-plane")
    assert (again.returncode, again.stdout, again.stderr) == (0, out.stdout, "")


def test_the_default_builds_every_part_but_the_real_nodes(tmp_path: Path) -> None:
    out = _build(tmp_path)
    assert out.returncode == 0, out.stderr
    bin_dir = Path(out.stdout.strip())
    names = {p.name for p in bin_dir.iterdir()}
    assert {"helm", "kwokctl", "kube-apiserver"} <= names
    assert {n.split("-v")[0] for n in names if n.startswith(("kube-router", "kueue"))} == {
        "kube-router",
        "kueue",
    }
    assert any(n.startswith("cluster-autoscaler-") for n in names)
    assert any(n.startswith("autoscaler-testcloud-") for n in names)
    assert "kubelet" not in names
    lines = _progress(out.stderr)
    assert len(lines) == 11 and all(f"/{len(lines)}] " in line for line in lines), lines
    # A part asked for later whose binaries are there: warm.
    assert _build(tmp_path, "kueue", "tools").stderr == ""


def test_a_failed_step_names_its_log_and_shows_its_end(tmp_path: Path) -> None:
    out = _build(tmp_path, "control-plane", FAKE_GO_FAIL="kube-scheduler")
    assert out.returncode == 1
    log = _log_named(out.stderr)
    assert re.search(
        rf"^\[toolchain 4/5\] FAILED: building kube-scheduler {KUBERNETES_VERSION}, at \d+s;"
        rf" the end of {re.escape(str(log))}:$",
        out.stderr,
        re.MULTILINE,
    ), out.stderr
    assert "    k8s.io/kubernetes/cmd/kube-scheduler: undefined: theAnswer" in out.stderr
    assert "[toolchain 5/5]" not in out.stderr
    assert out.stdout == ""
    # The rest was kept: the next run builds only what is missing.
    again = _build(tmp_path, "control-plane")
    assert [line.split(" (")[0] for line in _progress(again.stderr)] == [
        f"[toolchain 1/2] building kube-scheduler {KUBERNETES_VERSION}",
        f"[toolchain 2/2] building kwok {KWOK_VERSION}",
    ]


def test_print_builds_nothing_and_an_unknown_part_is_refused(tmp_path: Path) -> None:
    out = _build(tmp_path, "--print")
    assert out.returncode == 0 and out.stderr == ""
    assert not Path(out.stdout.strip()).exists()
    bad = _build(tmp_path, "demo")
    assert bad.returncode == 2
    assert "unknown part 'demo'" in bad.stderr


@pytest.mark.parametrize(
    ("ago_s", "shown"),
    [(0, r"0s|1s"), (134, r"2m1[45]s"), (3725, r"1h02m")],
)
def test_the_time_so_far_counts_from_the_make_start(ago_s: int, shown: str) -> None:
    t0 = int(time.time()) - ago_s
    script = f'source "{PROGRESS}"; progress_n=7; progress_line 3 "building x"'
    out = subprocess.run(
        ["bash", "-c", script],
        env={**os.environ, "TORCHFLEX_BUILD_T0": str(t0)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert re.fullmatch(rf"\[setup 3/7\] building x \(({shown}) so far\)\n", out.stderr), out.stderr


def _dry_run(*args: str) -> list[str]:
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if "e2e/toolchain/build.sh" in line]


def test_make_demo_builds_the_control_plane_and_the_test_tiers_build_everything() -> None:
    assert _dry_run("demo") == ["bash e2e/toolchain/build.sh control-plane >/dev/null"]
    assert _dry_run("demo", "NODES=real") == [
        "bash e2e/toolchain/build.sh control-plane tools real-nodes >/dev/null"
    ]
    assert _dry_run("cluster") == ["bash e2e/toolchain/build.sh control-plane tools >/dev/null"]
    everything = "bash e2e/toolchain/build.sh >/dev/null"
    for target in ("test", "test-unit", "test-integration", "test-e2e", "bench"):
        assert everything in _dry_run(target), target
