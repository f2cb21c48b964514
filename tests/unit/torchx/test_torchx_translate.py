"""The TorchX scheduler's pure half: AppDef -> ElasticJob, status -> TorchX state.

Where it sits: unit tier; ``torchflex_torchx.translate`` alone, by tables, with the
AppDefs TorchX's own components build (``dist.ddp``, ``dist.torchrun``,
``utils.python``), so a TorchX release that changes their command shape fails here.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from torchx import specs
from torchx.components import dist, utils

from torchflex_contract import labels
from torchflex_operator.model.vocabulary import Phase
from torchflex_torchx import translate
from torchflex_torchx.translate import Options, TranslationError

NAME = "train-abc123"


def _ddp(*args: str, **kwargs: Any) -> specs.AppDef:
    """dist.ddp, the verb of TorchX's docs; this TorchX build calls it deprecated in
    favour of dist.torchrun (tested too), which builds the same role."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*dist\.ddp is deprecated", UserWarning)
        app: specs.AppDef = dist.ddp(*args, **kwargs)
    return app


def _spec(app: specs.AppDef, options: Options | None = None) -> dict[str, Any]:
    job = translate.elastic_job(app, NAME, options or Options())
    assert job["apiVersion"] == labels.API_VERSION and job["kind"] == labels.KIND
    spec: dict[str, Any] = job["spec"]
    return spec


def _container(spec: dict[str, Any]) -> dict[str, Any]:
    (container,) = spec["template"]["spec"]["containers"]
    assert container["name"] == labels.TRAINER_CONTAINER
    return dict(container)


@pytest.mark.parametrize(
    ("j", "minimum", "maximum", "nproc"),
    [
        ("2:4x1", 2, 4, 1),
        ("2:4x3", 2, 4, 3),
        ("3x2", 3, 3, 2),
        ("1:1x1", 1, 1, 1),
        ("4", 1, 1, 4),  # TorchX's reading: one node, four processes
    ],
)
def test_ddp_j_becomes_min_max_and_nproc(j: str, minimum: int, maximum: int, nproc: int) -> None:
    spec = _spec(_ddp(script="train.py", j=j))
    assert (spec["minReplicas"], spec["maxReplicas"], spec["nprocPerNode"]) == (
        minimum,
        maximum,
        nproc,
    )


@pytest.mark.parametrize(
    ("app", "command"),
    [
        (_ddp("--steps", "5", script="t.py", j="2:3x1"), ["python", "t.py", "--steps", "5"]),
        (_ddp("--lr", "0.1", m="pkg.t", j="2:3x1"), ["python", "-m", "pkg.t", "--lr", "0.1"]),
        (dist.torchrun("--a", "b c", script="t.py", j="1:2x1"), ["python", "t.py", "--a", "b c"]),
        (utils.python(c="print(1)"), ["python", "-c", "print(1)"]),
    ],
)  # fmt: skip
def test_the_training_command_is_what_follows_torchrun(
    app: specs.AppDef, command: list[str]
) -> None:
    assert _container(_spec(app))["command"] == command


@pytest.mark.parametrize(
    ("argv", "launch"),
    [
        (["--nproc-per-node=2", "t.py"], translate.Launch(("python", "t.py"), 2)),
        (["--max_restarts", "7", "t.py", "-x"], translate.Launch(("python", "t.py", "-x"), 1, 7)),
        (["--no-python", "./bin", "a"], translate.Launch(("./bin", "a"))),
        (["-m", "pkg", "--x"], translate.Launch(("python", "-m", "pkg", "--x"))),
        (["--standalone", "--nnodes=1", "t.py"], translate.Launch(("python", "t.py"))),
    ],
)
def test_torchrun_options_are_dropped_or_kept(argv: list[str], launch: translate.Launch) -> None:
    assert translate.parse_torchrun(argv) == launch


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--bogus", "1", "t.py"], "--bogus"),
        (["--nnodes"], "--nnodes"),
        (["--nproc_per_node", "gpu", "t.py"], "--nproc_per_node"),
        (["--max_restarts=x", "t.py"], "--max_restarts"),
        (["--nnodes", "2"], "no training script"),
    ],
)
def test_bad_torchrun_lines_name_the_option(argv: list[str], names: str) -> None:
    with pytest.raises(TranslationError, match=names):
        translate.parse_torchrun(argv)


VOLUME = ["type=volume", "src=ckpt", "dst=/c"]


