"""Each phase of the pure reconcile on its own: it decides (returns the plan) or passes on (None).

Whole lifecycles through every phase are in test_reconcile.py."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from ftjobs import load_sample, make_job

from finetune_operator import constants as c
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
        "time": "2026-12-02T10:00:00Z",
    }
    assert plan.grace == {"j-rank-0": c.FAILED_GROUP_GRACE_S, "j-rank-1": c.FAILED_GROUP_GRACE_S}


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


# -- node loss, drains and hangs (disruptions.py) ---------------------------------------------------------------
def on(p: dict[str, Any], node: str) -> dict[str, Any]:
    p["spec"] = {"nodeName": node}
    return p


def not_ready(since: datetime, status: str = "Unknown") -> dict[str, Any]:
    return {
        "ready": status,
        "since": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "unschedulable": False,
    }


READY = {
    "ready": "True",
    "since": "2026-12-02T09:00:00Z",
    "reason": "KubeletReady",
    "message": "",
    "unschedulable": False,
}


def two_nodes(phase: str = "Running", attempt: int = 0) -> list[dict[str, Any]]:
    return [
        on(pod("j-rank-0", phase, attempt, rank=0), "node-a"),
        on(pod("j-rank-1", phase, attempt, rank=1), "node-b"),
    ]


def observe(pods: list[dict[str, Any]], nodes: dict[str, Any], now: datetime, progress: Any = None) -> Observed:
    objects = own("Service/j", "ConfigMap/j-config")
    return Observed(pods, objects, now, progress, lambda: KEYS, nodes=nodes)


def test_a_node_not_ready_is_waited_for_then_its_pods_are_force_deleted_and_the_group_restarts_as_node_lost() -> None:
    j = job({"phase": "Running"}, backoffLimit=2, nodeLossSeconds=60)
    nodes = {"node-a": READY, "node-b": not_ready(T0)}
    waiting = rec.reconcile(j, observe(two_nodes(), nodes, T0 + timedelta(seconds=10)))
    assert waiting.status["phase"] == "Running" and not waiting.delete_pods
    cond = next(x for x in waiting.status["conditions"] if x["type"] == "NodeLost")
    assert cond["status"] == "True" and "node node-b not Ready" in cond["message"] and "in 50 s" in cond["message"]
    assert waiting.requeue_after == 50 and ("Warning", "NodeNotReady") in [e[:2] for e in waiting.events]

    j["status"] = waiting.status
    plan = rec.reconcile(j, observe(two_nodes(), nodes, T0 + timedelta(seconds=61)))
    st = plan.status
    assert st["phase"] == "Restarting" and st["reason"] == "NodeLost" and st["restartCount"] == 1
    f = st["failures"][-1]
    assert (f["reason"], f["node"], f["pod"], f["rank"]) == ("NodeLost", "node-b", "j-rank-1", 1)
    assert "runPolicy.nodeLossSeconds=60" in f["logTail"] and "on node node-b" in st["message"]
    # The lost node's pod can never end gracefully: force-deleted; the survivor cannot save (its group lost a rank).
    assert plan.grace == {"j-rank-1": 0, "j-rank-0": c.FAILED_GROUP_GRACE_S}
    assert next(x for x in st["conditions"] if x["type"] == "NodeLost")["status"] == "False"


def test_node_loss_counts_against_the_backoff_limit() -> None:
    j = job({"phase": "Running"}, backoffLimit=0, nodeLossSeconds=60)
    plan = rec.reconcile(j, observe(two_nodes(), {"node-b": not_ready(T0)}, T0 + timedelta(seconds=60)))
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "BackoffLimitExceeded"
    assert plan.status["failures"][-1]["reason"] == "NodeLost"
    assert plan.grace["j-rank-1"] == 0  # a finished job's pod on a lost node goes at once too


def test_a_rank_failing_while_its_peers_node_is_not_ready_is_blamed_on_the_node() -> None:
    """Rank 0 fails in a collective as soon as rank 1's node dies; the node is the cause, named at once."""
    pods = two_nodes()
    pods[0]["status"] = {"phase": "Failed", **terminated(1, "Error", "Connection closed by peer")}
    j = job({"phase": "Running"}, nodeLossSeconds=60)
    plan = rec.group_failure(begin(j, observe(pods, {"node-b": not_ready(T0)}, T0 + timedelta(seconds=5))))
    assert plan is not None and plan.status["reason"] == "NodeLost"
    assert plan.status["failures"][-1]["node"] == "node-b"


