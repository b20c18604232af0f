"""Observed state -> actions and status. Pure: no kopf, no HTTP. Level-triggered: the same inputs give the same
plan, and applying a plan twice is harmless (creates of existing objects are 409s that the API layer compares).

Pods carry the attempt (status.restartCount) they were made for; a group restart bumps restartCount, which turns
every existing pod stale: stale pods are deleted, and the new attempt's pods are created once their names are
free again.

Only objects whose controller owner reference carries the job's uid are its children: labels select, they never
prove. Anything else that carries the job's labels (a previous job of the same name still being garbage
collected, or an object someone made to be mounted into the job) is foreign: never counted, mounted, deleted or
adopted, and reported in status.foreignChildren and the ForeignChildren condition. While a foreign object holds
the name of one of the job's children, the job creates no pods and waits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import cachereport, policy, throughput
from . import constants as c
from .builders import Layout, Names, Placement, SshKeys, desired, owner_reference, resolve
from .builders.env import output_location
from .conditions import FOREIGN_FIX, TERMINAL, iso, parse_time, set_condition
from .disruptions import DRAINED, HUNG, NODE_LOST, NodeDown, drained, hang_left, node_down, node_name, note_progress
from .kueue import finished_workload, pods_ready, queued

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
    # name -> uid of each pod in delete_pods that the indexes showed: the delete carries it as its precondition,
    # so it can never remove another pod that took the name since. A pod this loop created and no watch event
    # has shown yet has no uid here and is deleted by the pass its watch event wakes.
    pod_uids: dict[str, str] = field(default_factory=dict)
    # name -> gracePeriodSeconds for the pods in delete_pods that do not get their own terminationGracePeriodSeconds:
    # 0 (a force delete) on a lost node, whose kubelet can never confirm the pod's end;
    # constants.FAILED_GROUP_GRACE_S for the rest of a group that failed, which can save nothing (its collectives
    # lost a member).
    grace: dict[str, int] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, message)
    delete_job: bool = False
    requeue_after: float | None = None  # seconds until a time-based transition (deadline, TTL)
    # A merge patch of the Kueue Workload's status (with metadata.resourceVersion, so a concurrent write by
    # Kueue makes it a 409 instead of being overwritten): Finished when the job ends, the quota released
    # after an eviction, PodsReady while admitted.
    workload_status: dict[str, Any] | None = None
    # The uid of the job's own Workload to delete: spec.runPolicy.queueName was removed, and a Workload left
    # behind could be admitted later and hold quota for a job that no longer waits for it.
    delete_workload: str | None = None
    # Children the job controls whose identity labels (IDENTITY_LABELS) are not the job's: someone edited them.
    # Each is patched back (uid-checked) so the watches and the job's Service select it again.
    relabel: list[Relabel] = field(default_factory=list)


@dataclass(frozen=True)
class Relabel:
    """Restore a child's identity labels: `labels` (its current ones, from the index or a read-back) decide the
    patch; `uid` makes it apply to that very object only."""

    kind: str
    name: str
    uid: str
    labels: Mapping[str, str]
    want: Mapping[str, str]


@dataclass(frozen=True)
class Observed:
    # Pods labelled with the job's name, whoever controls them, and pods the job controls whatever their labels
    # say (the indexes key a child by its controller owner as well: handlers.py).
    pods: list[dict[str, Any]]
    # "Kind/name" of the objects labelled with the job's name or controlled by it (Service, ConfigMap,
    # NetworkPolicy, and the SSH Secret once the loop made it) -> the uid of their controller owner (None: no
    # controller).
    objects: Mapping[str, str | None]
    now: datetime
    progress: dict[str, Any] | None = None  # newest progress from rank 0's log, if read
    # Makes the job's SSH identity (MPI). Called only when the job's Secret must be created: the Secret is
    # immutable and made once, so no other pass pays for a key pair it would throw away.
    ssh_keys: Callable[[], SshKeys] | None = None
    # The Workload named like the job, when the Workload index holds one (`slim_workload`), queued or not: a
    # job whose queueName was removed deletes its own.
    workload: dict[str, Any] | None = None
    # While that Workload is admitted: the ResourceFlavors its admission names (`admitted_flavors()`), by name,
    # those that could be read. Their nodeLabels and tolerations go onto the pods (builders.flavors).
    flavors: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    # While a queued job's Workload is to be created: its spec.podTemplate.priorityClassName -> the PriorityClass's
    # value (`kueue.priority_class_to_read()`), when the class could be read. The Workload's priority.
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    # "Kind/name" -> (uid, labels) of the `objects` found under the job's key by their controller owner whose
    # job-name label names another job (or none): relabelled when they turn out to be the job's own.
    mislabelled: Mapping[str, tuple[str, Mapping[str, str]]] = field(default_factory=dict)
    # Node name -> disruptions.slim_node, for the nodes the job's pods are bound to (from the node index). A node
    # missing here is not judged.
    nodes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid in the object's controller owner reference (at most one exists), else None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def slim_child(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What reconcile reads of a child, and no more: the watch-fed pod index holds this instead of whole pod
    bodies (specs, managed fields, volumes), which were most of the operator's memory per job. Name, uid
    (deletes and label repairs carry it as their precondition), labels, controller owner, deletion mark, the node
    it is bound to; the pod's phase, reason, message, PodScheduled, Ready and DisruptionTarget conditions and each
    container's name and state (running / waiting / terminated with exit code, reason and message)."""
    meta = obj.get("metadata") or {}
    st = obj.get("status") or {}
    out: dict[str, Any] = {
        "kind": obj.get("kind", "Pod"),
        "metadata": {
            "name": meta.get("name"),
            **({"uid": meta["uid"]} if meta.get("uid") else {}),
            "labels": dict(meta.get("labels") or {}),
            "ownerReferences": [
                {"uid": r.get("uid"), "controller": True}
                for r in meta.get("ownerReferences") or []
                if r.get("controller")
            ],
        },
    }
    if meta.get("deletionTimestamp"):
        out["metadata"]["deletionTimestamp"] = meta["deletionTimestamp"]
    if (obj.get("spec") or {}).get("nodeName"):
        out["spec"] = {"nodeName": obj["spec"]["nodeName"]}
    status = {k: st[k] for k in ("phase", "reason", "message") if st.get(k)}
    scheduled = [
        {k: c[k] for k in ("type", "status", "reason", "message") if k in c}
        for c in st.get("conditions") or []
        if c.get("type") in ("PodScheduled", "Ready", "DisruptionTarget")
    ]
    if scheduled:
        status["conditions"] = scheduled
    for key in ("initContainerStatuses", "containerStatuses"):
        if st.get(key):
            status[key] = [{"name": cs.get("name"), "state": _slim_state(cs.get("state") or {})} for cs in st[key]]
    if status:
        out["status"] = status
    return out


