"""``helm install`` of the chart on the real local control plane, in both RBAC modes.

The operator pod runs the Deployment's command under the process kubelet with
its projected ServiceAccount token: every call it makes is authorized by the
real API server against the chart's RBAC, so "no 403 in its log" is the proof
that the RBAC is sufficient; ``kubectl auth can-i`` shows it is no wider than
asked. Each job is one worker pod that really runs on the process node.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

from e2e.cluster import Cluster
from tests.integration.install.release import (
    TEST_OPERATOR,
    Release,
    apply_job,
    hello_job,
    job_phase,
    job_pods,
    wait_succeeded,
)
from tests.support import wait_for


def assert_quiet_uninstall(release: Release) -> None:
    """No RBAC refusal in the working life; in the window where helm has removed the RBAC
    but the operator still runs, at most the one rights-withdrawn warning per operator pod
    (never an error), besides the stopping leader's refused release of its Lease."""
    assert release.forbidden_lines() == []
    warnings, other = release.withdrawn_window()
    assert other == [], other
    assert len(warnings) <= len(release.log_files()), warnings


def assert_example_namespace_has_the_worker_account(
    release: Release, notes: str, namespace: str
) -> None:
    """NOTES names the namespace to apply the example in, and the chart put the training
    pods' ServiceAccount there."""
    (applied,) = re.findall(r"kubectl apply -n (\S+) -f examples/elasticjob-c10d.yaml", notes)
    assert applied == namespace
    account = release.cluster.kubectl("get", "sa", "torchflex-worker", "-n", applied, check=False)
    assert account.returncode == 0, account.stderr


def test_clusterwide_install_runs_jobs_upgrades_and_uninstalls_cleanly(
    cluster: Cluster, release: Release, make_namespace: Callable[[], str]
) -> None:
    notes = release.install({"operator": TEST_OPERATOR})
    assert "kubectl get ej" in notes
    assert_example_namespace_has_the_worker_account(release, notes, release.namespace)
    (first,) = release.wait_running(1)
    jobs = make_namespace()

    # An ElasticJob in any namespace gets its pods and runs to completion.
    apply_job(cluster, jobs, hello_job(cluster, "hello"))
    wait_succeeded(cluster, jobs, "hello")
    assert "hello-worker-0" in job_pods(cluster, jobs, "hello")

    # Least privilege, as the API server sees it.
    assert release.can_i("create", "pods", jobs)
    assert release.can_i("patch", "elasticjobs.torchflex.io/status", jobs)
    assert not release.can_i("get", "secrets", jobs)
    assert not release.can_i("update", "elasticjobs.torchflex.io", jobs)
    assert not release.can_i("create", "deployments.apps", jobs)
    # The training pods' ServiceAccount has no API access at all.
    assert not release.can_i("get", "pods", release.namespace, account="torchflex-worker")
    assert not release.can_i(
        "list", "elasticjobs.torchflex.io", release.namespace, "torchflex-worker"
    )

    # helm upgrade with changed values rolls the operator to a new pod with the new flags.
    release.upgrade({"operator": {**TEST_OPERATOR, "workers": 2, "logFormat": "plain"}})
    (second,) = release.wait_running(1)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    args = second["spec"]["containers"][0]["args"]
    assert "--workers=2" in args and "--log-format=plain" in args
    apply_job(cluster, jobs, hello_job(cluster, "after-upgrade"))
    wait_succeeded(cluster, jobs, "after-upgrade")
    assert "after-upgrade" in "\n".join(job_pods(cluster, jobs, "after-upgrade"))

    assert release.forbidden_lines() == []
    assert len(release.log_files()) == 2  # both incarnations logged, neither got a 403

    # Rights withdrawn under a running operator (what helm uninstall does before the pod
    # stops): refused reconciles of two new jobs give one warning, no error, no retry storm.
    release.mark()
    cluster.kubectl("delete", "clusterrolebinding", f"{release.fullname}-{release.namespace}")
    apply_job(cluster, jobs, hello_job(cluster, "refused-1"))
    apply_job(cluster, jobs, hello_job(cluster, "refused-2"))
    wait_for(lambda: release.withdrawn_window()[0], 30, "the rights-withdrawn warning")
    time.sleep(3)  # both jobs' passes (and their retries) have run by now
    warnings, other = release.withdrawn_window()
    assert len(warnings) == 1 and other == [], (warnings, other)
    assert job_pods(cluster, jobs, "refused-1") == job_pods(cluster, jobs, "refused-2") == []

    # helm uninstall: no object of the release is left; the CRD and the jobs stay (docs say so).
    release.uninstall()
    wait_for(lambda: release.leftovers() == [], 60, "no object labelled with the release")
    assert_quiet_uninstall(release)
    assert cluster.kubectl("get", "crd", "elasticjobs.torchflex.io", check=False).returncode == 0
    assert job_phase(cluster, jobs, "hello") == "Succeeded"


