"""The Kueue phases of reconcile (spec.runPolicy.queueName): pure, like the rest of reconcile.

`queued` is one of reconcile.PHASES: the job's pods exist only while Kueue admits its Workload (`admitted` then
adds the admitted flavors' placements). `pods_ready` runs after the deciding phase and keeps the Workload's
PodsReady condition true to the pods; `finished_workload` releases the quota of a job that ended. The Workload
is read from the watch-fed Workload index (Observed.workload), and its ResourceFlavors are read by the loop
(`admitted_flavors` names them) into Observed.flavors.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import constants as c
from .builders import Layout, desired
from .builders.flavors import assigned_flavors, conflicts, placements
from .builders.pods import scheduling
from .builders.workload import workload as build_workload
from .conditions import FOREIGN_FIX, TERMINAL, iso, set_condition

if TYPE_CHECKING:  # reconcile imports this module for its phases; the types only go the other way
    from .reconcile import Pass, Plan


def _wl_condition(wl: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    """The Workload's condition `ctype` when it is True."""
    for cond in (wl.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return dict(cond)
    return None


def _wl_patch(wl: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": wl["metadata"].get("resourceVersion")}, "status": status}


# While an admitted job's ResourceFlavor cannot be read, it is read again this often (flavors are not watched;
# the Workload is, so its admission or eviction wakes the job at once).
FLAVOR_POLL_S = 3.0


def _queue_message(wl: dict[str, Any] | None, queue: str) -> str:
    """Why Kueue has not admitted the job, in Kueue's words: its QuotaReserved/Evicted condition's reason and
    message (e.g. `Pending: couldn't assign flavors to pod set rank: insufficient unused quota ...`)."""
    if wl is None:
        return f"waiting for Kueue: creating Workload for LocalQueue {queue}"
    name = wl["metadata"]["name"]
    for ctype in ("Evicted", "QuotaReserved", "Admitted"):
        for cond in (wl.get("status") or {}).get("conditions") or []:
            if cond.get("type") == ctype and (ctype == "Evicted") == (cond.get("status") == "True"):
                return f"Workload {name} in LocalQueue {queue}: {cond.get('reason')}: {cond.get('message', '')}"
    return f"Workload {name} in LocalQueue {queue}: waiting for Kueue to consider it"


def admitted_flavors(wl: dict[str, Any] | None) -> list[str]:
    """The ResourceFlavors to read for a pass (Observed.flavors): those of the Workload's admission while it is
    admitted and not evicted; none otherwise, so a queued job costs no more reads than its Workload's."""
    if wl is None or not _wl_condition(wl, "Admitted") or _wl_condition(wl, "Evicted"):
        return []
    return assigned_flavors((wl.get("status") or {}).get("admission"))


def priority_class_to_read(job: dict[str, Any], wl: dict[str, Any] | None) -> str | None:
    """The PriorityClass to read for a pass (Observed.priority_classes): spec.podTemplate.priorityClassName of a
    queued job whose Workload is still to be made (its priority is fixed then, as its pod sets are)."""
    if wl is not None or not (job["spec"].get("runPolicy") or {}).get("queueName"):
        return None
    name = (job["spec"].get("podTemplate") or {}).get("priorityClassName")
    return str(name) if name else None


# While the PriorityClass a queued job names cannot be read, it is read again this often (classes are not
# watched).
PRIORITY_CLASS_POLL_S = 3.0


def _selector_source(job: dict[str, Any], layout: Layout, key: str) -> str:
    """Which field of the job puts `key` into its pods' node selector (pods.scheduling), for messages."""
    if key in (job["spec"]["hardware"].get("nodeSelector") or {}):
        return "spec.hardware.nodeSelector"
    if layout.instance is not None and key == "node.kubernetes.io/instance-type":
        return "spec.hardware.instanceType"
    return f"profile {layout.profile.name}'s nodeSelector (spec.hardware.profile)"


def admitted(p: Pass, wl: dict[str, Any], queue: str) -> Plan | None:
    """An admitted job proceeds with its flavors' placements (p.placements), read by converge. A flavor that
    cannot be read holds pod creation. A flavor label that contradicts the job's own node selector
    (p.flavor_conflict) fails the job once it has pods to create, as Kueue's own integrations finish such a
    Workload (FailedToStart): the pods could not run where the quota was reserved, and overriding the job's
    selector would run them on nodes it did not ask for. Pods already running are left alone (a flavor's
    nodeLabels edited after they started)."""
    st, now = p.status, p.now
    admission = (wl.get("status") or {}).get("admission") or {}
    missing = [f for f in assigned_flavors(admission) if f not in p.observed.flavors]
    if missing:
        msg = (
            f"Kueue admitted Workload {wl['metadata']['name']} with ResourceFlavor(s) {', '.join(missing)}, "
            "which could not be read; waiting for them (pods are created once their nodeLabels and "
            "tolerations are known)"
        )
        # Nothing is created or deleted meanwhile; a job already past its queue keeps its phase.
        phase = p.old_phase if p.old_phase and p.old_phase != "Queued" else "Pending"
        p.transition(phase, "FlavorNotFound", msg)
        p.plan.requeue_after = FLAVOR_POLL_S
        return p.plan
    p.placements = placements(admission, p.observed.flavors)
    roles = (c.ROLE_WORKER, c.ROLE_LAUNCHER) if p.layout.launcher == "mpi" else (c.ROLE_RANK,)
    bad = []
    for role in roles:
        placement = p.placements.get(role)
        if placement is None:
            continue
        selector = scheduling(p.job, p.layout, role).get("nodeSelector") or {}
        for key, have, want in conflicts(selector, placement):
            bad.append(
                f"pod set {role}: {_selector_source(p.job, p.layout, key)} sets {key}={have} but Kueue "
                f"assigned ResourceFlavor(s) {', '.join(placement.flavors)} with nodeLabels {key}={want}"
            )
    if bad:
        p.placements = None
        p.flavor_conflict = (
            "; ".join(bad) + ". Fix: make the job's node selector agree with the flavor (or drop the key), or queue "
            f"it in a LocalQueue whose ClusterQueue has a matching flavor; Workload {wl['metadata']['name']} "
            f"(LocalQueue {queue}) is marked Finished to release its quota"
        )
    if p.old_phase == "Queued":
        set_condition(st, "Queued", False, "Admitted", f"admitted by Kueue (LocalQueue {queue})", now)
    return None


def queued(p: Pass) -> Plan | None:
    """spec.runPolicy.queueName: the job's pods exist only while Kueue admits its Workload. The Workload is
    created first; until it is admitted (or after Kueue evicts it) the job is Queued with Kueue's reason and
    holds no pods. An evicted job's pods are deleted, then the Workload's quota reservation is released so
    Kueue can queue it again, as Kueue's own job integrations do. Group restarts keep the admission: the
    Workload is the job's, not its pods'."""
    queue = p.run_policy.get("queueName")
    st, now, wl = p.status, p.now, p.observed.workload
    if not queue:
        # The queue was removed (admission allows it only before admission): the job's own Workload goes, else
        # Kueue could admit it later and hold quota for a job that no longer waits for it. By uid: only that one.
        if wl is not None and p.owns(wl) and not wl["metadata"].get("deletionTimestamp"):
            p.plan.delete_workload = wl["metadata"].get("uid")
        return None
    if wl is not None and not p.owns(wl):
        # Not ours (labels and names never prove it): e.g. the Workload of a deleted job of the same name that
        # the garbage collector has not removed yet. Wait without reading its admission; its deletion is a watch
        # event that wakes the job.
        p.delete(p.live)
        msg = (
            f"Workload {wl['metadata']['name']} exists but is not controlled by this job; waiting for it to go "
            f"({FOREIGN_FIX})"
        )
        p.transition("Queued", "ForeignWorkload", msg)
        set_condition(st, "Queued", True, "ForeignWorkload", msg, now)
        return p.plan
    evicted = _wl_condition(wl, "Evicted") if wl else None
    if wl is not None and _wl_condition(wl, "Admitted") and not evicted:
        return admitted(p, wl, queue)
    waits_in = ((wl or {}).get("spec") or {}).get("queueName")
    if wl is not None and waits_in and waits_in != queue:
        # queueName changed while the job waited (admission allows no other time): the Workload waiting in the old
        # queue goes, by uid, and the pass after its deletion makes one in the new queue.
        if not wl["metadata"].get("deletionTimestamp"):
            p.plan.delete_workload = wl["metadata"].get("uid")
        p.delete(p.live)
        msg = f"moving from LocalQueue {waits_in} to {queue}: replacing Workload {wl['metadata']['name']}"
        p.transition("Queued", "QueueChanged", msg)
        set_condition(st, "Queued", True, "QueueChanged", msg, now)
        return p.plan
    missing_class = None
    if wl is None:
        pclass = priority_class_to_read(p.job, wl)
        if pclass is not None and pclass not in p.observed.priority_classes:
            # Kueue orders and preempts by the Workload's priority, which is the class's value: no Workload
            # without it (Kueue's own integrations fail to make one too). Its creation is a later pass.
            missing_class = (
                f"PriorityClass {pclass} (spec.podTemplate.priorityClassName) not found; the Workload, whose "
                "priority is the class's value, is created once it exists: create the PriorityClass, or re-create "
                "the job with an existing one"
            )
            p.plan.requeue_after = PRIORITY_CLASS_POLL_S
        else:
            pods = desired(p.job, images=p.config.get("images"), attempt=p.attempt).pods
            value = p.observed.priority_classes.get(pclass) if pclass else None
            p.plan.create.append(build_workload(p.job, p.layout, p.names, pods, priority=value))
        if p.old_phase not in (None, "Queued"):
            # A job past its queue whose Workload the index does not show: deleted by someone, or its labels
            # edited so that the watch lost it (the create's 409 restores them). Its pods stay until a Workload
            # is seen and not admitted.
            return p.plan
    p.delete(p.live)
    if wl is not None and evicted and not p.pods and (wl.get("status") or {}).get("admission"):
        conds = [
            dict(x) for x in wl["status"].get("conditions") or [] if x.get("type") not in ("QuotaReserved", "Admitted")
        ]
        conds += [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": str(evicted.get("message", ""))[:1000],
                "lastTransitionTime": iso(now),
            },
            {
                "type": "Admitted",
                "status": "False",
                "reason": "NoReservation",
                "message": "The workload has no reservation",
                "lastTransitionTime": iso(now),
            },
        ]
        p.plan.workload_status = _wl_patch(wl, {"admission": None, "conditions": conds})
    msg = missing_class or _queue_message(wl, queue)
    reason = "PriorityClassNotFound" if missing_class else "Queued"
    p.transition("Queued", reason, msg)
    set_condition(st, "Queued", True, reason, msg, now)
    set_condition(st, "Running", False, reason, msg, now)
    st.pop("startTime", None)  # activeDeadlineSeconds counts from admission, not from the queue
    st["ranks"] = {"ready": 0, "total": p.layout.nodes}
    return p.plan


# Kueue's PodsReady condition on the Workload (its reasons and messages, as its own job integrations set them in
# jobframework's generatePodsReadyCondition): with Kueue's waitForPodsReady on, an admitted Workload without
# PodsReady=True within the timeout is evicted and requeued, and one whose PodsReady turns False after it was
# True is evicted once the recovery timeout passes.
PODS_READY = "PodsReady"
READY_MSG = "All pods reached readiness and the workload is running"
NOT_READY_MSG = "Not all pods are ready or succeeded"


def _pod_ready(pod: dict[str, Any]) -> bool:
    """Ready as Kueue counts it: the pod's Ready condition is True, or it has succeeded."""
    if (pod.get("status") or {}).get("phase") == "Succeeded":
        return True
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conds)