def test_resources_mounts_env_and_options_reach_the_pod() -> None:
    app = _ddp(
        script="t.py",
        j="2:3x1",
        cpu=1,
        gpu=2,
        memMB=512,
        env={"A": "1"},
        mounts=["type=bind", "src=/data", "dst=/d", "readonly", *VOLUME],
        max_retries=5,
    )
    options = Options(
        namespace="ml",
        service_account="trainer",
        node_selector=translate.parse_node_selector("pool=cpu, zone=a"),
        working_dir="/workspace",
    )
    job = translate.elastic_job(app, NAME, options)
    pod = job["spec"]["template"]["spec"]
    container = _container(job["spec"])
    assert job["metadata"]["namespace"] == "ml"
    assert job["spec"]["backoffLimit"] == 5
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "512Mi", "nvidia.com/gpu": "2"},
        "limits": {"nvidia.com/gpu": "2"},
    }
    assert {"name": "A", "value": "1"} in container["env"]
    assert container["workingDir"] == "/workspace"
    assert pod["serviceAccountName"] == "trainer"
    assert pod["nodeSelector"] == {"pool": "cpu", "zone": "a"}
    assert pod["volumes"] == [
        {"name": "mount-0", "hostPath": {"path": "/data"}},
        {"name": "mount-1", "persistentVolumeClaim": {"claimName": "ckpt"}},
    ]
    assert container["volumeMounts"] == [
        {"name": "mount-0", "mountPath": "/d", "readOnly": True},
        {"name": "mount-1", "mountPath": "/c", "readOnly": False},
    ]


def test_macros_are_filled_with_the_app_id_and_the_pods_index() -> None:
    role = specs.Role(
        name="r",
        image="img",
        entrypoint="python",
        args=["t.py", specs.macros.app_id, specs.macros.replica_id],
        num_replicas=2,
    )
    job = translate.elastic_job(specs.AppDef("a", roles=[role]), NAME, Options(namespace="ns"))
    assert _container(job["spec"])["command"] == [
        "python",
        "t.py",
        f"ns:{NAME}",
        "$(TORCHFLEX_REPLICA_INDEX)",
    ]


@pytest.mark.parametrize(
    ("app", "field"),
    [
        (specs.AppDef("a", roles=[]), "roles"),
        (
            specs.AppDef("a", roles=[specs.Role("x", "i"), specs.Role("y", "i")]),
            "roles",
        ),
        (
            specs.AppDef("a", roles=[specs.Role("x", "i", min_replicas=3, num_replicas=2)]),
            "min_replicas",
        ),
        (
            specs.AppDef(
                "a",
                roles=[specs.Role("x", "i", mounts=[specs.DeviceMount("/dev/x", "/dev/x")])],
            ),
            "mounts\\[0\\]",
        ),
    ],
)
def test_apps_that_are_not_one_elastic_role_are_refused(app: specs.AppDef, field: str) -> None:
    with pytest.raises(TranslationError, match=field):
        translate.elastic_job(app, NAME, Options())


@pytest.mark.parametrize(
    ("app_name", "name"),
    [
        ("train_elastic", "train-elastic-abc123"),
        ("My.Model/Run 1", "my-model-run-1-abc123"),
        ("9lives", "app-9lives-abc123"),
        ("", "app-abc123"),
        ("x" * 80, "x" * 33 + "-abc123"),
    ],
)
def test_job_names_are_dns_labels_with_room_for_the_operators_suffixes(
    app_name: str, name: str
) -> None:
    got = translate.job_name(app_name, "abc123")
    assert got == name and len(got) <= translate.MAX_JOB_NAME


@pytest.mark.parametrize("text", ["k", "=v", "a=b,c"])
def test_bad_node_selector_names_the_option(text: str) -> None:
    with pytest.raises(TranslationError, match="node_selector"):
        translate.parse_node_selector(text)


@pytest.mark.parametrize("text", ["noname", ":x", "ns:", "a:b:c"])
def test_bad_app_ids_are_refused(text: str) -> None:
    with pytest.raises(TranslationError, match="app id"):
        translate.parse_app_id(text)


def test_every_phase_of_the_operator_has_a_torchx_state() -> None:
    assert set(translate.PHASE_STATES) == {p.value for p in Phase}


@pytest.mark.parametrize(
    ("job", "state"),
    [
        ({}, specs.AppState.SUBMITTED),
        ({"status": {"phase": "Pending"}}, specs.AppState.PENDING),
        ({"status": {"phase": "Restarting"}}, specs.AppState.RUNNING),
        ({"status": {"phase": "Succeeded"}}, specs.AppState.SUCCEEDED),
        ({"status": {"phase": "Failed"}}, specs.AppState.FAILED),
        ({"status": {"phase": "Mystery"}}, specs.AppState.UNKNOWN),
        (
            {
                "metadata": {"annotations": {translate.CANCELLED_ANNOTATION: "true"}},
                "status": {"phase": "Suspended"},
            },
            specs.AppState.CANCELLED,
        ),
        (
            {
                "metadata": {"annotations": {translate.CANCELLED_ANNOTATION: "true"}},
                "status": {"phase": "Succeeded"},
            },
            specs.AppState.SUCCEEDED,
        ),
    ],
)
def test_job_status_maps_to_torchx_state(job: dict[str, Any], state: specs.AppState) -> None:
    assert translate.app_state(job) == state


def test_a_failed_jobs_message_says_why() -> None:
    job = {
        "status": {
            "phase": "Failed",
            "conditions": [{"type": "Failed", "status": "True", "message": "backoffLimit 0"}],
        }
    }
    assert translate.status_message(job) == "Failed: backoffLimit 0"
    assert translate.status_message({}) == "Submitted"


def test_the_entry_point_is_registered() -> None:
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="torchx.schedulers") if e.name == "torchflex"]
    assert ep.value == "torchflex_torchx.scheduler:create_scheduler"
