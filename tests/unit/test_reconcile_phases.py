"""Each phase of the pure reconcile on its own: it decides (returns the plan) or passes on (None).

Whole lifecycles through every phase are in test_reconcile.py."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from ftjobs import load_sample, make_job

from finetune_operator import reconcile as rec
from finetune_operator.admission import validate
from finetune_operator.builders import SshKeys
from finetune_operator.reconcile import Observed, Pass, begin

T0 = datetime(2026, 12, 2, 10, 0, 0)
KEYS = SshKeys("k", "p", "hk", "hp")
OWNER = {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "name": "j", "uid": "uid-1", "controller": True}


def own(*refs: str) -> dict[str, str | None]:
    """ "Kind/name" of objects the job (uid-1) controls, as the indexes hold them."""
    return dict.fromkeys(refs, "uid-1")


def job(status: dict[str, Any] | None = None, mpi: bool = False, **run_policy: Any) -> dict[str, Any]:
    raw = load_sample("cpu-distilbert-squad-mpi") if mpi else make_job("j", "ns").nodes(2).classification().build()
    j = validate(raw)
    j["metadata"].setdefault("uid", "uid-1")
    j["spec"].setdefault("runPolicy", {}).update(run_policy)
    j["status"] = status or {}
    return j


def pod(
    name: str,
    phase: str,
    attempt: int = 0,
    rank: int | None = None,
    role: str = "rank",
    deleting: bool = False,
    **status: Any,
) -> dict[str, Any]:
    labels = {"finetune.dev/attempt": str(attempt), "finetune.dev/role": role}
    if rank is not None:
        labels["finetune.dev/rank"] = str(rank)
    meta: dict[str, Any] = {"name": name, "labels": labels, "ownerReferences": [OWNER]}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, **status}}


def ranks(phase: str, attempt: int = 0, **status: Any) -> list[dict[str, Any]]:
    return [pod(f"j-rank-{i}", phase, attempt, rank=i, **status) for i in range(2)]


def start(
    j: dict[str, Any],
    pods: list[dict[str, Any]] | None = None,
    objects: dict[str, str | None] | None = None,
    now: datetime = T0,
    keys: Any = lambda: KEYS,
) -> Pass:
    return begin(j, Observed(pods or [], objects or {}, now, None, keys))


# -- allowlists ----------------------------------------------------------------------------------------------
def test_allowlists_match_namespace_rules_against_the_jobs_namespace() -> None:
    """A policy rule given for some namespaces only applies to jobs there: the phase passes the job's namespace."""
    config = {"policy": {"queueRequiredNamespaces": ["team-*"]}}
    outside = begin(job(), Observed([], {}, T0, None, lambda: KEYS), config)
    assert rec.allowlists(outside) is None
    inside = job()
    inside["metadata"]["namespace"] = "team-a"
    plan = rec.allowlists(begin(inside, Observed([], {}, T0, None, lambda: KEYS), config))
    assert plan is not None and plan.status["reason"] == "PolicyViolation", plan
    assert "spec.runPolicy.queueName" in plan.status["message"]


# -- terminal ------------------------------------------------------------------------------------------------
def test_terminal_passes_on_for_unfinished_jobs() -> None:
    assert rec.terminal(start(job({"phase": "Running"}), ranks("Running"))) is None


def test_terminal_keeps_finished_pods_and_stops_running_ones() -> None:
    pods = [pod("j-rank-0", "Succeeded", rank=0), pod("j-rank-1", "Running", rank=1)]
    plan = rec.terminal(start(job({"phase": "Failed"}), pods))
    assert plan is not None and plan.delete_pods == ["j-rank-1"] and plan.create == []


def test_terminal_ttl_waits_then_deletes_the_job() -> None:
    done = {"phase": "Succeeded", "completionTime": "2026-12-02T10:00:00Z"}
    plan = rec.terminal(start(job(done, ttlSecondsAfterFinished=60), now=T0 + timedelta(seconds=20)))
    assert plan is not None and not plan.delete_job and plan.requeue_after == 40
    plan = rec.terminal(start(job(done, ttlSecondsAfterFinished=60), now=T0 + timedelta(seconds=60)))
    assert plan is not None and plan.delete_job


