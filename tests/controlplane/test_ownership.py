"""Ownership and frozen spec blocks against a real API server and the real operator.

A child is the job's only when its controller owner reference carries the job's uid: objects that merely carry
its labels and names (left by a deleted job of the same name, or planted to be mounted into the job) are never
used. And the spec blocks the job's ConfigMap is written from cannot change after creation."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ftjobs import make_job
from kubernetes import client
from operator_support import API, Kubelet, install_crd, job_yaml, running_operator, status, two_rank_job

from finetune_operator import constants as c

LABELS = {c.LABEL_MANAGED_BY: c.MANAGED_BY}


@pytest.fixture(scope="module")
def crd(kubectl: Any, wait_for: Any) -> None:
    install_crd(kubectl, wait_for)


@pytest.fixture(scope="module")
def operator(crd: None, kubeconfig: Path, wait_for: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(kubeconfig, wait_for, log):
        yield log
    print(f"operator log: {log}")


@pytest.fixture
def kubelet(kube_api: client.ApiClient, namespace: str) -> Iterator[Kubelet]:
    k = Kubelet(kube_api, namespace)
    yield k
    k.stop()


def uid_of(kube_api: client.ApiClient, ns: str, name: str) -> str:
    job = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(*API, ns, "finetunejobs", name)
    return str(job["metadata"]["uid"])


def foreign_names(st: dict[str, Any]) -> set[str]:
    return {f"{f['kind']}/{f['name']}" for f in st.get("foreignChildren") or []}


def test_a_job_recreated_under_the_same_name_is_not_finished_by_the_old_pods(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(two_rank_job("again")))
    wait_for(lambda: len(kubelet.live_pods("again")) == 2, timeout=60, message="the first job's pods")
    for p in ("again-rank-0", "again-rank-1"):
        kubelet.set_status(p, "Succeeded", exit_code=0, reason="Completed")
    wait_for(
        lambda: status(kube_api, namespace, "again").get("phase") == "Succeeded",
        timeout=60,
        message="the first job Succeeded",
    )
    # Deleted with its children left behind (they keep the job's labels and names), then created again.
    kubectl("delete", "ftj", "again", "-n", namespace, "--cascade=orphan", "--wait=true")
    wait_for(
        lambda: all(not p.metadata.owner_references for p in kubelet.pods("again")),
        timeout=60,
        message="the garbage collector orphaning the old pods",
    )
    kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(two_rank_job("again")))
    st = wait_for(
        lambda: (s := status(kube_api, namespace, "again")).get("foreignChildren") and s,
        timeout=60,
        message="foreign children in status",
    )
    assert st["phase"] == "Pending" and st["reason"] == "ForeignChildren", st
    assert "completionTime" not in st
    assert {"Pod/again-rank-0", "Pod/again-rank-1", "ConfigMap/again-config"} <= foreign_names(st)
    cond = next(x for x in st["conditions"] if x["type"] == "ForeignChildren")
    assert cond["status"] == "True" and "Pod/again-rank-0 (no controller)" in cond["message"]
    # The old children go: the new job makes its own, owned by its uid, with its own config.json.
    core = client.CoreV1Api(kube_api)
    core.delete_collection_namespaced_pod(
        namespace, label_selector="finetune.dev/job-name=again", grace_period_seconds=0
    )
    core.delete_namespaced_config_map("again-config", namespace)
    core.delete_namespaced_service("again", namespace)
    uid = uid_of(kube_api, namespace, "again")

    def own_pods() -> list[Any] | None:
        pods = [p for p in kubelet.live_pods("again") if p.metadata.owner_references]
        return pods if len(pods) == 2 else None

    pods = wait_for(own_pods, timeout=60, message="the new job's pods")
    assert {p.metadata.owner_references[0].uid for p in pods} == {uid}
    cm = core.read_namespaced_config_map("again-config", namespace)
    assert cm.metadata.owner_references[0].uid == uid
    st = wait_for(
        lambda: (s := status(kube_api, namespace, "again")).get("reason") != "ForeignChildren" and s,
        timeout=60,
        message="ForeignChildren cleared",
    )
    assert "foreignChildren" not in st and st["phase"] == "Pending"


def test_a_planted_labelled_config_map_is_never_mounted(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "victim-config",
                "labels": {**LABELS, c.LABEL_JOB_NAME: "victim"},
                "annotations": {"attacker": "1"},
            },
            "data": {"config.json": "{}", "hostfile": "evil.example:8\n"},
        },
    )
    kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(two_rank_job("victim")))
    st = wait_for(
        lambda: (s := status(kube_api, namespace, "victim")).get("foreignChildren") and s,
        timeout=60,
        message="the planted ConfigMap in status",
    )
    assert foreign_names(st) == {"ConfigMap/victim-config"} and st["reason"] == "ForeignChildren"
    assert kubelet.pods("victim") == []  # the pass that saw it created no pod
    # Once it is gone the job makes its own ConfigMap and only then its pods.
    core.delete_namespaced_config_map("victim-config", namespace)
    wait_for(lambda: len(kubelet.live_pods("victim")) == 2, timeout=60, message="the job's pods")
    cm = core.read_namespaced_config_map("victim-config", namespace)
    assert not (cm.metadata.annotations or {}).get("attacker")
    assert json.loads(cm.data["config.json"])["jobName"] == "victim"


def test_a_planted_labelled_ssh_secret_is_never_mounted(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "mpivictim-ssh", "labels": {**LABELS, c.LABEL_JOB_NAME: "mpivictim"}},
            "stringData": {"authorized_keys": "ssh-ed25519 AAAA attacker\n"},
        },
    )
    kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(two_rank_job("mpivictim", mpi=True)))
    st = wait_for(
        lambda: "mpivictim-ssh" in (s := status(kube_api, namespace, "mpivictim")).get("message", "") and s,
        timeout=60,
        message="the planted Secret in status",
    )
    assert "not controlled by this FineTuneJob" in st["message"]
    assert kubelet.pods("mpivictim") == []
    core.delete_namespaced_secret("mpivictim-ssh", namespace)
    pods = wait_for(
        lambda: len(ps := kubelet.live_pods("mpivictim")) == 3 and ps,
        timeout=60,
        message="the job's launcher and workers",
    )
    secret = core.read_namespaced_secret("mpivictim-ssh", namespace)
    assert secret.metadata.owner_references[0].uid == uid_of(kube_api, namespace, "mpivictim")
    assert "attacker" not in str(secret.data)
    assert len(pods) == 3


def _set_training(s: dict[str, Any]) -> None:
    s["training"] = {"epochs": 1}


def _drop_training(s: dict[str, Any]) -> None:
    del s["training"]


def _move_output(s: dict[str, Any]) -> None:
    s["output"]["path"] = "elsewhere"


def _add_cache(s: dict[str, Any]) -> None:
    s["compileCache"] = {"claimName": "cache"}


def _other_command(s: dict[str, Any]) -> None:
    s["command"] = ["python", "other.py"]


FROZEN = [
    ("training", make_job("frozen").classification(), _set_training),  # added after creation
    ("training", make_job("frozen").classification().training(epochs=2), _drop_training),  # removed
    ("output", make_job("frozen").classification(), _move_output),
    ("compileCache", make_job("frozen").classification(), _add_cache),
    ("command", make_job("frozen").command("python", "train.py"), _other_command),
]


@pytest.mark.parametrize(
    ("block", "job", "change"),
    FROZEN,
    ids=["training-added", "training-removed", "output-changed", "cache-added", "command-changed"],
)
def test_spec_blocks_the_config_map_is_made_from_are_immutable(
    block: str, job: Any, change: Any, crd: None, kubectl: Any, namespace: str
) -> None:
    original = job.build()
    kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(original))
    changed = copy.deepcopy(original)
    change(changed["spec"])
    r = kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(changed), check=False)
    assert r.returncode != 0, f"spec.{block}: {change.__name__} accepted"
    assert f"spec.{block} is immutable" in r.stderr and "delete the job and create it again" in r.stderr, r.stderr


def labels_of(kube_api: Any, kind: str, ns: str, name: str) -> dict[str, str]:
    core = client.CoreV1Api(kube_api)
    read = {"pod": core.read_namespaced_pod, "service": core.read_namespaced_service}.get(
        kind, core.read_namespaced_config_map
    )
    return dict(read(name, ns).metadata.labels or {})


def test_children_whose_labels_are_edited_stay_the_jobs_and_get_them_back(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    """`kubectl label --overwrite` on the job's children: one relabelled as another job's is still found by its
    controller owner; one whose managed-by label is changed leaves the operator's label-selected watch, and the
    create that follows meets a 409, reads it back as the job's own and puts its labels back. Either way the
    job keeps seeing its pods (it used to stay Pending forever) and they keep their Service's DNS names."""
    ns = namespace
    kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(two_rank_job("tamper")))
    wait_for(lambda: len(kubelet.live_pods("tamper")) == 2, timeout=60, message="the job's pods")
    for p in ("tamper-rank-0", "tamper-rank-1"):
        kubelet.set_status(p, "Running")
    wait_for(lambda: status(kube_api, ns, "tamper").get("phase") == "Running", timeout=60, message="Running")
    uids = {p.metadata.name: p.metadata.uid for p in kubelet.live_pods("tamper")}

    def restored(kind: str, name: str) -> bool:
        labels = labels_of(kube_api, kind, ns, name)
        return labels.get(c.LABEL_JOB_NAME) == "tamper" and labels.get(c.LABEL_MANAGED_BY) == c.MANAGED_BY

    edits = [
        ("pod", "tamper-rank-1", f"{c.LABEL_JOB_NAME}=someone-else"),
        ("pod", "tamper-rank-0", f"{c.LABEL_MANAGED_BY}=someone-else"),
        ("service", "tamper", f"{c.LABEL_MANAGED_BY}=someone-else"),
        ("configmap", "tamper-config", f"{c.LABEL_JOB_NAME}=someone-else"),
    ]
    for kind, name, label in edits:
        kubectl("label", "-n", ns, kind, name, label, "--overwrite")
        wait_for(lambda k=kind, n=name: restored(k, n), timeout=60, message=f"{kind} {name}'s labels put back")
    # The same pods (never replaced), still the job's: they finish, and so does the job.
    assert {p.metadata.name: p.metadata.uid for p in kubelet.live_pods("tamper")} == uids
    for p in ("tamper-rank-0", "tamper-rank-1"):
        kubelet.set_status(p, "Succeeded", exit_code=0, reason="Completed")
    st = wait_for(
        lambda: (s := status(kube_api, ns, "tamper")).get("phase") == "Succeeded" and s,
        timeout=60,
        message="the job Succeeded",
    )
    assert st["restartCount"] == 0 and not st.get("foreignChildren"), st