def _slim_state(state: Mapping[str, Any]) -> dict[str, Any]:
    keep = {"running": (), "waiting": ("reason", "message"), "terminated": ("exitCode", "reason", "message")}
    return {k: {f: v[f] for f in keep[k] if f in v} for k, v in state.items() if k in keep and v is not None}


def slim_workload(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What reconcile reads of a Kueue Workload, as the Workload index holds it: its identity (name, uid,
    resourceVersion and generation for the status patches, labels, controller owner, deletion mark) and its
    whole status conditions and admission (a status patch replaces the conditions list, so it is built from
    every condition Kueue set), and the queue it waits in. Not its pod sets: those are the job's own, built again
    when needed."""
    out = slim_child(obj)
    meta = obj.get("metadata") or {}
    out["metadata"].update({k: meta[k] for k in ("resourceVersion", "generation") if k in meta})
    if (obj.get("spec") or {}).get("queueName"):
        out["spec"] = {"queueName": obj["spec"]["queueName"]}  # the queue it waits in (kueue.queued)
    st = obj.get("status") or {}
    out["status"] = {k: st[k] for k in ("conditions", "admission") if st.get(k) is not None}
    return out


def identity_labels(job_name: str) -> dict[str, str]:
    """The labels the operator's watches select its children by (managed-by) and its indexes and the job's
    Service key them by (job-name)."""
    return {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_JOB_NAME: job_name}


def mislabelled(obj: Mapping[str, Any], job_name: str) -> bool:
    """Whether one of the child's identity labels was edited away from the job's."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return any(labels.get(k) != v for k, v in identity_labels(job_name).items())


# Waits the spec asks for (activeDeadlineSeconds, ttlSecondsAfterFinished) are capped here before any arithmetic:
# a datetime plus the spec's number overflows past year 9999, and float() of a large enough int raises too. A
# wait this long (over 30,000 years) is forever in practice; the loop looks again at least every minute anyway.
FOREVER_S = 10**12


def seconds_left(since: datetime, seconds: int | float, now: datetime) -> float:
    """Seconds from `now` until `seconds` after `since`; 0 once that time has come. Safe for any number."""
    elapsed = (now - since).total_seconds()
    if seconds <= elapsed:
        return 0.0
    return float(min(seconds, FOREVER_S)) - elapsed


@dataclass(frozen=True)
class Foreign:
    """An object labelled as the job's child but not controlled by it (status.foreignChildren)."""

    ref: str  # Kind/name
    owner: str | None  # its controller's uid

    def entry(self) -> dict[str, str]:
        kind, _, name = self.ref.partition("/")
        return {"kind": kind, "name": name, **({"controllerUid": self.owner} if self.owner else {})}

    def describe(self) -> str:
        return f"{self.ref} ({f'controlled by uid {self.owner}' if self.owner else 'no controller'})"


def owned(uid: str, observed: Observed) -> tuple[list[dict[str, Any]], frozenset[str], list[Foreign]]:
    """Splits what the indexes hold into the job's children (pods, "Kind/name" of the other objects) and the
    foreign objects that merely carry its labels, sorted by Kind/name."""
    pods, foreign = [], []
    for pod in observed.pods:
        owner = controller_uid(pod)
        if owner == uid:
            pods.append(pod)
        else:
            foreign.append(Foreign(f"Pod/{pod['metadata']['name']}", owner))
    objects = frozenset(ref for ref, owner in observed.objects.items() if owner == uid)
    foreign += [Foreign(ref, owner) for ref, owner in observed.objects.items() if owner != uid]
    return pods, objects, sorted(foreign, key=lambda f: f.ref)


def report_foreign(status: dict[str, Any], foreign: list[Foreign], now: datetime) -> None:
    """status.foreignChildren and the ForeignChildren condition, cleared once the foreign objects are gone."""
    if not foreign:
        status.pop("foreignChildren", None)
        set_condition(status, "ForeignChildren", False, "None", "no foreign objects carry this job's labels", now)
        return
    status["foreignChildren"] = [f.entry() for f in foreign[:32]]
    msg = (
        "objects labelled as this job's children are not controlled by it and are ignored (never counted, "
        f"mounted or deleted): {', '.join(f.describe() for f in foreign[:32])}"
    )
    set_condition(status, "ForeignChildren", True, "ForeignChildren", msg, now)


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _attempt(pod: dict[str, Any]) -> int:
    try:
        return int(pod["metadata"]["labels"].get(c.LABEL_ATTEMPT, "-1"))
    except (KeyError, ValueError):
        return -1


def _role(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(c.LABEL_ROLE)


def _deleting(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


DELETED_HINT = "the pod was deleted while the job ran (an eviction or kubectl delete)"
DRAINED_HINT = (
    "the pod was evicted through the eviction API (a node drain: kubectl drain, a Spot interruption handler, "
    "Karpenter); its ranks save a checkpoint of the current step before they exit"
)


def _failure(pod: dict[str, Any], attempt: int) -> dict[str, Any]:
    """Which container failed, how, and its last log lines (FallbackToLogsOnError termination message); a pod
    evicted by a drain is Drained however its container ended (the runtime exits non-zero after its save)."""
    st = pod.get("status") or {}
    labels = pod["metadata"].get("labels") or {}
    out: dict[str, Any] = {"attempt": attempt, "pod": pod["metadata"]["name"]}
    if labels.get(c.LABEL_RANK) is not None:
        out["rank"] = int(labels[c.LABEL_RANK])
    if (node := node_name(pod)) is not None:
        out["node"] = node
    if drained(pod):
        out.update(reason=DRAINED, logTail=DRAINED_HINT)
        return out
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
    if f.get("node") and f.get("reason") in (NODE_LOST, DRAINED):
        who += f" on node {f['node']}"
    how = f"exit code {f['exitCode']}" if "exitCode" in f else ""
    reason = f.get("reason", "")
    if reason == "OOMKilled":
        how = f"OOMKilled ({how})" if how else "OOMKilled"
    elif reason and reason != "Error":
        how = f"{reason}, {how}" if how else reason
    tail = (f.get("logTail") or "").strip()
    last = "\n".join(tail.splitlines()[-10:])
    return f"{who} failed: {how or 'failed'}" + (f"; last log lines:\n{last}" if last else "")


@dataclass(frozen=True)
class PendingProblem:
    """Why pods are not starting. `reason` is the API's own field (the PodScheduled condition's reason, e.g.
    Unschedulable, or the container's waiting reason, e.g. ImagePullBackOff), never parsed from text."""

    reason: str
    message: str  # for status.message: "pod[/container]: reason: API message"


def _pending_problem(pods: list[dict[str, Any]]) -> PendingProblem | None:
    """Why pods are not starting (unschedulable, image pull, bad config), for status.reason and message."""
    for pod in pods:
        st = pod.get("status") or {}
        name = pod["metadata"]["name"]
        for cond in st.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
                reason = str(cond["reason"])
                return PendingProblem(reason, f"{name}: {reason}: {cond.get('message', '')}".strip())
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _WAITING_ERRORS:
                reason = str(waiting["reason"])
                where = f"{name}/{cs.get('name')}"
                return PendingProblem(reason, f"{where}: {reason}: {waiting.get('message', '')}".strip())
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


@dataclass
class Pass:
    """What every phase of one reconcile pass reads, and the plan they fill in."""

    job: dict[str, Any]
    observed: Observed
    config: Mapping[str, Any]
    layout: Layout
    names: Names
    plan: Plan
    old_phase: str | None
    attempt: int
    pods: list[dict[str, Any]]  # the job's own pods (controlled by its uid), deleting ones included
    objects: frozenset[str]  # "Kind/name" of the job's own other children
    foreign: list[Foreign]  # objects with the job's labels that it does not control
    live: list[dict[str, Any]]  # own pods not being deleted
    current: list[dict[str, Any]]  # live pods of this attempt
    stale: list[dict[str, Any]]  # live pods of earlier attempts
    # Set by the queued phase for an admitted job: pod role -> what its Kueue flavors add to the pods, or why
    # they cannot be added (a flavor label against the job's node selector; converge fails the job on it).
    placements: dict[str, Placement] | None = None
    flavor_conflict: str | None = None

    @property
    def run_policy(self) -> dict[str, Any]:
        return dict(self.job["spec"].get("runPolicy") or {})

    @property
    def now(self) -> datetime:
        return self.observed.now

    @property
    def status(self) -> dict[str, Any]:
        return self.plan.status

    def delete(self, pods: list[dict[str, Any]], grace: int | None = None) -> None:
        """Delete these pods, with `grace` as their gracePeriodSeconds (None: their own)."""
        names = self.plan.delete_pods
        names += [p["metadata"]["name"] for p in pods if p["metadata"]["name"] not in names]
        self.plan.pod_uids.update(
            {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods if p["metadata"].get("uid")}
        )
        if grace is not None:
            for p in pods:
                name = p["metadata"]["name"]
                self.plan.grace[name] = min(grace, self.plan.grace.get(name, grace))

    def requeue(self, seconds: float) -> None:
        """Look again within `seconds` (the earliest of the phases' timers wins)."""
        current = self.plan.requeue_after
        self.plan.requeue_after = seconds if current is None else min(current, seconds)

    def nodes_down(self, finished: bool = False) -> list[tuple[dict[str, Any], NodeDown]]:
        """The job's own pods of any attempt (unfinished ones, or all with `finished`) whose node is not Ready,
        with how long until it counts as lost (runPolicy.nodeLossSeconds)."""
        limit = int(self.run_policy.get("nodeLossSeconds", 60))
        out = []
        for pod in self.pods:
            if _phase(pod) in TERMINAL and not finished:
                continue
            down = node_down(pod, self.observed.nodes, limit, self.now)
            if down is not None:
                out.append((pod, down))
        return out

    def transition(self, phase: str, reason: str, message: str) -> None:
        _transition(self.plan, self.old_phase, phase, reason, message)

    def owns(self, obj: Mapping[str, Any]) -> bool:
        """Whether the job controls `obj` (its controller owner reference carries the job's uid)."""
        return controller_uid(obj) == str(owner_reference(self.job)["uid"])

    def clean_up_finished(self, grace: int | None = None) -> None:
        """A finished job keeps nothing running; its finished pods stay for their logs unless cleanPodPolicy
        is All. `grace`: the running pods' gracePeriodSeconds (None: their own)."""
        keep_finished = self.run_policy.get("cleanPodPolicy", "Running") == "Running"
        self.delete([p for p in self.live if not (keep_finished and _phase(p) in TERMINAL)], grace)

    def finish(self, phase: str, reason: str, message: str, grace: int | None = None) -> Plan:
        """The pass that ends the job: Succeeded or Failed, with its conditions, clean-up (what still runs deleted
        with `grace`, None: the pods' own) and TTL timer."""
        st, now = self.status, self.now
        self.transition(phase, reason, message)
        st["completionTime"] = iso(now)
        set_condition(st, "Running", False, reason, message, now)
        set_condition(st, "Restarting", False, reason, message, now)
        set_condition(st, phase, True, reason, message, now)
        self.clean_up_finished(grace)
        self.finish_workload(phase, message)
        ttl = self.run_policy.get("ttlSecondsAfterFinished")
        if ttl is not None:
            self.plan.requeue_after = seconds_left(now, ttl, now)
        return self.plan

    def finish_workload(self, phase: str, message: str) -> None:
        """Kueue releases a Workload's quota once it is Finished: set when the job ends (and again on later
        passes until it shows, should the first patch have met a concurrent write)."""
        patch = finished_workload(self.observed.workload, phase, message, self.now)
        if patch is not None:
            self.plan.workload_status = patch


# Each phase returns the pass's plan when it decides the outcome, or None to pass on to the next phase.
Phase = Callable[[Pass], Plan | None]


def terminal(p: Pass) -> Plan | None:
    """A finished job: clean up what still runs; delete the job once ttlSecondsAfterFinished has passed."""
    if p.old_phase not in TERMINAL:
        return None
    p.clean_up_finished()
    p.finish_workload(p.old_phase or "Failed", p.status.get("message") or "")
    ttl = p.run_policy.get("ttlSecondsAfterFinished")
    done_at = parse_time(p.status.get("completionTime"))
    if ttl is not None and done_at is not None:
        left = seconds_left(done_at, ttl, p.now)
        if left <= 0:
            p.plan.delete_job = True
        else:
            p.plan.requeue_after = left
    return p.plan


def allowlists(p: Pass) -> Plan | None:
    """The operator's allowlists (policy.py): a job naming an image, ServiceAccount or Secret outside them fails
    before any child is created; a tightened list also ends a running job at its next pass."""
    broken = policy.violations(p.job["spec"], p.config, p.names.namespace)
    if not broken:
        return None
    return p.finish("Failed", policy.REASON, "; ".join(broken))


def suspended(p: Pass) -> Plan | None:
    """spec.runPolicy.suspend: every pod goes; the deadline clock stops. A resume clears the condition."""
    st, now = p.status, p.now
    if not p.run_policy.get("suspend"):
        if p.old_phase == "Suspended":
            set_condition(st, "Suspended", False, "Resumed", "resumed", now)
        return None
    p.delete(p.live)
    msg = "suspended: pods deleted; set spec.runPolicy.suspend: false to resume from the newest checkpoint"
    st.pop("lastProgressTime", None)  # the resumed attempt's silence counts from its own first progress
    p.transition("Suspended", "Suspended", msg)
    set_condition(st, "Suspended", True, "Suspended", msg, now)
    set_condition(st, "Running", False, "Suspended", msg, now)
    st.pop("startTime", None)  # the deadline counts active time from the resume
    st["ranks"] = {"ready": 0, "total": p.layout.nodes}
    return p.plan


def deadline(p: Pass) -> Plan | None:
    """activeDeadlineSeconds, counted from startTime: fail the job once past it, else wake up when it falls."""
    limit = p.run_policy.get("activeDeadlineSeconds")
    start = parse_time(p.status.get("startTime"))
    if limit is None or start is None:
        return None
    left = seconds_left(start, limit, p.now)
    if left <= 0:
        msg = f"job ran longer than spec.runPolicy.activeDeadlineSeconds={limit}"
        return p.finish("Failed", "DeadlineExceeded", msg)
    p.requeue(left)
    return None


# The likeliest cause first among the failures one pass sees: a drain or a lost node explains the rest (the other
# ranks exit after the drain's save, or fail in collectives that lost a member), then an OOM kill (a rank's peers
# fail in collectives, mpirun exits 1 when its ssh to a killed worker drops), then a deletion (the rank's peers
# exit after the save its SIGTERM started); then a rank before the MPI launcher, then the lowest rank.
_CAUSES = (DRAINED, NODE_LOST, "OOMKilled", "Deleted")


def _cause_first(f: dict[str, Any]) -> tuple[int, bool, int]:
    reason = f.get("reason")
    order = _CAUSES.index(reason) if reason in _CAUSES else len(_CAUSES)
    return (order, "rank" not in f, int(f.get("rank", 0)))


# status.reason and the Event of a group restart, by the failure's reason (any other: RankFailed).
_RESTART_REASONS = {DRAINED: "Drained", NODE_LOST: "NodeLost", HUNG: "Hung"}


def _node_lost(pod: dict[str, Any], down: NodeDown, attempt: int, loss_seconds: int) -> dict[str, Any]:
    """A failure of a pod whose node is not Ready: its kubelet reports nothing more, so the node's state is all
    there is to say."""
    out: dict[str, Any] = {"attempt": attempt, "pod": pod["metadata"]["name"]}
    labels = pod["metadata"].get("labels") or {}
    if labels.get(c.LABEL_RANK) is not None:
        out["rank"] = int(labels[c.LABEL_RANK])
    how = f"lost: not Ready for runPolicy.nodeLossSeconds={loss_seconds}" if down.lost else "not Ready"
    out.update(reason=NODE_LOST, node=down.node, logTail=f"{down.describe()}; {how}")
    return out


def _hang(p: Pass) -> dict[str, Any] | None:
    """Rank 0's silence past runPolicy.progressDeadlineSeconds while the job is Running, as a failure of the pod
    that prints its progress; before the deadline, a timer for it."""
    if p.old_phase != "Running" or any(_phase(pod) == "Succeeded" for pod in p.current):
        return None
    deadline = p.run_policy.get("progressDeadlineSeconds")
    left = hang_left(p.status, deadline, p.now)
    if left is None:
        return None
    if left > 0:
        p.requeue(left)
        return None
    mpi = p.layout.launcher == "mpi"
    prog = p.status.get("progress") or {}
    step = prog.get("step")
    out: dict[str, Any] = {"attempt": p.attempt, "pod": p.names.launcher if mpi else p.names.rank_pod(0)}
    if not mpi:
        out["rank"] = 0
    last = f"step {step}" if step is not None else "its last progress line"
    out.update(
        reason=HUNG,
        logTail=(
            f"rank 0 reported no new progress for runPolicy.progressDeadlineSeconds={deadline} (last: {last}, "
            f"seen at {p.status.get('lastProgressTime')}) while every pod ran"
        ),
    )
    return out


def group_failure(p: Pass) -> Plan | None:
    """A failed pod of the current attempt fails the whole group: restart every rank while restarts remain
    (backoffLimit), else fail the job with the likeliest cause's (_cause_first) container, reason and log tail.

    So does one of its unfinished pods being deleted: the operator deletes current-attempt pods only as it ends,
    suspends or restarts the job, so this is an eviction, a node drain or someone's kubectl delete, and the
    other ranks would otherwise hang in collectives until a timeout. A drain (eviction API) restarts the group
    without counting against backoffLimit (runPolicy.drainRestartLimit bounds it).

    So does a pod's node staying not Ready for runPolicy.nodeLossSeconds (NodeLost; its pods there are
    force-deleted by `lost_nodes`), and rank 0 reporting no progress for runPolicy.progressDeadlineSeconds
    (Hung)."""
    st, now, attempt = p.status, p.now, p.attempt
    # Failed pods of this attempt, its unfinished pods being deleted, and its drained pods being deleted however
    # they ended (a drained rank exits non-zero after its save). A pod the operator itself deleted (suspend) and
    # that failed as it ended is not a failure.
    mine = [pod for pod in p.pods if _attempt(pod) == attempt]
    failed = [pod for pod in p.current if _phase(pod) == "Failed"]
    failed += [pod for pod in mine if _deleting(pod) and (_phase(pod) not in TERMINAL or drained(pod))]
    causes = [_failure(pod, attempt) for pod in failed]
    loss = int(p.run_policy.get("nodeLossSeconds", 60))
    down = [(pod, d) for pod, d in p.nodes_down() if _attempt(pod) == attempt]
    # A lost node fails its pods; while it is only not Ready, it is still the likeliest cause of what else failed.
    causes += [_node_lost(pod, d, attempt, loss) for pod, d in down if d.lost or causes]
    if not causes and (hung := _hang(p)) is not None:
        causes.append(hung)
    if not causes:
        return None
    f = min(causes, key=_cause_first)
    if isinstance((st.get("progress") or {}).get("step"), int):
        f["step"] = st["progress"]["step"]
    f["time"] = iso(now)
    st["failures"] = ([*st.get("failures", []), f])[-10:]
    text = _describe(f)
    drains = int(st.get("drainRestarts") or 0)
    if f["reason"] == DRAINED:
        limit = int(p.run_policy.get("drainRestartLimit", 10))
        if drains < limit:
            st["drainRestarts"] = drains + 1
            # The group keeps its own grace period: every rank saves the step the drain interrupted (the runtime
            # spreads one rank's SIGTERM to all at the next step end) and the new attempt resumes from it.
            msg = (
                f"{text}\nrestarting all ranks from the step the drain interrupted (drain restart {drains + 1} of "
                f"at most {limit}, not counted against backoffLimit)"
            )
            return _restart(p, f, msg, grace=None)
        return p.finish("Failed", "DrainRestartLimitExceeded", f"{text}\ndrainRestartLimit {limit} reached")
    limit = int(p.run_policy.get("backoffLimit", 3))
    counted = attempt - drains
    # A deleted rank's SIGTERM makes the whole group save its step (as a drain's does): it keeps its own grace
    # period. Any other failure left the group unable to save, so what is left of it gets FAILED_GROUP_GRACE_S,
    # whether it restarts or the job ends: a hung rank that ignores SIGTERM would otherwise hold its node's devices
    # for the whole grace period after the job Failed, when Kueue has released the job's quota.
    grace = None if f["reason"] == "Deleted" else c.FAILED_GROUP_GRACE_S
    if counted < limit:
        msg = (
            f"{text}\nrestarting all ranks (restart {counted + 1} of at most {limit}), "
            "resuming from the newest checkpoint"
        )
        return _restart(p, f, msg, grace)
    # The container's own terminated.reason (set by the kubelet), not text from its message.
    reason = "OOMKilled" if f.get("reason") == "OOMKilled" else "BackoffLimitExceeded"
    return p.finish("Failed", reason, f"{text}\nbackoffLimit {limit} reached", grace)


def _restart(p: Pass, f: dict[str, Any], msg: str, grace: int | None) -> Plan:
    """A group restart: the next attempt (restartCount), every live pod deleted; its progress deadline starts
    again from the new attempt's first progress line."""
    st, now = p.status, p.now
    st["restartCount"] = p.attempt + 1
    st.pop("lastProgressTime", None)
    p.delete(p.live, grace)
    reason = _RESTART_REASONS.get(str(f.get("reason")), "RankFailed")
    p.transition("Restarting", reason, msg)
    set_condition(st, "Restarting", True, reason, msg, now)
    set_condition(st, "Running", False, reason, msg, now)
    st["ranks"] = {"ready": 0, "total": p.layout.nodes}
    return p.plan


def _note_lost(p: Pass, f: dict[str, Any]) -> None:
    """Record, once, that an earlier attempt's pod was lost with its node. That attempt's restart had another
    cause, seen first: a rank on a live node fails in a collective as soon as its peer's node dies, before the
    node controller's grace period has marked that node not Ready. No restart: the group has restarted already."""
    st = p.status
    key = (f["attempt"], f["pod"], NODE_LOST)
    if any((x.get("attempt"), x.get("pod"), x.get("reason")) == key for x in st.get("failures", [])):
        return
    f["time"] = iso(p.now)
    st["failures"] = [*st.get("failures", []), f][-10:]
    p.plan.events.append(("Warning", "NodeLost", _describe(f)))


def lost_nodes(p: Pass) -> None:
    """After the deciding phase: a pod on a lost node (not Ready for runPolicy.nodeLossSeconds) that is being
    deleted, or that this pass deletes, is force-deleted (grace 0): its kubelet will never confirm its end, and
    until the name is free the next attempt cannot create it. While a node of the current attempt's pods is not
    Ready but not yet lost, the NodeLost condition says so and the loop looks again when it will be; so it does for a
    pod being deleted on such a node (an earlier attempt's holds the name the next attempt needs)."""
    st = p.status
    deleting = set(p.plan.delete_pods)
    attempt = int(st.get("restartCount") or 0)
    loss = int(p.run_policy.get("nodeLossSeconds", 60))
    for pod, down in p.nodes_down(finished=True):
        going = _deleting(pod) or pod["metadata"]["name"] in deleting
        if down.lost and going:
            p.delete([pod], grace=0)
            if _attempt(pod) < attempt:
                _note_lost(p, _node_lost(pod, down, _attempt(pod), loss))
        elif going:  # e.g. an earlier attempt's: forced the moment its node is lost, not at some later pass
            p.requeue(max(down.left, 0.5))
    waiting = [(pod, d) for pod, d in p.nodes_down() if _attempt(pod) == attempt and not d.lost]
    if waiting and st.get("phase") not in TERMINAL:
        nodes = {d.node: d for _, d in waiting}
        at = min(d.left for d in nodes.values())
        pods = ", ".join(sorted(pod["metadata"]["name"] for pod, _ in waiting))
        msg = (
            f"{'; '.join(d.describe() for d in nodes.values())}; its pods {pods} are replaced in {at:.0f} s "
            f"(runPolicy.nodeLossSeconds) unless it is Ready again"
        )
        if not any(x.get("type") == "NodeLost" and x.get("status") == "True" for x in st.get("conditions", [])):
            p.plan.events.append(("Warning", "NodeNotReady", msg))
        set_condition(st, "NodeLost", True, "NodeNotReady", msg, p.now)
        p.requeue(max(at, 0.5))
    elif any(x.get("type") == "NodeLost" and x.get("status") == "True" for x in st.get("conditions", [])):
        set_condition(st, "NodeLost", False, "NodesReady", "every node of the job's pods is Ready", p.now)


def success(p: Pass) -> Plan | None:
    """Every rank pod (torchrun) or the launcher pod (MPI) of the current attempt completed."""
    if p.layout.launcher == "mpi":
        launcher = [pod for pod in p.current if pod["metadata"]["name"] == p.names.launcher]
        succeeded = bool(launcher) and _phase(launcher[0]) == "Succeeded"
    else:
        ranks = [pod for pod in p.current if _role(pod) == c.ROLE_RANK]
        succeeded = len(ranks) == p.layout.nodes and all(_phase(pod) == "Succeeded" for pod in ranks)
    if not succeeded:
        return None
    st = p.status
    if st.get("progress"):
        st["progress"] = dict(st["progress"], summary=st["progress"].get("summary") or "done")
    return p.finish("Succeeded", "Completed", "all ranks completed")


def converge(p: Pass) -> Plan:
    """Stale pods go; missing children are created (pods only once their names are free); the phase follows
    the pods: Precompiling, Running, or Pending/Restarting with the reason pods are not starting. A name held by
    a foreign object is never created over, and no pod is created while any is: it would mount what the
    foreign object holds (its config, its SSH keys) or sit behind its Service. Pods to create against a Kueue
    flavor that contradicts the job's node selector (p.flavor_conflict) fail the job instead."""
    st, now, attempt, observed = p.status, p.now, p.attempt, p.observed
    ssh_secret = f"Secret/{p.names.ssh_secret}"
    foreign = {f.ref for f in p.foreign}
    make_keys = p.layout.launcher == "mpi" and ssh_secret not in p.objects and ssh_secret not in foreign
    if make_keys and observed.ssh_keys is None:
        raise ValueError("MPI jobs need Observed.ssh_keys to create their Secret")
    children = desired(
        p.job,
        images=p.config.get("images"),
        attempt=attempt,
        ssh_keys=observed.ssh_keys() if make_keys and observed.ssh_keys else None,
        network_policy_config=p.config.get("networkPolicy"),
        placements=p.placements,
    )
    p.delete(p.stale)
    taken = {pod["metadata"]["name"] for pod in p.pods}
    needed = [f"{obj['kind']}/{obj['metadata']['name']}" for obj in children.all()]
    if p.layout.launcher == "mpi" and ssh_secret not in needed:  # built only with fresh keys
        needed.append(ssh_secret)
    blocked = [ref for ref in needed if ref in foreign]
    for obj in children.objects:
        ref = f"{obj['kind']}/{obj['metadata']['name']}"
        if ref not in p.objects and ref not in foreign:
            p.plan.create.append(obj)
    current_names = {pod["metadata"]["name"] for pod in p.current}
    missing = [pod for pod in children.pods if pod["metadata"]["name"] not in current_names | taken]
    if missing and not blocked and p.flavor_conflict:
        p.plan.create = []
        return p.finish("Failed", "FlavorConflict", p.flavor_conflict)
    p.plan.create += missing if not blocked else []
    creates_pods = any(o["kind"] == "Pod" for o in p.plan.create)
    if creates_pods and "startTime" not in st:
        st["startTime"] = iso(now)
    if creates_pods and not p.current:
        set_condition(
            st, "Created", True, "PodsCreated", f"created {len(children.pods)} pods for attempt {attempt}", now
        )

    rank_role = c.ROLE_WORKER if p.layout.launcher == "mpi" else c.ROLE_RANK
    up = ("Running", "Succeeded")
    ranks_up = [pod for pod in p.current if _role(pod) == rank_role and _phase(pod) in up]
    st["ranks"] = {"ready": len(ranks_up), "total": p.layout.nodes}
    all_running = len(p.current) == len(children.pods) and all(_phase(pod) in up for pod in p.current)
    if any(_init_running(pod, c.INIT_PRECOMPILE) for pod in p.current):
        p.transition("Precompiling", "Precompiling", "filling the compile cache with a trial run")
        set_condition(st, "Precompiling", True, "Precompiling", "trial run filling the compile cache", now)
    elif all_running:
        msg = f"{p.layout.world_size} processes on {p.layout.nodes} pod(s)"
        p.transition("Running", "Running", msg)
        set_condition(st, "Precompiling", False, "Done", "compile cache filled", now)
        set_condition(st, "Restarting", False, "Running", msg, now)
        set_condition(st, "Running", True, "Running", msg, now)
    elif blocked:
        msg = f"waiting: {', '.join(blocked)} already exist(s) but this job does not control them; {FOREIGN_FIX}"
        p.transition("Pending", "ForeignChildren", msg)
    else:
        problem = _pending_problem(p.current)
        leftovers = bool(p.stale) or any(_deleting(pod) for pod in p.pods)
        phase = "Restarting" if p.old_phase == "Restarting" and leftovers else "Pending"
        waiting = "waiting for the previous attempt's pods to terminate" if leftovers else "waiting for pods to start"
        reason = "Unschedulable" if problem and problem.reason == "Unschedulable" else phase
        p.transition(phase, reason, problem.message if problem else waiting)
    return p.plan


# In order: the first phase that returns a plan ends the pass; converge always does. The one list of phases: `queued`
# (with the rest of the Kueue logic) lives in kueue.py.
PHASES: tuple[Phase, ...] = (terminal, allowlists, suspended, queued, deadline, group_failure, success)


def begin(job: dict[str, Any], observed: Observed, config: Mapping[str, Any] | None = None) -> Pass:
    """The pass's shared reading of the job and its pods, and a plan that starts from the current status."""
    old = job.get("status") or {}
    plan = Plan(status=copy.deepcopy(old))
    st = plan.status
    st["observedGeneration"] = job["metadata"].get("generation", 1)
    attempt = int(st.get("restartCount") or 0)
    st["restartCount"] = attempt
    note_progress(st, observed.progress, observed.now)
    layout = resolve(job)
    if observed.progress:
        measured = throughput.of(throughput.Context.of(job, layout), observed.progress)
        if measured is not None:
            st["throughput"] = measured
    st["worldSize"] = layout.world_size
    if (location := output_location(job, Names.of(job, layout.launcher))) is not None:
        st["output"] = {"location": location}  # the job's own directory of its claim or prefix of its URL
    pods, objects, foreign = owned(owner_reference(job)["uid"], observed)  # the uid its children carry
    report_foreign(st, foreign, observed.now)
    live = [pod for pod in pods if not _deleting(pod)]
    plan.relabel = relabels(job, live, objects, observed)
    _record_compile_cache(plan, Names.of(job, layout.launcher), layout, attempt, live)
    return Pass(
        job=job,
        observed=observed,
        config=config or {},
        layout=layout,
        names=Names.of(job, layout.launcher),
        plan=plan,
        old_phase=old.get("phase"),
        attempt=attempt,
        pods=pods,
        objects=objects,
        foreign=foreign,
        live=live,
        current=[pod for pod in live if _attempt(pod) == attempt],
        stale=[pod for pod in live if _attempt(pod) != attempt],
    )


def relabels(
    job: dict[str, Any], live: list[dict[str, Any]], objects: frozenset[str], observed: Observed
) -> list[Relabel]:
    """The job's own children whose identity labels someone edited: they are found by their controller owner
    (the indexes key children by it as well), and put back under the job's labels so that its Service selects
    its pods again and no other job's index lists them."""
    name = job["metadata"]["name"]
    want = identity_labels(name)
    out = [
        Relabel("Pod", pod["metadata"]["name"], pod["metadata"]["uid"], pod["metadata"].get("labels") or {}, want)
        for pod in live
        if pod["metadata"].get("uid") and mislabelled(pod, name)
    ]
    for ref, (uid, labels) in sorted(observed.mislabelled.items()):
        if ref in objects:
            kind, _, child = ref.partition("/")
            out.append(Relabel(kind, child, uid, labels, want))
    wl = observed.workload
    owner = owner_reference(job)["uid"]
    if wl is not None and controller_uid(wl) == owner and wl["metadata"].get("uid") and mislabelled(wl, name):
        out.append(Relabel("Workload", wl["metadata"]["name"], wl["metadata"]["uid"], wl["metadata"]["labels"], want))
    return out


def _record_compile_cache(plan: Plan, names: Names, layout: Layout, attempt: int, live: list[dict[str, Any]]) -> None:
    """status.compileCache from the precompile trial of this attempt (cachereport.py), once it has finished."""
    source = names.launcher if layout.launcher == "mpi" else names.rank_pod(0)
    pod = next((x for x in live if x["metadata"]["name"] == source and _attempt(x) == attempt), None)
    report = cachereport.trial_report(pod) if pod else None
    if report is None:
        return
    report["attempt"] = attempt
    if plan.status.get("compileCache") != report:
        plan.status["compileCache"] = report
        plan.events.append(("Normal", "CompileCache", cachereport.describe(report)))


def reconcile(job: dict[str, Any], observed: Observed, config: Mapping[str, Any] | None = None) -> Plan:
    """`job` has passed admission.validate (defaults applied) and carries its current status. `config` is the
    operator's configuration (`images`, `networkPolicy`, `policy`). The job's full set of children (`desired()`)
    is built only by the converge phase: finished, suspended and failing jobs never pay for it."""
    p = begin(job, observed, config)
    for phase in PHASES:
        if phase(p) is not None:
            break
    else:
        converge(p)
    lost_nodes(p)
    pods_ready(p)
    return p.plan


INVALID_SPEC = "InvalidSpec"  # refusal.REASON too


def wind_down(job: dict[str, Any], observed: Observed, message: str) -> Plan:
    """A job that cannot be reconciled: its spec fails validation (stored before a CRD upgrade) or reconcile
    raised on its content. It ends Failed with reason InvalidSpec and `message` (a job already finished keeps
    its phase), reading nothing of its spec: its own pods that still run are deleted and its own Workload is
    marked Finished, so that it holds no quota."""
    old = job.get("status") or {}
    plan = Plan(status=copy.deepcopy(old))
    st, now = plan.status, observed.now
    message = message[:2000]
    if old.get("phase") not in TERMINAL:
        _transition(plan, old.get("phase"), "Failed", INVALID_SPEC, message)
        st["completionTime"] = iso(now)
        set_condition(st, "Running", False, INVALID_SPEC, message, now)
        set_condition(st, "Failed", True, INVALID_SPEC, message, now)
    uid = str(job["metadata"].get("uid"))
    running = [
        pod
        for pod in observed.pods
        if controller_uid(pod) == uid and not _deleting(pod) and _phase(pod) not in TERMINAL
    ]
    plan.delete_pods = [pod["metadata"]["name"] for pod in running]
    plan.pod_uids = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in running if pod["metadata"].get("uid")}
    wl = observed.workload
    if wl is not None and controller_uid(wl) == uid:
        plan.workload_status = finished_workload(wl, str(st.get("phase") or "Failed"), str(st.get("message")), now)
    return plan
