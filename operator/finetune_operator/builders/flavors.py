"""What a Kueue admission adds to the pods: each pod set's assigned ResourceFlavors' `nodeLabels` (into the
node selector) and `tolerations`, as Kueue's own job integrations apply them (its podset.FromAssignment and
Merge). A flavor's `nodeTaints` add nothing: Kueue reads them when it assigns flavors, the pods tolerate them
through the flavor's `tolerations` or the job's own.

Pure: the operator reads the ResourceFlavors named in `status.admission` (k8s.Kube.get_resource_flavor) and
passes them in; reconcile checks `conflicts()` before any pod is built, so `place()` never overrides the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Placement:
    """A pod set's share of the admission: the union over its assigned flavors (in assignment order)."""

    flavors: tuple[str, ...]  # ResourceFlavor names, for messages
    node_labels: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


def assigned_flavors(admission: Mapping[str, Any] | None) -> list[str]:
    """Every ResourceFlavor an admission names (`podSetAssignments[].flavors`: resource -> flavor), once each."""
    names: list[str] = []
    for assignment in (admission or {}).get("podSetAssignments") or []:
        for flavor in (assignment.get("flavors") or {}).values():
            if flavor not in names:
                names.append(str(flavor))
    return names


def placements(admission: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]]) -> dict[str, Placement]:
    """Pod set name (the pod role) -> its Placement. `flavors` maps each name of `assigned_flavors()` to its
    ResourceFlavor object; a later flavor's label of the same key wins, as in Kueue (both keys come from
    flavors Kueue itself assigned to one pod set, never from the job)."""
    out: dict[str, Placement] = {}
    for assignment in admission.get("podSetAssignments") or []:
        names: list[str] = []
        labels: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        for name in (assignment.get("flavors") or {}).values():
            if name in names:
                continue
            names.append(name)
            spec = flavors[name].get("spec") or {}
            labels.update(spec.get("nodeLabels") or {})
            tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        out[str(assignment["name"])] = Placement(tuple(names), labels, tuple(tolerations))
    return out


def conflicts(node_selector: Mapping[str, str], placement: Placement) -> list[tuple[str, str, str]]:
    """(key, the pod's value, the flavor's value) for each node-selector key both set to different values."""
    return [
        (k, node_selector[k], v)
        for k, v in sorted(placement.node_labels.items())
        if k in node_selector and node_selector[k] != v
    ]


def place(scheduling: dict[str, Any], placement: Placement | None) -> dict[str, Any]:
    """A pod's scheduling fields (nodeSelector, tolerations, ...) with the placement added: its node labels
    merged into the node selector, its tolerations appended unless already there."""
    if placement is None:
        return scheduling
    bad = conflicts(scheduling.get("nodeSelector") or {}, placement)
    if bad:  # reconcile fails the job before building pods; reaching this is a bug, not a user error
        raise ValueError(f"node selector conflicts with flavors {placement.flavors}: {bad}")
    out = dict(scheduling)
    selector = {**(scheduling.get("nodeSelector") or {}), **placement.node_labels}
    if selector:
        out["nodeSelector"] = dict(sorted(selector.items()))
    tolerations = list(scheduling.get("tolerations") or [])
    tolerations += [dict(t) for t in placement.tolerations if t not in tolerations]
    if tolerations:
        out["tolerations"] = tolerations
    return out
