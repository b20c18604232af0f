"""What interrupts a running group besides a rank's own failure, read from structured fields only: its node lost
(the Node's Ready condition), a node drain (the pod's DisruptionTarget condition), and a hang (no new progress from
rank 0). Pure: reconcile's group_failure phase asks these questions; the loop feeds the answers' inputs (the node
index, the progress it reads from rank 0's log).

Why the Node and not the pod: the node lifecycle controller marks a lost node's pods not Ready only when they were
Ready (a pod still in its init containers, waiting for its peers or precompiling, keeps no trace of its node's
loss), and the pod's condition carries neither the node's state nor since when. The Node's Ready condition says
both, for every pod bound to it (docs/operator.md, "Node loss").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .conditions import iso, parse_time

# The pod condition the API server sets before an eviction through the eviction API deletes the pod (kubectl
# drain, the AWS Node Termination Handler, Karpenter), and its reason (k8s.io/api core/v1 DisruptionTarget).
DISRUPTION_TARGET = "DisruptionTarget"
EVICTION_BY_API = "EvictionByEvictionAPI"

# The failures' reasons the operator gives (status.failures[].reason), besides the kubelet's and "Deleted".
NODE_LOST = "NodeLost"
DRAINED = "Drained"
HUNG = "Hung"


def slim_node(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the node index holds of a Node: its Ready condition's status, since when (lastTransitionTime), its
    reason and message, and whether it is cordoned (spec.unschedulable)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    return {
        "ready": str(ready.get("status") or ""),  # "": never reported, not judged (node_down)
        "since": ready.get("lastTransitionTime"),
        "reason": ready.get("reason") or "",
        "message": ready.get("message") or "",
        "unschedulable": bool((obj.get("spec") or {}).get("unschedulable")),
    }


def node_name(pod: Mapping[str, Any]) -> str | None:
    """The node the pod is bound to (slim_child keeps spec.nodeName)."""
    name = (pod.get("spec") or {}).get("nodeName")
    return str(name) if name else None


@dataclass(frozen=True)
class NodeDown:
    """A node of the job's pods that is not Ready: lost once `left` reaches 0 (runPolicy.nodeLossSeconds)."""

    node: str
    since: datetime
    ready: str  # Unknown (the kubelet stopped reporting) or False (it reports the node unhealthy)
    reason: str
    message: str
    left: float  # seconds until nodeLossSeconds have passed since `since`

    @property
    def lost(self) -> bool:
        return self.left <= 0

    def describe(self) -> str:
        why = f" ({self.reason}: {self.message})" if self.reason or self.message else ""
        return f"node {self.node} not Ready (Ready {self.ready} since {iso(self.since)}){why}"


def node_down(
    pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]], loss_seconds: float, now: datetime
) -> NodeDown | None:
    """The pod's node when the node index shows it not Ready; None when it is Ready or not known (a node the
    index does not hold is never judged)."""
    name = node_name(pod)
    health = nodes.get(name) if name else None
    if name is None or health is None or health.get("ready") not in ("Unknown", "False"):
        return None
    try:
        since = parse_time(health.get("since")) or now
    except ValueError:
        since = now
    elapsed = (now - since).total_seconds()
    return NodeDown(
        name,
        since,
        str(health.get("ready")),
        str(health.get("reason") or ""),
        str(health.get("message") or ""),
        max(0.0, float(loss_seconds) - elapsed),
    )


def drained(pod: Mapping[str, Any]) -> bool:
    """Whether the pod was evicted through the eviction API: its DisruptionTarget condition says so."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True":
            return bool(cond.get("reason") == EVICTION_BY_API)
    return False


def note_progress(status: dict[str, Any], progress: dict[str, Any] | None, now: datetime) -> None:
    """status.progress from rank 0's newest lines, and status.lastProgressTime when they moved on: the clock of
    runPolicy.progressDeadlineSeconds. A precompile trial's lines never set it (the trial is not training)."""
    if progress is None:
        return
    if progress != status.get("progress") and progress.get("event") != "precompile":
        status["lastProgressTime"] = iso(now)
    status["progress"] = progress


def hang_left(status: Mapping[str, Any], deadline: int | None, now: datetime) -> float | None:
    """Seconds until rank 0's silence reaches runPolicy.progressDeadlineSeconds (0: it has), or None when no
    deadline applies: none is set, or this attempt has reported no progress yet (data preparation and
    compilation come before the first line and are never a hang)."""
    if deadline is None:
        return None
    try:
        last = parse_time(status.get("lastProgressTime"))
    except ValueError:
        return None
    if last is None:
        return None
    return max(0.0, float(deadline) - (now - last).total_seconds())