def _condition(wl: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    """The Workload's condition `ctype`, whatever its status."""
    return next((dict(x) for x in (wl.get("status") or {}).get("conditions") or [] if x.get("type") == ctype), None)


def pods_ready(p: Pass) -> None:
    """After the deciding phase: the PodsReady condition of the job's own admitted Workload follows its pods.
    True once every pod of the current attempt is Ready (or has succeeded) and none is being deleted; False
    with reason WaitForRecovery once it was True and a group restart (or a lost pod) takes pods away, and
    WaitForStart before the first time (and again once the Workload is no longer admitted). Written only when
    its status or reason changes (Kueue treats no condition as WaitForStart); a finished job's Workload is
    Finished instead."""
    wl, plan = p.observed.workload, p.plan
    if wl is None or not p.run_policy.get("queueName") or not p.owns(wl):
        return
    if plan.status.get("phase") in TERMINAL or _wl_condition(wl, "Finished"):
        return
    old = _condition(wl, PODS_READY)
    if not _wl_condition(wl, "Admitted") or _wl_condition(wl, "Evicted"):
        new = ("False", "WaitForStart", NOT_READY_MSG)
    else:
        pods = p.layout.nodes + (1 if p.layout.launcher == "mpi" else 0)
        going = set(plan.delete_pods)
        current = [pod for pod in p.current if pod["metadata"]["name"] not in going]
        if len(current) == pods and all(_pod_ready(pod) for pod in current):
            recovering = old is not None and old.get("reason") in ("WaitForRecovery", "Recovered")
            new = ("True", "Recovered" if recovering else "Started", READY_MSG)
        elif old is not None and (old.get("status") == "True" or old.get("reason") == "WaitForRecovery"):
            msg = f"waiting for the pods of attempt {plan.status.get('restartCount', p.attempt)} to be ready"
            new = ("False", "WaitForRecovery", msg)
        else:
            new = ("False", "WaitForStart", NOT_READY_MSG)
    have = (old.get("status"), old.get("reason")) if old else ("False", "WaitForStart")
    if have == new[:2]:
        return  # unchanged (no condition at all counts as WaitForStart for Kueue, as it does here)
    cond = {
        "type": PODS_READY,
        "status": new[0],
        "reason": new[1],
        "message": new[2],
        "lastTransitionTime": iso(p.now),
        "observedGeneration": wl["metadata"].get("generation", 1),
    }
    if plan.workload_status is None:
        conds = [dict(x) for x in (wl.get("status") or {}).get("conditions") or []]
        plan.workload_status = _wl_patch(wl, {"conditions": conds})
    conds = plan.workload_status["status"].setdefault("conditions", [])
    conds[:] = [x for x in conds if x.get("type") != PODS_READY] + [cond]


def finished_workload(wl: dict[str, Any] | None, phase: str, message: str, now: datetime) -> dict[str, Any] | None:
    """The status patch that marks `wl` Finished (None when there is none, or it already is)."""
    if wl is None or _wl_condition(wl, "Finished"):
        return None
    conds = [dict(x) for x in (wl.get("status") or {}).get("conditions") or [] if x.get("type") != "Finished"]
    conds.append(
        {
            "type": "Finished",
            "status": "True",
            "reason": phase,
            "message": message[:1000],
            "lastTransitionTime": iso(now),
            "observedGeneration": wl["metadata"].get("generation", 1),
        }
    )
    return _wl_patch(wl, {"conditions": conds})
