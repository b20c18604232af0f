"""A child is the job's only if its controller owner reference carries the job's uid: labels select, never prove.

Reconcile (pure) and the job loop, fed objects that carry the job's labels and names but another controller or
none: a previous job of the same name still being garbage collected, or objects made to be mounted into the job.
tests/controlplane/test_ownership.py runs the same cases through the real API server and operator."""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime, timedelta
from typing import Any

from ftjobs import load_sample, make_job
from test_controller import FakeApi, FakeClock

from finetune_operator import handlers
from finetune_operator.admission import validate
from finetune_operator.builders import SshKeys, desired
from finetune_operator.controller import JobLoop
from finetune_operator.k8s import ForeignObject
from finetune_operator.reconcile import Observed, Plan, reconcile

T0 = datetime(2026, 12, 2, 10, 0, 0)
KEYS = SshKeys("k", "p", "hk", "hp")
OLD, NEW = "uid-old", "uid-new"


def job(uid: str, mpi: bool = False) -> dict[str, Any]:
    raw = load_sample("cpu-distilbert-squad-mpi") if mpi else make_job("j", "ns").nodes(2).classification().build()
    j = validate(raw)
    j["metadata"]["uid"] = uid
    j["status"] = {}
    return j


def children_of(j: dict[str, Any], phase: str) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """Everything job `j` had made, its pods in `phase`: what the indexes hold while it is garbage collected."""
    made = desired(j, ssh_keys=KEYS)
    pods = [copy.deepcopy(p) | {"status": {"phase": phase}} for p in made.pods]
    objects = {f"{o['kind']}/{o['metadata']['name']}": j["metadata"]["uid"] for o in made.objects}
    return pods, objects


def step(j: dict[str, Any], pods: list[dict[str, Any]], objects: dict[str, str | None], seconds: int = 1) -> Plan:
    plan = reconcile(j, Observed(pods, objects, T0 + timedelta(seconds=seconds), None, lambda: KEYS))
    j["status"] = plan.status
    return plan


def names(plan: Plan) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in plan.create]


def condition(j: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in j["status"].get("conditions", []) if c["type"] == ctype)


def test_a_job_recreated_under_the_same_name_ignores_the_old_ones_children() -> None:
    old_pods, old_objects = children_of(job(OLD), "Succeeded")
    new = job(NEW)
    plan = step(new, old_pods, old_objects)
    # Not finished by the old job's Succeeded pods, and none of the old children's names is used or deleted.
    assert new["status"]["phase"] == "Pending" and new["status"]["reason"] == "ForeignChildren"
    assert "completionTime" not in new["status"]
    assert plan.create == [] and plan.delete_pods == []
    assert {f["name"] for f in new["status"]["foreignChildren"]} == {"j", "j-config", "j-rank-0", "j-rank-1"}
    assert {f.get("controllerUid") for f in new["status"]["foreignChildren"]} == {OLD}
    cond = condition(new, "ForeignChildren")
    assert cond["status"] == "True" and "Pod/j-rank-0 (controlled by uid uid-old)" in cond["message"]
    assert "delete them" in new["status"]["message"]
    # The garbage collector removes the old children: the new job makes its own, with its own config.json.
    plan = step(new, [], {}, seconds=2)
    assert sorted(names(plan)) == ["ConfigMap/j-config", "Pod/j-rank-0", "Pod/j-rank-1", "Service/j"]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == NEW for o in plan.create)
    assert "foreignChildren" not in new["status"] and condition(new, "ForeignChildren")["status"] == "False"


def test_a_job_recreated_while_only_the_old_config_map_is_left_does_not_reuse_it() -> None:
    _, old_objects = children_of(job(OLD), "Succeeded")
    new = job(NEW)
    plan = step(new, [], {"ConfigMap/j-config": old_objects["ConfigMap/j-config"]})
    assert names(plan) == ["Service/j"]  # its own Service; no pod mounts the old config.json
    assert new["status"]["foreignChildren"] == [{"kind": "ConfigMap", "name": "j-config", "controllerUid": OLD}]


def test_a_planted_config_map_without_owner_is_never_mounted() -> None:
    new = job(NEW)
    for seconds in (1, 2, 3):  # level-triggered: every pass decides the same
        plan = step(new, [], {"ConfigMap/j-config": None, "Service/j": NEW}, seconds)
        assert plan.create == []
    assert new["status"]["foreignChildren"] == [{"kind": "ConfigMap", "name": "j-config"}]
    assert "ConfigMap/j-config (no controller)" in condition(new, "ForeignChildren")["message"]


