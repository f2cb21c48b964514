"""Certificates and keys for the local control plane, made with openssl.

Where it sits: ``lifecycle.ensure_up`` calls :func:`ensure_pki` once per
cluster directory. Identities mirror a kubeadm cluster (admin in
``system:masters``, controller-manager and scheduler under their own users),
so RBAC is enforced for everything else: pods get bound ServiceAccount
tokens from the TokenRequest API and are authorized like in a real cluster.
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
from pathlib import Path

from e2e.cluster.layout import CLUSTER_DOMAIN, GATEWAY_IP, PROCESS_NODE_IP_PREFIX, SERVICE_CIDR

DAYS = "3650"
# The process kubelet's serving certificate names every node address it may
# register (127.10.<slot>.1..N), so the API server can verify it.
MAX_PROCESS_NODES = 32


@dataclasses.dataclass(frozen=True)
class Identity:
    name: str
    common_name: str
    organization: str | None = None


CLIENTS = (
    Identity("admin", "kubernetes-admin", "system:masters"),
    Identity("controller-manager", "system:kube-controller-manager"),
    Identity("scheduler", "system:kube-scheduler"),
    # The process kubelet serves many nodes and resolves names cluster-wide,
    # so it runs with an admin identity of its own (visible in audit).
    Identity("kubelet", "torchflex-e2e-kubelet", "system:masters"),
    Identity("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
)


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def _ec_key(path: Path) -> None:
    _run("openssl", "ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out", str(path))


def _first_service_ip() -> str:
    base = SERVICE_CIDR.split("/")[0].rsplit(".", 1)[0]
    return f"{base}.1"


def _sign(pki: Path, name: str, subject: str, ext: str) -> None:
    key, crt = pki / f"{name}.key", pki / f"{name}.crt"
    _ec_key(key)
    with tempfile.NamedTemporaryFile("w", suffix=".ext") as ext_file:
        ext_file.write(ext)
        ext_file.flush()
        csr = subprocess.run(
            ["openssl", "req", "-new", "-key", str(key), "-subj", subject],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(
            [
                "openssl", "x509", "-req", "-CA", str(pki / "ca.crt"),
                "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", DAYS,
                "-extfile", ext_file.name, "-out", str(crt),
            ],
            input=csr,
            check=True,
            capture_output=True,
        )  # fmt: skip


def ensure_pki(pki: Path) -> None:
    """Create every key and certificate that is missing (idempotent)."""
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _ec_key(pki / "ca.key")
        _run(
            "openssl", "req", "-x509", "-new", "-key", str(pki / "ca.key"),
            "-subj", "/CN=torchflex-e2e-ca", "-days", DAYS, "-out", str(pki / "ca.crt"),
        )  # fmt: skip
    if not (pki / "sa.key").exists():
        _run("openssl", "genrsa", "-out", str(pki / "sa.key"), "2048")
        _run("openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    if not (pki / "apiserver.crt").exists():
        names = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
            "localhost",
        ]
        san = ",".join(
            [f"DNS:{n}" for n in names]
            + [f"IP:{ip}" for ip in ("127.0.0.1", GATEWAY_IP, _first_service_ip())]
        )
        _sign(
            pki,
            "apiserver",
            "/CN=kube-apiserver",
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n",
        )
    if not (pki / "kubelet-serving.crt").exists():
        ips = [f"IP:{PROCESS_NODE_IP_PREFIX}.{i}" for i in range(1, MAX_PROCESS_NODES + 1)]
        _sign(
            pki,
            "kubelet-serving",
            "/CN=torchflex-e2e-kubelet-serving",
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName={','.join(ips)}\n",
        )
    for ident in CLIENTS:
        if (pki / f"{ident.name}.crt").exists():
            continue
        subject = f"/CN={ident.common_name}"
        if ident.organization:
            subject = f"/O={ident.organization}{subject}"
        _sign(
            pki,
            ident.name,
            subject,
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n",
        )


def kubeconfig_yaml(server: str, pki: Path, identity: str) -> str:
    """A kubeconfig for one client identity (file references, not inline data)."""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: torchflex-e2e
  cluster:
    server: {server}
    certificate-authority: {pki / "ca.crt"}
users:
- name: {identity}
  user:
    client-certificate: {pki / f"{identity}.crt"}
    client-key: {pki / f"{identity}.key"}
contexts:
- name: torchflex-e2e
  context:
    cluster: torchflex-e2e
    user: {identity}
    namespace: default
current-context: torchflex-e2e
"""