def test_a_ready_node_a_node_the_index_lacks_and_finished_pods_are_never_judged() -> None:
    j = job({"phase": "Running"}, nodeLossSeconds=0)
    assert rec.group_failure(begin(j, observe(two_nodes(), {"node-a": READY}, T0))) is None
    done = two_nodes("Succeeded")
    assert rec.group_failure(begin(j, observe(done, {"node-b": not_ready(T0)}, T0 + timedelta(seconds=9)))) is None


def test_pods_stuck_terminating_on_a_lost_node_are_force_deleted() -> None:
    """An earlier attempt's pod deleted gracefully while its node was lost never goes: forced once lost."""
    j = job({"phase": "Restarting", "restartCount": 1}, nodeLossSeconds=30)
    stale = on(pod("j-rank-1", "Running", 0, rank=1, deleting=True), "node-b")
    stale["metadata"]["uid"] = "u-old"
    before = rec.reconcile(j, observe([stale], {"node-b": not_ready(T0)}, T0 + timedelta(seconds=10)))
    assert "j-rank-1" not in before.delete_pods  # not lost yet: it may still end by itself
    # ...and the loop looks again when it will be (found on the real nodes: the old attempt's pod was forced only
    # at the next unrelated pass, ~30 s late, and until then the new attempt could not reuse its name).
    assert before.requeue_after is not None and before.requeue_after <= 20
    after = rec.reconcile(j, observe([stale], {"node-b": not_ready(T0)}, T0 + timedelta(seconds=31)))
    assert after.delete_pods == ["j-rank-1"] and after.grace == {"j-rank-1": 0}
    assert after.pod_uids == {"j-rank-1": "u-old"}


def test_a_lost_node_behind_an_earlier_restart_is_recorded_once_without_another_restart() -> None:
    """Found on the real nodes: node B dies, rank 0 on node A fails at once in a collective (connection reset) and
    the group restarts as RankFailed before node B is even seen not Ready. Once node B is lost, its pod of that
    attempt is force-deleted and status.failures says NodeLost naming the node (the real cause), once, with no
    restart of the new attempt."""
    first = {"attempt": 0, "pod": "j-rank-0", "rank": 0, "exitCode": 1, "reason": "Error", "node": "node-a"}
    j = job({"phase": "Restarting", "restartCount": 1, "failures": [first]}, nodeLossSeconds=30)
    stale = on(pod("j-rank-1", "Running", 0, rank=1, deleting=True), "node-b")
    stale["metadata"]["uid"] = "u-old"
    waiting = rec.reconcile(j, observe([stale], {"node-b": not_ready(T0)}, T0 + timedelta(seconds=10)))
    assert waiting.status["failures"] == [first]
    plan = rec.reconcile(j, observe([stale], {"node-b": not_ready(T0)}, T0 + timedelta(seconds=31)))
    st = plan.status
    assert st["restartCount"] == 1 and plan.grace == {"j-rank-1": 0}
    lost = st["failures"][-1]
    assert (lost["reason"], lost["node"], lost["pod"], lost["attempt"]) == ("NodeLost", "node-b", "j-rank-1", 0)
    assert ("Warning", "NodeLost") in [e[:2] for e in plan.events]
    j["status"] = st
    again = rec.reconcile(j, observe([stale], {"node-b": not_ready(T0)}, T0 + timedelta(seconds=33)))
    assert again.status["failures"] == st["failures"]  # recorded once