def test_a_planted_ssh_secret_is_never_mounted_and_no_keys_are_made_for_it() -> None:
    j = job(NEW, mpi=True)
    name = j["metadata"]["name"]
    own = {f"Service/{name}": NEW, f"ConfigMap/{name}-config": NEW}

    def no_keys() -> SshKeys:
        raise AssertionError("a key pair was made while a foreign Secret holds the name")

    plan = reconcile(j, Observed([], {**own, f"Secret/{name}-ssh": None}, T0, None, no_keys))
    assert plan.create == [] and plan.status["reason"] == "ForeignChildren"


def test_foreign_pods_with_the_jobs_labels_never_count() -> None:
    j = job(NEW)
    pods, objects = children_of(j, "Running")
    step(j, pods, objects)
    assert j["status"]["phase"] == "Running"
    # A Failed pod with the job's labels and attempt, but another controller: no group restart, not deleted.
    intruder = copy.deepcopy(pods[0])
    intruder["metadata"].update(name="j-rank-9", ownerReferences=[])
    intruder["status"] = {"phase": "Failed"}
    plan = step(j, [*pods, intruder], objects, seconds=2)
    assert j["status"]["phase"] == "Running" and j["status"]["restartCount"] == 0
    assert plan.delete_pods == [] and plan.create == []
    assert j["status"]["foreignChildren"] == [{"kind": "Pod", "name": "j-rank-9"}]


def test_the_child_index_records_the_controller_uid() -> None:
    index = handlers._child_indexer("ConfigMap")
    labels = {"finetune.dev/job-name": "j"}
    body: Any = {
        "metadata": {
            "name": "j-config",
            "ownerReferences": [{"uid": "other", "controller": False}, {"uid": NEW, "controller": True}],
        }
    }
    assert asyncio.run(index(body=body, name="j-config", labels=labels, namespace="ns")) == {
        ("ns", "j"): ("ConfigMap/j-config", NEW, None)
    }
    assert asyncio.run(
        index(body={"metadata": {"name": "j-config"}}, name="j-config", labels=labels, namespace="ns")
    ) == {("ns", "j"): ("ConfigMap/j-config", None, None)}
    # Secrets are not watched at all: the operator holds no list/watch on them (see the RBAC audit test).
    assert "secrets" not in handlers._CHILD_INDEXES


OWNED_BY_J = {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "name": "j", "uid": NEW, "controller": True}


def test_a_child_is_indexed_under_its_owner_whatever_its_job_name_label_says() -> None:
    """Someone relabels job j's children as job x's: j still finds them (and learns their uid and labels, to put
    them back); x's loop sees them too, as foreign."""
    labels = {"finetune.dev/job-name": "x", "app.kubernetes.io/managed-by": "finetune-operator"}
    cm: Any = {"metadata": {"name": "j-config", "uid": "cm-uid", "ownerReferences": [OWNED_BY_J]}}
    index = handlers._child_indexer("ConfigMap")
    assert asyncio.run(index(body=cm, name="j-config", labels=labels, namespace="ns")) == {
        ("ns", "j"): ("ConfigMap/j-config", NEW, ("cm-uid", labels)),
        ("ns", "x"): ("ConfigMap/j-config", NEW, None),
    }
    pod: Any = {"metadata": {"name": "j-rank-0", "uid": "pod-uid", "labels": labels, "ownerReferences": [OWNED_BY_J]}}
    entries = asyncio.run(handlers.job_pods(body=pod, labels=labels, namespace="ns"))
    assert set(entries) == {("ns", "j"), ("ns", "x")}
    assert entries["ns", "j"]["metadata"]["uid"] == "pod-uid"
    # An owner that is not a FineTuneJob keys nothing: the label alone does.
    other = {**OWNED_BY_J, "apiVersion": "batch/v1", "kind": "Job"}
    assert handlers._job_keys({"metadata": {"ownerReferences": [other]}}, labels, "ns") == [("ns", "x")]


