"""spec.podTemplate: which pods get what, what stays the operator's, and what reaches the Kueue Workload."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from ftjobs import make_job

from finetune_operator import constants as c
from finetune_operator.admission import validate
from finetune_operator.api.validation import InvalidSpec
from finetune_operator.builders import SshKeys, desired
from finetune_operator.builders.podtemplate_rules import reserved
from finetune_operator.builders.workload import workload

KEYS = SshKeys("k", "k.pub", "h", "h.pub")
DATA = {"name": "data", "persistentVolumeClaim": {"claimName": "fsx", "readOnly": True}}
MOUNT = {"name": "data", "mountPath": "/data", "readOnly": True}
SIDECAR = {"name": "proxy", "image": "registry.test/proxy:1", "restartPolicy": "Always"}
TEMPLATE = {
    "metadata": {"labels": {"team": "nlp"}, "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
    "priorityClassName": "training-high",
    "volumes": [DATA],
    "volumeMounts": [MOUNT],
    "initContainers": [{"name": "prep", "command": ["sh", "-c", "true"]}, SIDECAR],
}


def pods(template: dict[str, Any], mpi: bool = False, **job: Any) -> dict[str, dict[str, Any]]:
    b = make_job("j", "ns").nodes(2).classification().set("spec.podTemplate", template)
    if mpi:
        b.launcher("mpi", "mpich")
    for k, v in job.items():
        b.set(f"spec.{k}", v)
    return {p["metadata"]["name"]: p for p in desired(validate(b.build()), ssh_keys=KEYS).pods}


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"].get("initContainers", [])) + list(pod["spec"]["containers"])


def test_torchrun_ranks_get_everything_and_the_operator_keeps_its_own() -> None:
    plain = pods({})
    got = pods(TEMPLATE, compileCache={"precompile": True})
    for name, pod in got.items():
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["labels"] == {**plain[name]["metadata"]["labels"], "team": "nlp"}
        assert meta["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
        assert spec["priorityClassName"] == "training-high"
        assert spec["volumes"][-1] == DATA and [v["name"] for v in spec["volumes"][:-1]] == [
            v["name"] for v in plain[name]["spec"]["volumes"]
        ]
        # The user's init containers first, then the operator's, each of which (and the trainer) mounts /data.
        names = [x["name"] for x in spec["initContainers"]]
        assert names[:2] == ["prep", "proxy"] and c.INIT_PRECOMPILE in names
        own = [x for x in containers(pod) if x["name"] not in ("prep", "proxy")]
        assert all(x["volumeMounts"][-1] == MOUNT for x in own)
        # The user's containers: the job's image unless given, the operator's security context, their own mounts.
        prep, proxy = spec["initContainers"][:2]
        trainer = spec["containers"][0]
        assert prep["image"] == trainer["image"] and proxy["image"] == "registry.test/proxy:1"
        assert proxy["restartPolicy"] == "Always" and "restartPolicy" not in prep
        assert prep["securityContext"] == proxy["securityContext"] == trainer["securityContext"]
        assert "volumeMounts" not in prep and "env" not in prep
    # Without a template, nothing changes (the goldens hold the rest).
    assert all("annotations" not in p["metadata"] and "priorityClassName" not in p["spec"] for p in plain.values())


def test_mpi_workers_get_volumes_by_default_and_the_launcher_only_when_asked() -> None:
    got = pods(TEMPLATE, mpi=True)
    launcher, worker = got["j-launcher"], got["j-worker-0"]
    for pod in (launcher, worker):
        assert pod["metadata"]["labels"]["team"] == "nlp"
        assert pod["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
        assert pod["spec"]["priorityClassName"] == "training-high"
    assert DATA in worker["spec"]["volumes"] and DATA not in launcher["spec"]["volumes"]
    assert [x["name"] for x in worker["spec"]["initContainers"]] == ["prep", "proxy"]
    assert [x["name"] for x in launcher["spec"]["initContainers"]] == [c.INIT_WAIT]
    both = pods({**TEMPLATE, "roles": ["worker", "launcher"]}, mpi=True)
    assert all(
        x["volumeMounts"][-1] == MOUNT for x in containers(both["j-launcher"]) if x["name"] not in ("prep", "proxy")
    )
    only = pods({**TEMPLATE, "roles": ["launcher"]}, mpi=True)
    assert DATA in only["j-launcher"]["spec"]["volumes"] and DATA not in only["j-worker-1"]["spec"]["volumes"]


def test_image_pull_secrets_reach_every_pod_the_launcher_too() -> None:
    pull = [{"name": "registry-pull"}, {"name": "mirror-pull"}]
    for mpi in (False, True):
        got = pods({"imagePullSecrets": pull, "roles": ["launcher"] if mpi else ["rank"]}, mpi=mpi)
        assert {name: p["spec"]["imagePullSecrets"] for name, p in got.items()} == {name: pull for name in got}
    assert all("imagePullSecrets" not in p["spec"] for p in pods({}).values())


def test_an_image_pull_secret_is_refused_naming_its_field_and_the_fix() -> None:
    field = r"spec\.podTemplate\.imagePullSecrets\[0\]\.name: "
    with pytest.raises(InvalidSpec, match=field + "required field is missing"):
        pods({"imagePullSecrets": [{}]})
    with pytest.raises(InvalidSpec, match=field + "'Not_A_Name' is not allowed here; use a DNS subdomain"):
        pods({"imagePullSecrets": [{"name": "Not_A_Name"}]})


def test_pull_policy_of_a_user_container_defaults_to_the_jobs() -> None:
    got = pods({"initContainers": [{"name": "a"}, {"name": "b", "imagePullPolicy": "Always"}]}, imagePullPolicy="Never")
    a, b = got["j-rank-0"]["spec"]["initContainers"][:2]
    assert a["imagePullPolicy"] == "Never" and b["imagePullPolicy"] == "Always"


def test_the_operators_labels_win_even_past_admission() -> None:
    """Admission refuses a template that sets the operator's labels; the builder still keeps them if one got by
    (e.g. a job stored before a CRD upgrade)."""
    job = validate(make_job("j", "ns").nodes(2).classification().build())
    job["spec"]["podTemplate"] = {"metadata": {"labels": {c.LABEL_JOB_NAME: "other", c.LABEL_RANK: "9"}}}
    for pod in desired(job).pods:
        assert pod["metadata"]["labels"][c.LABEL_JOB_NAME] == "j"
        assert pod["metadata"]["labels"][c.LABEL_RANK] == pod["metadata"]["name"].rsplit("-", 1)[1]


def test_the_workload_carries_template_metadata_sidecars_and_priority() -> None:
    job = validate(
        make_job("j", "ns")
        .nodes(2)
        .classification()
        .set("spec.podTemplate", TEMPLATE)
        .run_policy(queueName="lq")
        .build()
    )
    d = desired(job)
    wl = workload(job, d.layout, d.names, d.pods, priority=1000)
    [ps] = wl["spec"]["podSets"]
    assert ps["template"]["metadata"] == TEMPLATE["metadata"]
    assert ps["template"]["spec"]["priorityClassName"] == "training-high"
    inits = {x["name"]: x for x in ps["template"]["spec"]["initContainers"]}
    assert inits["proxy"]["restartPolicy"] == "Always" and "restartPolicy" not in inits["prep"]
    assert wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "training-high",
    }
    # The operator's per-pod labels (rank, attempt) are not the pod set's.
    assert c.LABEL_RANK not in ps["template"]["metadata"]["labels"]
    plain = validate(make_job("j", "ns").nodes(2).classification().run_policy(queueName="lq").build())
    d = desired(plain)
    wl = workload(plain, d.layout, d.names, d.pods)
    assert "metadata" not in wl["spec"]["podSets"][0]["template"] and "priority" not in wl["spec"]


def test_reserved_names_are_what_the_builders_set() -> None:
    """Derived by rendering every shape: the runtime contract's paths, the SSH volume, every container."""
    r = reserved()
    assert {c.CONFIG_DIR, c.HOME_DIR, c.CACHE_DIR, c.OUTPUT_DIR, c.RESUME_FROM_DIR, "/tmp", "/dev/shm"} == set(
        r["paths"]
    )
    assert {"config", "home", "dshm", "tmp", "cache", "output", "ssh"} == set(r["volumes"])
    assert {c.CONTAINER_TRAINER, c.CONTAINER_SSHD, c.CONTAINER_LAUNCHER, c.INIT_WAIT, c.INIT_PRECOMPILE} == set(
        r["containers"]
    )
    assert {c.LABEL_JOB_NAME, c.LABEL_ROLE, c.LABEL_RANK, c.LABEL_ATTEMPT, c.LABEL_MANAGED_BY} <= set(r["labels"])


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"volumeMounts": [{"name": "output", "mountPath": "/x"}]}, "spec.podTemplate.volumeMounts"),
        (
            {"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/output/model"}]},
            "spec.podTemplate.volumeMounts",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/etc/ftjob/ssh"}],
            },
            "spec.podTemplate.volumeMounts",
        ),
        ({"initContainers": [{"name": "sshd"}]}, "spec.podTemplate.initContainers"),
        (
            {"initContainers": [{"name": "a", "resources": {"limits": {"aws.amazon.com/neuron": "1"}}}]},
            "spec.podTemplate.initContainers",
        ),
        ({"metadata": {"labels": {"finetune.dev/attempt": "0"}}}, "spec.podTemplate.metadata.labels"),
        ({"securityContext": {"runAsUser": 0}}, "spec.podTemplate.securityContext"),
    ],
)
def test_overrides_of_the_operators_own_are_refused_naming_the_field(template: dict[str, Any], field: str) -> None:
    job = make_job("j", "ns").launcher("mpi", "mpich").classification().set("spec.podTemplate", template).build()
    with pytest.raises(InvalidSpec) as e:
        validate(copy.deepcopy(job))
    assert field in [x.field for x in e.value.errors], e.value