def evicted(p: dict[str, Any], **status: Any) -> dict[str, Any]:
    """A pod the eviction API took: its DisruptionTarget condition, then its deletion."""
    p["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    target = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "evicting"}
    p["status"] = {**p["status"], **status, "conditions": [target]}
    return p


def test_a_drained_rank_restarts_the_group_with_its_grace_period_and_without_counting_it() -> None:
    pods = two_nodes()
    evicted(pods[1])
    j = job({"phase": "Running", "progress": {"step": 37}}, backoffLimit=0, drainRestartLimit=2)
    plan = rec.group_failure(begin(j, observe(pods, {}, T0)))
    assert plan is not None
    st = plan.status
    assert st["phase"] == "Restarting" and st["reason"] == "Drained"
    assert st["restartCount"] == 1 and st["drainRestarts"] == 1  # backoffLimit 0, and still restarted
    f = st["failures"][-1]
    assert (f["reason"], f["node"], f["step"]) == ("Drained", "node-b", 37)
    assert "drain restart 1 of at most 2" in st["message"]
    assert plan.delete_pods == ["j-rank-0"] and plan.grace == {}  # the survivor saves with the whole group


def test_a_drained_ranks_save_and_exit_is_still_a_drain_and_the_drain_limit_ends_the_job() -> None:
    """After the save every rank exits 143: the evicted one is the cause, whatever the others' exits say."""
    pods = two_nodes("Failed", attempt=2)
    pods[0]["status"].update(terminated(143, "Error"))
    evicted(pods[1], **terminated(143, "Error"))
    j = job({"phase": "Running", "restartCount": 2, "drainRestarts": 2}, backoffLimit=5, drainRestartLimit=2)
    plan = rec.group_failure(begin(j, observe(pods, {}, T0)))
    assert plan is not None and plan.status["phase"] == "Failed"
    assert plan.status["reason"] == "DrainRestartLimitExceeded" and plan.status["failures"][-1]["reason"] == "Drained"


def test_drains_leave_the_backoff_limit_to_failures() -> None:
    """restartCount counts every attempt; backoffLimit only the restarts that were not drains."""
    pods = two_nodes(attempt=3)
    pods[1]["status"] = {"phase": "Failed", **terminated(1, "Error")}
    j = job({"phase": "Running", "restartCount": 3, "drainRestarts": 3}, backoffLimit=1)
    plan = rec.group_failure(begin(j, observe(pods, {}, T0)))
    assert plan is not None and plan.status["phase"] == "Restarting" and plan.status["restartCount"] == 4
    assert "restart 1 of at most 1" in plan.status["message"]


def test_silence_past_the_progress_deadline_restarts_the_group_as_hung_naming_the_last_step() -> None:
    st = {"phase": "Running", "progress": {"step": 12, "totalSteps": 90}, "lastProgressTime": "2026-12-02T10:00:00Z"}
    j = job(st, backoffLimit=1, progressDeadlineSeconds=60)
    early = begin(j, observe(two_nodes(), {}, T0 + timedelta(seconds=45)))
    assert rec.group_failure(early) is None and early.plan.requeue_after == 15
    plan = rec.group_failure(begin(j, observe(two_nodes(), {}, T0 + timedelta(seconds=60))))
    assert plan is not None and plan.status["reason"] == "Hung" and plan.status["restartCount"] == 1
    f = plan.status["failures"][-1]
    assert (f["reason"], f["pod"], f["rank"], f["step"]) == ("Hung", "j-rank-0", 0, 12)
    assert "progressDeadlineSeconds=60" in f["logTail"] and "step 12" in f["logTail"]
    assert "lastProgressTime" not in plan.status  # the next attempt's deadline starts at its own first line
    assert plan.grace == {"j-rank-0": c.FAILED_GROUP_GRACE_S, "j-rank-1": c.FAILED_GROUP_GRACE_S}


def test_a_hang_at_the_backoff_limit_fails_the_job_and_ends_its_pods_with_the_failed_group_grace() -> None:
    """The hung rank may ignore SIGTERM: its pods must not keep their nodes for their own grace period (sized for a
    checkpoint the group cannot make) once the job has Failed and Kueue has released its quota."""
    st = {"phase": "Running", "progress": {"step": 12}, "lastProgressTime": "2026-12-02T10:00:00Z"}
    j = job(st, backoffLimit=0, progressDeadlineSeconds=60, terminationGracePeriodSeconds=900)
    plan = rec.reconcile(j, observe(two_nodes(), {}, T0 + timedelta(seconds=60)))
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "BackoffLimitExceeded")
    assert plan.status["failures"][-1]["reason"] == "Hung"
    assert sorted(plan.delete_pods) == ["j-rank-0", "j-rank-1"]
    assert plan.grace == {"j-rank-0": c.FAILED_GROUP_GRACE_S, "j-rank-1": c.FAILED_GROUP_GRACE_S}