def test_reconcile_puts_back_the_labels_of_its_own_children_and_no_one_elses() -> None:
    j = job(NEW)
    pods, objects = children_of(j, "Running")
    for p in pods:
        p["metadata"]["uid"] = f"uid-{p['metadata']['name']}"
    pods[1]["metadata"]["labels"]["finetune.dev/job-name"] = "x"  # found by its owner (handlers._job_keys)
    foreign = copy.deepcopy(pods[0])
    foreign["metadata"].update(name="x-rank-0", uid="uid-x", ownerReferences=[{"uid": "uid-x-job", "controller": True}])
    foreign["metadata"]["labels"]["finetune.dev/job-name"] = "x"
    edited = {"finetune.dev/job-name": "x", "app.kubernetes.io/managed-by": "finetune-operator"}
    wrong = {"ConfigMap/j-config": ("cm-uid", edited), "Service/other": ("svc-uid", edited)}
    plan = reconcile(j, Observed([*pods, foreign], objects, T0, None, lambda: KEYS, mislabelled=wrong))
    want = {"app.kubernetes.io/managed-by": "finetune-operator", "finetune.dev/job-name": "j"}
    assert [(r.kind, r.name, r.uid, dict(r.want)) for r in plan.relabel] == [
        ("Pod", "j-rank-1", "uid-j-rank-1", want),
        ("ConfigMap", "j-config", "cm-uid", want),  # Service/other is not the job's: left alone
    ]
    assert plan.create == [] and plan.delete_pods == []  # found, so nothing is made again


class MpiApi(FakeApi):
    """Creates succeed, except the SSH Secret's when `planted`: the API's 409 read back as foreign."""

    def __init__(self, raw: dict[str, Any], planted: bool) -> None:
        super().__init__(raw)
        self.planted = planted

    def create(self, obj: dict[str, Any]) -> bool:
        if self.planted and obj["kind"] == "Secret":
            raise ForeignObject(f"Secret ns/{obj['metadata']['name']} exists but is not controlled by this job")
        return super().create(obj)


def mpi_loop(planted: bool) -> tuple[JobLoop, MpiApi, list[str]]:
    raw = load_sample("cpu-distilbert-squad-mpi")
    raw["metadata"].update(namespace="ns", uid=NEW)
    api = MpiApi(raw, planted)
    made: list[str] = []
    loop = JobLoop("ns", raw["metadata"]["name"], api, {}, clock=FakeClock(), now=lambda: T0)

    def children() -> tuple[list[dict[str, Any]], dict[str, str | None]]:
        made.append("pass")
        return [], {
            f"{o['kind']}/{o['metadata']['name']}": NEW for o in api.created if o["kind"] in ("Service", "ConfigMap")
        }

    loop.step(children)
    return loop, api, made


def test_a_planted_ssh_secret_met_on_create_stops_the_pass_before_any_pod() -> None:
    loop, api, _ = mpi_loop(planted=True)
    assert [o["kind"] for o in api.created] == ["Service", "ConfigMap"]
    assert loop.pace.failures == 1 and loop.expected.made == {}
    assert "not controlled by this job" in api.job["status"]["message"]


def test_the_loop_makes_the_unwatched_ssh_secret_once() -> None:
    loop, api, _ = mpi_loop(planted=False)
    name = api.job["metadata"]["name"]
    assert loop.expected.made == {f"Secret/{name}-ssh": NEW}
    loop.wake()
    loop.step(lambda: ([], {f"Service/{name}": NEW, f"ConfigMap/{name}-config": NEW}))
    assert [o["kind"] for o in api.created].count("Secret") == 1


def test_a_deleted_child_or_squatter_wakes_the_jobs_loop() -> None:
    """Deleting a foreign object that blocks a child's name (or a child itself) lets the job go on at once."""
    from finetune_operator.controller import Loops

    loops = Loops()
    loop = JobLoop("ns", "j", FakeApi(job(NEW)), {}, clock=FakeClock(), now=lambda: T0)
    memo: Any = type("Memo", (), {"loops": loops})()
    labels = {"finetune.dev/job-name": "j"}
    with loops.running(loop):
        loop.take(lambda: ([], {}))  # the first pass clears the wake-up
        on_service = handlers._on_child("Service")
        body: Any = {"metadata": {"name": "j"}}
        asyncio.run(on_service(type="MODIFIED", body=body, name="j", labels=labels, namespace="ns", memo=memo))
        assert not loop.pace.woken
        asyncio.run(on_service(type="DELETED", body=body, name="j", labels=labels, namespace="ns", memo=memo))
        assert loop.pace.woken
        # Found by its owner when its job-name label says another job (the label edited away from it).
        loop.take(lambda: ([], {}))
        owned: Any = {"metadata": {"name": "j", "ownerReferences": [OWNED_BY_J]}}
        moved = {"finetune.dev/job-name": "x"}
        asyncio.run(on_service(type="DELETED", body=owned, name="j", labels=moved, namespace="ns", memo=memo))
        assert loop.pace.woken