@pytest.mark.parametrize("huge", [2**63 - 1, 10**400], ids=["int64-max", "beyond-float"])
def test_deadline_and_ttl_of_any_size_never_raise(huge: int) -> None:
    """A number the spec carries is never added to a datetime or made a float unchecked: 2**63-1 (what the API
    server stores at most) overflowed `datetime + timedelta` in every pass (issue 23)."""
    running = job({"phase": "Running", "startTime": "2026-12-02T09:00:00Z"}, activeDeadlineSeconds=huge)
    p = start(running, ranks("Running"))
    assert rec.deadline(p) is None and p.plan.requeue_after is not None and p.plan.requeue_after > 10**9
    done = {"phase": "Succeeded", "completionTime": "2026-12-02T10:00:00Z"}
    plan = rec.terminal(start(job(done, ttlSecondsAfterFinished=huge), now=T0 + timedelta(days=365)))
    assert plan is not None and not plan.delete_job and plan.requeue_after is not None and plan.requeue_after > 10**9
    # The pass that ends a job starts its TTL clock.
    plan = rec.reconcile(job({"phase": "Running"}, ttlSecondsAfterFinished=huge), Observed(ranks("Succeeded"), {}, T0))
    assert plan.status["phase"] == "Succeeded" and plan.requeue_after is not None and plan.requeue_after > 10**9


def test_finished_jobs_never_build_their_children(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_: Any, **__: Any) -> Any:
        raise AssertionError("desired() built for a finished job")

    monkeypatch.setattr(rec, "desired", fail)
    plan = rec.reconcile(job({"phase": "Succeeded"}), Observed(ranks("Succeeded"), {}, T0))
    assert plan.create == [] and plan.status["worldSize"] == 2


# -- suspended -----------------------------------------------------------------------------------------------
def test_suspended_deletes_every_pod_and_stops_the_deadline_clock() -> None:
    j = job({"phase": "Running", "startTime": "2026-12-02T09:00:00Z"}, suspend=True)
    plan = rec.suspended(start(j, ranks("Running")))
    assert plan is not None and sorted(plan.delete_pods) == ["j-rank-0", "j-rank-1"]
    assert plan.status["phase"] == "Suspended" and "startTime" not in plan.status
    assert plan.status["ranks"] == {"ready": 0, "total": 2}


def test_resume_clears_the_condition_and_passes_on() -> None:
    cond = {"type": "Suspended", "status": "True", "reason": "Suspended", "message": "", "lastTransitionTime": ""}
    p = start(job({"phase": "Suspended", "conditions": [cond]}, suspend=False))
    assert rec.suspended(p) is None
    assert p.status["conditions"][0]["status"] == "False" and p.status["conditions"][0]["reason"] == "Resumed"


# -- deadline ------------------------------------------------------------------------------------------------
def test_deadline_passes_on_before_the_job_started_or_without_a_limit() -> None:
    assert rec.deadline(start(job({"phase": "Pending"}, activeDeadlineSeconds=10))) is None
    assert rec.deadline(start(job({"phase": "Running", "startTime": "2026-12-02T09:00:00Z"}))) is None


def test_deadline_sets_a_timer_then_fails_the_job() -> None:
    j = job({"phase": "Running", "startTime": "2026-12-02T10:00:00Z"}, activeDeadlineSeconds=100)
    p = start(j, ranks("Running"), now=T0 + timedelta(seconds=30))
    assert rec.deadline(p) is None and p.plan.requeue_after == 70
    plan = rec.deadline(start(j, ranks("Running"), now=T0 + timedelta(seconds=100)))
    assert plan is not None and plan.status["phase"] == "Failed" and plan.status["reason"] == "DeadlineExceeded"
    assert sorted(plan.delete_pods) == ["j-rank-0", "j-rank-1"]


# -- group failure -------------------------------------------------------------------------------------------
def terminated(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": code, "reason": reason, "message": message}}}
        ]
    }


def test_group_failure_passes_on_when_nothing_failed() -> None:
    assert rec.group_failure(start(job({"phase": "Running"}), ranks("Running"))) is None


def test_old_attempts_failures_are_not_this_attempts() -> None:
    pods = [*ranks("Failed", attempt=0), *ranks("Running", attempt=1)]
    assert rec.group_failure(start(job({"phase": "Running", "restartCount": 1}), pods)) is None


def test_group_failure_restarts_every_rank_while_restarts_remain() -> None:
    pods = [pod("j-rank-0", "Running", rank=0), pod("j-rank-1", "Failed", rank=1, **terminated(3, "Error"))]
    plan = rec.group_failure(start(job({"phase": "Running"}, backoffLimit=1), pods))
    assert plan is not None and plan.status["phase"] == "Restarting" and plan.status["restartCount"] == 1
    assert sorted(plan.delete_pods) == ["j-rank-0", "j-rank-1"]
    assert plan.status["failures"][-1] | {"logTail": ""} == {
        "attempt": 0,
        "pod": "j-rank-1",
        "rank": 1,
        "container": "trainer",
        "exitCode": 3,
        "reason": "Error",
        "logTail": "",
    }


