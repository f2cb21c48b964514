"""kube-router's firewall objects in the host's network namespace: read, wait for, remove.

Where it sits: ``enforcer`` runs kube-router's firewall on the slot's bridge,
which lives in the host's network namespace, so kube-router's iptables chains
and ipsets land in the host's filter table. This module knows their names
(kube-router v2.1.0, ``pkg/controllers/netpol``) and nothing else: it removes
exactly those (:func:`remove_all`), says which are left (:func:`leftovers`),
and tells when a pod's traffic runs through a given policy
(:func:`policy_applied`). The parsing is pure, so unit tests read it from
saved text (``tests/unit/harness/test_enforcer_firewall.py``).

Why our own removal: kube-router's ``--cleanup-config`` of v2.1.0 removes
none of its firewall's objects (it builds an empty controller whose handler
maps are nil, so its loops over them do nothing) and, worse on a shared
machine, flushes every IPVS service of the namespace and deletes
``kube-dummy-if``. It is not run here.
"""

from __future__ import annotations

import re
import subprocess
import time

# The chains kube-router's firewall creates: its three top-level chains, one per
# policy (and the default one), one per local pod.
TOP_CHAINS = ("KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT")
_CHAIN_PREFIXES = ("KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-")
# Its ipsets: policy sources and destinations, and the scratch sets of its atomic
# swaps (``TMP-`` + 16 base32 characters; left behind only by a kill mid-swap).
_IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-")
_TMP_IPSET = re.compile(r"TMP-[A-Z2-7]{16}")
_JUMP = re.compile(r"\s-[jg]\s+(\S+)")


class FirewallError(RuntimeError):
    """An iptables or ipset command failed, or kube-router's objects outlived removal."""


def _owned_chain(name: str) -> bool:
    return name.startswith(_CHAIN_PREFIXES)


def owned_chains(save: str) -> list[str]:
    """kube-router's chains declared in ``iptables-save -t filter`` output."""
    return [
        line[1:].split()[0]
        for line in save.splitlines()
        if line.startswith(":") and _owned_chain(line[1:].split()[0])
    ]


def owned_ipsets(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(_IPSET_PREFIXES) or _TMP_IPSET.fullmatch(n)]


def removal_script(save: str) -> str | None:
    """An ``iptables-restore --noflush`` script that removes kube-router's filter objects.

    One transaction: the rules of other chains that jump into kube-router's
    (the three ``-j KUBE-ROUTER-*`` at the top of INPUT, FORWARD and OUTPUT)
    are deleted by their exact saved text, kube-router's chains are flushed
    (declaring a chain in ``--noflush`` mode empties it) and deleted. Rules
    of every other chain are not named, so they stay as they are. None when
    there is nothing of kube-router's.
    """
    chains = owned_chains(save)
    if not chains:
        return None
    jumps = []
    for line in save.splitlines():
        if not line.startswith("-A "):
            continue
        chain = line.split()[1]
        target = _JUMP.search(line)
        if not _owned_chain(chain) and target is not None and _owned_chain(target.group(1)):
            jumps.append("-D " + line[len("-A ") :])
    lines = ["*filter", *(f":{c} - [0:0]" for c in chains), *jumps]
    lines += [f"-X {c}" for c in chains]
    return "\n".join([*lines, "COMMIT", ""])


def policy_applied(save: str, pod_ip: str, policy: str) -> bool:
    """Whether traffic to ``pod_ip`` runs through ``policy``'s chain (kube-router's rules).

    kube-router gives each local pod a chain whose rule ``-d IP/32 ... "run
    through nw policy NAME"`` sends the pod's inbound traffic to the policy's
    chain; once it is there, the pod's ingress is the policy's.
    """
    return any(
        line.startswith("-A KUBE-POD-FW-")
        and f" -d {pod_ip}/32 " in line
        and f'"run through nw policy {policy}"' in line
        for line in save.splitlines()
    )


def _run(argv: list[str], stdin: str | None = None) -> str:
    out = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise FirewallError(f"{' '.join(argv)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def save_filter() -> str:
    """The host's filter table as ``iptables-save`` writes it (the backend kube-router uses)."""
    return _run(["iptables-save", "-t", "filter"])


def _ipset_names() -> list[str]:
    return _run(["ipset", "list", "-n"]).split()


def leftovers() -> list[str]:
    """kube-router's chains and ipsets present in the host's namespace now."""
    return owned_chains(save_filter()) + owned_ipsets(_ipset_names())


def remove_all() -> None:
    """Remove every chain, jump and ipset of kube-router's firewall; nothing else.

    Only call it while no kube-router runs on the machine (``enforcer`` holds
    the machine-wide lock): a running one would put its rules back, and its
    objects are the only ones these names match.
    """
    script = removal_script(save_filter())
    if script is not None:
        _run(["iptables-restore", "--noflush", "-w", "5"], stdin=script)
    # After the rules: the kernel refuses to destroy a set an iptables rule still names.
    for name in owned_ipsets(_ipset_names()):
        _run(["ipset", "destroy", name])
    left = leftovers()
    if left:
        raise FirewallError(f"kube-router's objects outlived their removal: {', '.join(left)}")


def wait_policy_applied(pod_ips: list[str], policy: str, timeout_s: float) -> None:
    """Until kube-router runs every pod's inbound traffic through ``policy``."""
    deadline = time.monotonic() + timeout_s
    while True:
        save = save_filter()
        missing = [ip for ip in pod_ips if not policy_applied(save, ip, policy)]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise FirewallError(
                f"kube-router did not apply NetworkPolicy {policy} to {', '.join(missing)} "
                f"within {timeout_s:.0f}s"
            )
        time.sleep(0.5)