def test_a_deleted_rank_at_the_backoff_limit_leaves_the_rest_of_its_group_its_own_grace_to_save() -> None:
    """A deletion's SIGTERM makes the whole group save its step, whether it restarts or, here, ends Failed."""
    pods = [
        on(pod("j-rank-0", "Running", rank=0), "node-a"),
        on(pod("j-rank-1", "Running", rank=1, deleting=True), "node-b"),
    ]
    plan = rec.reconcile(job({"phase": "Running"}, backoffLimit=0), observe(pods, {}, T0))
    assert (plan.status["phase"], plan.status["failures"][-1]["reason"]) == ("Failed", "Deleted")
    assert plan.delete_pods == ["j-rank-0"] and plan.grace == {}


def test_no_hang_before_the_attempts_first_progress_line_or_outside_running() -> None:
    """Data preparation and compilation print nothing; the precompile trial is not training."""
    first = job({"phase": "Running", "progress": {"step": 12}}, progressDeadlineSeconds=60)
    assert rec.group_failure(begin(first, observe(two_nodes(), {}, T0 + timedelta(days=1)))) is None
    st = {"phase": "Precompiling", "lastProgressTime": "2026-12-02T10:00:00Z"}
    compiling = job(st, progressDeadlineSeconds=60)
    assert rec.group_failure(begin(compiling, observe(two_nodes(), {}, T0 + timedelta(hours=3)))) is None
    unset = job({"phase": "Running", "lastProgressTime": "2026-12-02T10:00:00Z"})
    assert rec.group_failure(begin(unset, observe(two_nodes(), {}, T0 + timedelta(days=9)))) is None


def test_new_progress_moves_the_progress_clock_and_a_precompile_line_does_not() -> None:
    j = job({"phase": "Running", "progress": {"event": "train", "step": 4}})
    same = begin(j, observe(two_nodes(), {}, T0, progress={"event": "train", "step": 4}))
    assert "lastProgressTime" not in same.status
    moved = begin(j, observe(two_nodes(), {}, T0, progress={"event": "train", "step": 6}))
    assert moved.status["lastProgressTime"] == "2026-12-02T10:00:00Z" and moved.status["progress"]["step"] == 6
    trial = begin(j, observe(two_nodes(), {}, T0, progress={"event": "precompile", "step": 2}))
    assert "lastProgressTime" not in trial.status


def test_slim_pods_keep_their_node_and_disruption_and_slim_nodes_their_ready_condition() -> None:
    from finetune_operator.disruptions import slim_node

    full = evicted(on(pod("j-rank-1", "Running", rank=1), "node-b"))
    full["status"]["conditions"].append({"type": "Initialized", "status": "True"})
    slim = rec.slim_child(full)
    assert slim["spec"] == {"nodeName": "node-b"}
    assert [x["type"] for x in slim["status"]["conditions"]] == ["DisruptionTarget"]
    node = {
        "metadata": {"name": "node-b"},
        "spec": {"unschedulable": True, "taints": [{"key": "node.kubernetes.io/unreachable"}]},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "Unknown"},
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "lastTransitionTime": "2026-12-02T10:00:00Z",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                },
            ],
            "images": [{"names": ["x"], "sizeBytes": 1}],
        },
    }
    assert slim_node(node) == {
        "ready": "Unknown",
        "since": "2026-12-02T10:00:00Z",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "unschedulable": True,
    }
