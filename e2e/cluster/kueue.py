"""Kueue on the local cluster: its CRDs and its controller manager, run by PID.

Where it sits: like ``enforcer``, an optional daemon of a slot's cluster that
the Kueue e2e test starts (``start``) and stops (``stop``);
``lifecycle.tear_down`` stops it too, as it does every daemon recorded under
``pids/``. It is not started with every cluster: jobs without a queue label
never meet it. The binary and the release's CRDs are built by
``e2e/toolchain/build.sh`` (``KUEUE_VERSION``).

How it runs (``config``): ElasticJob is its one integration, an external
framework (``ElasticJob.v1alpha1.torchflex.io``; of the built-in ones only
``batch/job``, which an empty list defaults to, and which leaves Jobs without a
queue label alone), leader election off, health and metrics on loopback.
With internal cert management off, Kueue reads its metrics certificate from a
fixed path, ``/etc/kueue/metrics/certs``; rather than write into the host's
``/etc``, it runs in a private mount namespace whose ``/etc`` is a directory of
this slot holding just that certificate (Kueue, a static Go binary talking to
an API server at an IP address, reads nothing else there). Webhooks: the
network rule forbids the API server to dial a Service ClusterIP, and this
harness registers none at all: Kueue's webhook server still listens (on
loopback, with a certificate made here, internal cert management off) because
the manager will not start without it, but no Mutating/ValidatingWebhook-
Configuration points at it. What that leaves out: Kueue's defaulting and
validation of its own objects on admission (the objects the tests and the
operator write are complete and valid as written), and the visibility API
(its feature gate is off).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml

from e2e.cluster import processes
from e2e.cluster.crds import names_in, wait_established
from e2e.cluster.layout import Layout
from e2e.localproc import free_port
from e2e.toolchain.versions import KUEUE_VERSION

NAME = "kueue"
START_TIMEOUT_S = 90.0
EXTERNAL_FRAMEWORK = "ElasticJob.v1alpha1.torchflex.io"
NAMESPACE = "kueue-system"


class KueueError(RuntimeError):
    """Kueue could not start (not built, its CRDs refused, or it died)."""


def binary(bin_dir: Path) -> Path:
    return bin_dir / f"kueue-{KUEUE_VERSION}"


def crds(bin_dir: Path) -> Path:
    return bin_dir / f"kueue-{KUEUE_VERSION}-crds"


def running(lay: Layout) -> bool:
    return processes.alive(lay.pids, NAME)


def config(health_port: int, metrics_port: int, webhook_port: int, cert_dir: Path) -> str:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for this harness."""
    cfg = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": [], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def _private_etc(home: Path, cert_dir: Path) -> Path:
    """The ``/etc`` Kueue sees: its fixed metrics-certificate path, and nothing else."""
    etc = home / "etc"
    certs = etc / "kueue" / "metrics" / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        (certs / name).write_bytes((cert_dir / name).read_bytes())
    return etc


def _serving_cert(cert_dir: Path) -> None:
    """A self-signed certificate for 127.0.0.1 (the webhook server will not start without)."""
    if (cert_dir / "tls.crt").exists() and (cert_dir / "tls.key").exists():
        return
    cert_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "365", "-subj", "/CN=kueue-webhook",
         "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(cert_dir / "tls.key"), "-out", str(cert_dir / "tls.crt")],
        check=True,
        capture_output=True,
    )  # fmt: skip


def _run_kubectl(
    lay: Layout, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={lay.root / 'admin.kubeconfig'}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _kubectl(lay: Layout, *args: str, stdin: str | None = None) -> None:
    out = _run_kubectl(lay, *args, stdin=stdin)
    if out.returncode != 0:
        raise KueueError(f"kubectl {' '.join(args[:2])} failed: {out.stderr.strip()[-2000:]}")


def install_crds(lay: Layout, bin_dir: Path) -> None:
    """Apply the release's CRDs (server-side: the Workload CRD is too big for the
    client-side annotation) and wait until they are served."""
    folder = crds(bin_dir)
    if not folder.is_dir():
        raise KueueError(f"{folder} is missing: run e2e/toolchain/build.sh kueue")
    _kubectl(lay, "apply", "--server-side", "--force-conflicts", "-f", str(folder))
    names = names_in(
        d for f in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
    )
    wait_established(lambda argv: _run_kubectl(lay, *argv), names)
    _kubectl(lay, "apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    ))  # fmt: skip


def start(lay: Layout, bin_dir: Path) -> int:
    """CRDs, then the controller manager (idempotent); returns its PID once ready."""
    if running(lay):
        return processes.recorded(lay.pids, NAME)[0]
    exe = binary(bin_dir)
    if not exe.exists():
        raise KueueError(f"{exe} is not built: run e2e/toolchain/build.sh kueue")
    install_crds(lay, bin_dir)
    home = lay.root / "kueue"
    home.mkdir(parents=True, exist_ok=True)
    _serving_cert(home / "certs")
    health = free_port()
    cfg = home / "config.yaml"
    cfg.write_text(config(health, free_port(), free_port(), home / "certs"))
    etc = _private_etc(home, home / "certs")
    argv = [
        str(exe),
        f"--config={cfg}",
        f"--kubeconfig={lay.root / 'admin.kubeconfig'}",
        "--feature-gates=VisibilityOnDemand=false",
        "--zap-log-level=2",
    ]
    # unshare and the shell exec into Kueue (same PID): the record names Kueue's
    # own command line, which ``processes.alive`` compares with /proc.
    launcher = ["unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", 'mount --bind "$0" /etc && exec "$@"', str(etc), *argv]  # fmt: skip
    pid = processes.spawn(NAME, launcher, lay.pids, lay.logs)
    (lay.pids / f"{NAME}.json").write_text(json.dumps({"pid": pid, "argv": argv}))
    _wait_ready(lay, pid, health)
    return pid


def _exited(pid: int) -> bool:
    """Gone or a zombie. (Until unshare and sh have exec'd into Kueue its command line
    is not yet the recorded one, so ``running`` cannot tell a slow start from an exit.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _wait_ready(lay: Layout, pid: int, health_port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _exited(pid):
            raise KueueError(f"kueue exited\n{processes.exit_status_hint(lay.logs, NAME, 30)}")
        try:
            url = f"http://127.0.0.1:{health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise KueueError(
        f"kueue not ready in {START_TIMEOUT_S:.0f}s\n"
        f"{processes.exit_status_hint(lay.logs, NAME, 30)}"
    )


def stop(lay: Layout) -> None:
    processes.stop(lay.pids, NAME, grace_s=15.0)
