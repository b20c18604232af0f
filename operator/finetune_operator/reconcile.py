"""Observed state -> actions and status. Pure: no kopf, no HTTP. Level-triggered: the same inputs give the same
plan, and applying a plan twice is harmless (creates of existing objects are 409s that the API layer compares).

Pods carry the attempt (status.restartCount) they were made for; a group restart bumps restartCount, which turns
every existing pod stale: stale pods are deleted, and the new attempt's pods are created once their names are
free again.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from . import constants as c
from .builders import SshKeys, desired

TERMINAL = ("Succeeded", "Failed")
_WAITING_ERRORS = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
)


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, message)
    delete_job: bool = False
    requeue_after: float | None = None  # seconds until a time-based transition (deadline, TTL)


@dataclass(frozen=True)
class Observed:
    pods: list[dict[str, Any]]  # pods labelled with the job's name
    objects: frozenset[str]  # "Kind/name" of the job's Service, ConfigMap, Secret that exist
    now: datetime
    progress: dict[str, Any] | None = None  # newest progress from rank 0's log, if read
    ssh_keys: SshKeys | None = None  # fresh keys, used only if the job's Secret must be created


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=None)


def set_condition(status: dict[str, Any], ctype: str, value: bool, reason: str, message: str, now: datetime) -> None:
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    new = "True" if value else "False"
    for cond in conds:
        if cond["type"] == ctype:
            if cond["status"] != new:
                cond["lastTransitionTime"] = iso(now)
            cond.update(status=new, reason=reason, message=message)
            return
    if value:  # a condition appears the first time it becomes true
        conds.append(
            {"type": ctype, "status": new, "reason": reason, "message": message, "lastTransitionTime": iso(now)}
        )


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _attempt(pod: dict[str, Any]) -> int:
    try:
        return int(pod["metadata"]["labels"].get(c.LABEL_ATTEMPT, "-1"))
    except (KeyError, ValueError):
        return -1


def _deleting(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


DELETED_HINT = "the pod was deleted while the job ran (eviction, node drain or kubectl delete)"


def _failure(pod: dict[str, Any], attempt: int) -> dict[str, Any]:
    """Which container failed, how, and its last log lines (FallbackToLogsOnError termination message)."""
    st = pod.get("status") or {}
    labels = pod["metadata"].get("labels") or {}
    out: dict[str, Any] = {"attempt": attempt, "pod": pod["metadata"]["name"]}
    if labels.get(c.LABEL_RANK) is not None:
        out["rank"] = int(labels[c.LABEL_RANK])
    if _deleting(pod) and _phase(pod) != "Failed":
        out.update(reason="Deleted", logTail=DELETED_HINT)
        return out
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode", 0) != 0:
            out.update(
                container=cs.get("name"),
                exitCode=term.get("exitCode"),
                reason=term.get("reason") or "Error",
                logTail=(term.get("message") or "")[-2000:],
            )
            break
    else:
        out["reason"] = st.get("reason") or "Failed"  # e.g. Evicted, DeadlineExceeded (pod level)
        if st.get("message"):
            out["logTail"] = st["message"]
    return out


def _describe(f: dict[str, Any]) -> str:
    who = f"rank {f['rank']} (pod {f['pod']})" if "rank" in f else f"pod {f['pod']}"
    how = f"exit code {f['exitCode']}" if "exitCode" in f else ""
    reason = f.get("reason", "")
    if reason == "OOMKilled":
        how = f"OOMKilled ({how})" if how else "OOMKilled"
    elif reason and reason != "Error":
        how = f"{reason}, {how}" if how else reason
    tail = (f.get("logTail") or "").strip()
    last = "\n".join(tail.splitlines()[-10:])
    return f"{who} failed: {how or 'failed'}" + (f"; last log lines:\n{last}" if last else "")


def _pending_problem(pods: list[dict[str, Any]]) -> str | None:
    """Why pods are not starting (unschedulable, image pull, bad config), for status.message."""
    for pod in pods:
        st = pod.get("status") or {}
        name = pod["metadata"]["name"]
        for cond in st.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
                return f"{name}: {cond['reason']}: {cond.get('message', '')}".strip()
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _WAITING_ERRORS:
                return f"{name}/{cs.get('name')}: {waiting['reason']}: {waiting.get('message', '')}".strip()
    return None


def _init_running(pod: dict[str, Any], name: str) -> bool:
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if cs.get("name") == name and "running" in (cs.get("state") or {}):
            return True
    return False


def _transition(plan: Plan, old_phase: str | None, phase: str, reason: str, message: str) -> None:
    st = plan.status
    st["phase"], st["reason"], st["message"] = phase, reason, message
    if old_phase != phase:
        kind = "Warning" if phase in ("Failed", "Restarting") else "Normal"
        plan.events.append((kind, reason, message))


def reconcile(job: dict[str, Any], observed: Observed, config: Mapping[str, Any] | None = None) -> Plan:
    """`job` has passed admission.validate (defaults applied) and carries its current status. `config` is the
    operator's configuration (`images`, `networkPolicy`)."""
    now = observed.now
    spec = job["spec"]
    rp = spec.get("runPolicy") or {}
    old = job.get("status") or {}
    plan = Plan(status=copy.deepcopy(old))
    st = plan.status
    st["observedGeneration"] = job["metadata"].get("generation", 1)
    attempt = int(st.get("restartCount") or 0)
    st["restartCount"] = attempt
    old_phase = old.get("phase")
    if observed.progress:
        st["progress"] = observed.progress

    cfg = config or {}
    children = desired(job, images=cfg.get("images"), ssh_keys=observed.ssh_keys, attempt=attempt,
                       network_policy_config=cfg.get("networkPolicy"))
    st["worldSize"] = children.layout.world_size
    live = [p for p in observed.pods if not _deleting(p)]
    current = [p for p in live if _attempt(p) == attempt]
    stale = [p for p in live if _attempt(p) != attempt]
    rank_role = c.ROLE_WORKER if children.layout.launcher == "mpi" else c.ROLE_RANK

    def delete(pods: list[dict[str, Any]]) -> None:
        plan.delete_pods += [p["metadata"]["name"] for p in pods if p["metadata"]["name"] not in plan.delete_pods]

    # Terminal: nothing keeps running; finished pods stay for their logs unless cleanPodPolicy is All.
    if old_phase in TERMINAL:
        keep_finished = rp.get("cleanPodPolicy", "Running") == "Running"
        delete([p for p in live if not (keep_finished and _phase(p) in TERMINAL)])
        ttl = rp.get("ttlSecondsAfterFinished")
        done_at = parse_time(st.get("completionTime"))
        if ttl is not None and done_at is not None:
            due = done_at + timedelta(seconds=int(ttl))
            if now >= due:
                plan.delete_job = True
            else:
                plan.requeue_after = (due - now).total_seconds()
        return plan

    def finish(phase: str, reason: str, message: str) -> Plan:
        _transition(plan, old_phase, phase, reason, message)
        st["completionTime"] = iso(now)
        set_condition(st, "Running", False, reason, message, now)
        set_condition(st, "Restarting", False, reason, message, now)
        set_condition(st, phase, True, reason, message, now)
        keep_finished = rp.get("cleanPodPolicy", "Running") == "Running"
        delete([p for p in live if not (keep_finished and _phase(p) in TERMINAL)])
        ttl = rp.get("ttlSecondsAfterFinished")
        if ttl is not None:
            plan.requeue_after = float(ttl)
        return plan

    if rp.get("suspend"):
        delete(live)
        msg = "suspended: pods deleted; set spec.runPolicy.suspend: false to resume from the newest checkpoint"
        _transition(plan, old_phase, "Suspended", "Suspended", msg)
        set_condition(st, "Suspended", True, "Suspended", msg, now)
        set_condition(st, "Running", False, "Suspended", msg, now)
        st.pop("startTime", None)  # the deadline counts active time from the resume
        st["ranks"] = {"ready": 0, "total": children.layout.nodes}
        return plan
    if old_phase == "Suspended":
        set_condition(st, "Suspended", False, "Resumed", "resumed", now)

    start = parse_time(st.get("startTime"))
    deadline = rp.get("activeDeadlineSeconds")
    if deadline is not None and start is not None:
        due = start + timedelta(seconds=int(deadline))
        if now >= due:
            return finish(
                "Failed", "DeadlineExceeded", f"job ran longer than spec.runPolicy.activeDeadlineSeconds={deadline}"
            )
        plan.requeue_after = (due - now).total_seconds()

    # A failed pod of the current attempt fails the whole group. So does one of its unfinished pods being
    # deleted: the operator deletes current-attempt pods only as it ends, suspends or restarts the job, so this
    # is an eviction, a node drain or someone's kubectl delete, and the other ranks would otherwise hang in
    # collectives until a timeout.
    failed = [p for p in current if _phase(p) == "Failed"]
    failed += [p for p in observed.pods if _deleting(p) and _attempt(p) == attempt and _phase(p) not in TERMINAL]
    if failed:
        failed.sort(key=lambda p: int(p["metadata"]["labels"].get(c.LABEL_RANK, "-1")))
        f = _failure(failed[0], attempt)
        st["failures"] = ([*st.get("failures", []), f])[-10:]
        limit = int(rp.get("backoffLimit", 3))
        text = _describe(f)
        if attempt < limit:
            st["restartCount"] = attempt + 1
            delete(live)
            msg = (
                f"{text}\nrestarting all ranks (restart {attempt + 1} of at most {limit}), "
                "resuming from the newest checkpoint"
            )
            _transition(plan, old_phase, "Restarting", "RankFailed", msg)
            set_condition(st, "Restarting", True, "RankFailed", msg, now)
            set_condition(st, "Running", False, "RankFailed", msg, now)
            st["ranks"] = {"ready": 0, "total": children.layout.nodes}
            return plan
        reason = "OOMKilled" if f.get("reason") == "OOMKilled" else "BackoffLimitExceeded"
        return finish("Failed", reason, f"{text}\nbackoffLimit {limit} reached")

    # Success: every rank pod (torchrun) or the launcher (MPI) completed.
    if children.layout.launcher == "mpi":
        launcher = [p for p in current if p["metadata"]["name"] == children.names.launcher]
        succeeded = bool(launcher) and _phase(launcher[0]) == "Succeeded"
    else:
        ranks = [p for p in current if (p["metadata"].get("labels") or {}).get(c.LABEL_ROLE) == c.ROLE_RANK]
        succeeded = len(ranks) == children.layout.nodes and all(_phase(p) == "Succeeded" for p in ranks)
    if succeeded:
        if st.get("progress"):
            st["progress"] = dict(st["progress"], summary=st["progress"].get("summary") or "done")
        return finish("Succeeded", "Completed", "all ranks completed")

    # Converge: stale pods go; missing children are created (pods only once their names are free).
    delete(stale)
    stale_names = {p["metadata"]["name"] for p in observed.pods}
    for obj in children.objects:
        if f"{obj['kind']}/{obj['metadata']['name']}" not in observed.objects:
            plan.create.append(obj)
    current_names = {p["metadata"]["name"] for p in current}
    for pod in children.pods:
        name = pod["metadata"]["name"]
        if name not in current_names and name not in stale_names:
            plan.create.append(pod)
    if plan.create and any(o["kind"] == "Pod" for o in plan.create) and "startTime" not in st:
        st["startTime"] = iso(now)
    if any(o["kind"] == "Pod" for o in plan.create) and not current:
        set_condition(st, "Created", True, "PodsCreated", f"created {len(children.pods)} pods for attempt {attempt}",
                      now)

    ranks_up = [
        p for p in current
        if (p["metadata"].get("labels") or {}).get(c.LABEL_ROLE) == rank_role and _phase(p) in ("Running", "Succeeded")
    ]
    st["ranks"] = {"ready": len(ranks_up), "total": children.layout.nodes}
    all_running = len(current) == len(children.pods) and all(_phase(p) in ("Running", "Succeeded") for p in current)
    if any(_init_running(p, c.INIT_PRECOMPILE) for p in current):
        _transition(plan, old_phase, "Precompiling", "Precompiling", "filling the compile cache with a trial run")
        set_condition(st, "Precompiling", True, "Precompiling", "trial run filling the compile cache", now)
    elif all_running:
        msg = f"{children.layout.world_size} processes on {children.layout.nodes} pod(s)"
        _transition(plan, old_phase, "Running", "Running", msg)
        set_condition(st, "Precompiling", False, "Done", "compile cache filled", now)
        set_condition(st, "Restarting", False, "Running", msg, now)
        set_condition(st, "Running", True, "Running", msg, now)
    else:
        problem = _pending_problem(current)
        leftovers = bool(stale) or any(_deleting(p) for p in observed.pods)
        restarting = old_phase == "Restarting" and leftovers
        waiting = "waiting for the previous attempt's pods to terminate" if leftovers else "waiting for pods to start"
        phase = "Restarting" if restarting else "Pending"
        _transition(plan, old_phase, phase, "Unschedulable" if problem and "Unschedulable" in problem else phase,
                    problem or waiting)
    return plan