def test_oom_reason_comes_from_the_container_state_not_its_message() -> None:
    j = job({"phase": "Running"}, backoffLimit=0)
    oom = [pod("j-rank-0", "Failed", rank=0, **terminated(137, "OOMKilled", "loading shard 3"))]
    plan = rec.group_failure(start(j, oom))
    assert plan is not None and plan.status["reason"] == "OOMKilled"
    # A log line that merely mentions OOMKilled is not an OOM kill.
    said = [pod("j-rank-0", "Failed", rank=0, **terminated(1, "Error", "retrying after OOMKilled worker"))]
    plan = rec.group_failure(start(j, said))
    assert plan is not None and plan.status["reason"] == "BackoffLimitExceeded"
    assert "exit code 1" in plan.status["message"]


# -- success -------------------------------------------------------------------------------------------------
def test_success_needs_every_rank_of_this_attempt() -> None:
    one = [pod("j-rank-0", "Succeeded", rank=0), pod("j-rank-1", "Running", rank=1)]
    assert rec.success(start(job({"phase": "Running"}), one)) is None
    plan = rec.success(start(job({"phase": "Running", "progress": {"step": 3}}), ranks("Succeeded")))
    assert plan is not None and plan.status["phase"] == "Succeeded"
    assert plan.status["progress"] == {"step": 3, "summary": "done"}


def test_mpi_success_is_the_launcher_completing() -> None:
    j = job({"phase": "Running"}, mpi=True)
    name = j["metadata"]["name"]
    workers = [pod(f"{name}-worker-{i}", "Running", rank=i, role="worker") for i in range(2)]
    assert rec.success(start(j, workers)) is None
    plan = rec.success(start(j, [*workers, pod(f"{name}-launcher", "Succeeded", role="launcher")]))
    assert plan is not None and sorted(plan.delete_pods) == [f"{name}-worker-0", f"{name}-worker-1"]


# -- converge ------------------------------------------------------------------------------------------------
def scheduled_false(reason: str, message: str) -> dict[str, Any]:
    return {"conditions": [{"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]}


def test_unschedulable_reason_comes_from_the_pod_condition() -> None:
    objects = own("Service/j", "ConfigMap/j-config")
    pods = ranks("Pending", **scheduled_false("Unschedulable", "0/3 nodes are available"))
    plan = rec.converge(start(job({"phase": "Pending"}), pods, objects))
    assert plan.status["reason"] == "Unschedulable"
    assert plan.status["message"] == "j-rank-0: Unschedulable: 0/3 nodes are available"
    # Another scheduling reason whose message happens to contain the word is not Unschedulable.
    pods = ranks("Pending", **scheduled_false("SchedulingGated", "gated until Unschedulable pods are handled"))
    plan = rec.converge(start(job({"phase": "Pending"}), pods, objects))
    assert plan.status["reason"] == "Pending" and "SchedulingGated" in plan.status["message"]


def test_mpi_keys_are_made_only_when_the_secret_must_be_created() -> None:
    made: list[SshKeys] = []

    def keys() -> SshKeys:
        made.append(KEYS)
        return KEYS

    j = job({}, mpi=True)
    name = j["metadata"]["name"]
    plan = rec.converge(start(j, keys=keys))
    assert len(made) == 1 and f"{name}-ssh" in {o["metadata"]["name"] for o in plan.create if o["kind"] == "Secret"}
    # Every later pass finds the Secret and makes no key pair.
    objects = own(f"Service/{name}", f"ConfigMap/{name}-config", f"Secret/{name}-ssh")
    for _ in range(3):
        plan = rec.reconcile(j, Observed([], objects, T0, None, keys))
        assert "Secret" not in {o["kind"] for o in plan.create}
    assert len(made) == 1


def test_torchrun_jobs_never_make_keys() -> None:
    def keys() -> SshKeys:
        raise AssertionError("keys made for a torchrun job")

    plan = rec.reconcile(job({}), Observed([], {}, T0, None, keys))
    assert plan.create


def test_phases_run_in_order() -> None:
    assert [f.__name__ for f in rec.PHASES] == [
        "terminal",
        "allowlists",
        "suspended",
        "queued",
        "deadline",
        "group_failure",
        "success",
    ]