def test_namespaced_install_never_touches_other_namespaces(
    cluster: Cluster, release: Release, make_namespace: Callable[[], str]
) -> None:
    watched, other = make_namespace(), make_namespace()
    notes = release.install(
        {
            "watch": {"mode": "namespaced", "namespaces": [watched]},
            "operator": {**TEST_OPERATOR, "watchNodes": False},
        }
    )
    assert_example_namespace_has_the_worker_account(release, notes, watched)
    release.wait_running(1)
    apply_job(cluster, other, hello_job(cluster, "ignored"))
    apply_job(cluster, watched, hello_job(cluster, "served"))
    wait_succeeded(cluster, watched, "served")
    # The watched job went through in seconds; the other one must stay untouched.
    time.sleep(5)
    assert job_pods(cluster, other, "ignored") == []
    assert job_phase(cluster, other, "ignored") is None

    assert release.can_i("create", "pods", watched)
    assert not release.can_i("create", "pods", other)
    assert not release.can_i("list", "elasticjobs.torchflex.io", other)
    assert not release.can_i("list", "nodes", "default")  # watchNodes: false drops it
    assert release.can_i("list", "namespaces", "default")  # kopf's namespace observer
    assert release.forbidden_lines() == []

    release.uninstall()
    wait_for(lambda: release.leftovers() == [], 60, "no object labelled with the release")
    assert_quiet_uninstall(release)


def test_two_replicas_run_active_standby_and_fail_over(
    cluster: Cluster, release: Release, make_namespace: Callable[[], str]
) -> None:
    # A Lease lasting a minute: a holder starved for 15 s on a loaded machine must not hand
    # over mid-test (a fresh-clone CI saw the standby take over during the first job). The
    # failover below does not wait it out: the killed holder releases the Lease as it stops.
    notes = release.install(
        {
            "replicaCount": 2,
            "operator": {**TEST_OPERATOR, "watchNodes": False},
            "leaderElection": {"leaseDurationSeconds": 60, "renewDeadlineSeconds": 40},
        }
    )
    assert f"kubectl get lease -n {release.namespace} {release.fullname}" in notes
    pods = release.wait_running(2)
    jobs = make_namespace()
    names = {p["metadata"]["name"] for p in pods}
    wait_for(lambda: release.lease().get("holderIdentity") in names, 30, "a replica leading")
    active = release.lease()["holderIdentity"]
    transitions = release.lease()["leaseTransitions"]
    (standby,) = [p for p in pods if p["metadata"]["name"] != active]
    held = f"Lease {release.namespace}/{release.fullname} is held by {active}"
    wait_for(lambda: held in release.log(standby), 30, "the standby seeing the leader")
    apply_job(cluster, jobs, hello_job(cluster, "first"))
    wait_succeeded(cluster, jobs, "first")
    assert release.lease()["holderIdentity"] == active, release.lease()
    assert release.lease()["leaseTransitions"] == transitions, release.lease()
    assert "operator is now active" not in release.log(standby)

    # Kill the active replica: it releases the Lease as it stops, another replica (the
    # standby, or the Deployment's replacement if it reads first) takes it and serves.
    cluster.kubectl("delete", "pod", active, "-n", release.namespace, "--wait=true")
    wait_for(lambda: release.lease().get("holderIdentity") not in ("", None, active), 30,
             "another replica holding the Lease")  # fmt: skip
    lease = release.lease()
    assert lease["leaseTransitions"] == transitions + 1
    (leader,) = [p for p in release.pods() if p["metadata"]["name"] == lease["holderIdentity"]]
    # The Deployment replaced the killed pod: wait until every replica stands by behind the
    # new holder, so the uninstall below meets no pod still starting its watches.
    held = f"Lease {release.namespace}/{release.fullname} is held by {lease['holderIdentity']}"

    def standing_by(pod: dict[str, Any]) -> bool:
        return held in release.log(pod)

    for pod in release.wait_running(2):
        if pod["metadata"]["name"] != lease["holderIdentity"]:
            wait_for(functools.partial(standing_by, pod), 60, "the other replica standing by")
    apply_job(cluster, jobs, hello_job(cluster, "second"))
    wait_succeeded(cluster, jobs, "second")
    assert "operator is now active: holds Lease" in release.log(leader)
    assert release.forbidden_lines() == []

    release.uninstall()
    wait_for(lambda: release.leftovers() == [], 60, "no object labelled with the release")
    assert_quiet_uninstall(release)
