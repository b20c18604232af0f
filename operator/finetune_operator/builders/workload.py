"""The Kueue Workload of a queued job (spec.runPolicy.queueName): one pod set per pod role, counted and sized
like the pods the job will create, so Kueue reserves exactly the quota the pods use.

Kueue's contract for a framework it does not know (its "external framework" integration): the job's
controller creates the Workload, owns it, creates no pods until Kueue admits it, and marks it Finished when the
job ends. kueue.queued (a phase of reconcile) holds the pods back; this module only builds the object.
"""

from __future__ import annotations

from typing import Any

from .. import constants as c
from . import podtemplate as pod_template
from .layout import Layout
from .names import Names
from .objects import labels, owner_reference

# The API group and kind of a Pod PriorityClass, as a Workload's spec.priorityClassRef names it (Kueue's
# NewPodPriorityClassRef; a WorkloadPriorityClass would be kueue.x-k8s.io/WorkloadPriorityClass).
PRIORITY_CLASS_GROUP = "scheduling.k8s.io"
PRIORITY_CLASS_KIND = "PriorityClass"

# Pod-spec fields that decide which flavor fits and how much quota a pod takes; the rest of the pod (env,
# volumes, commands) is of no interest to Kueue and stays out of the Workload.
_SCHEDULING_FIELDS = ("nodeSelector", "tolerations", "affinity", "schedulerName", "priorityClassName")


def _container(ctr: dict[str, Any]) -> dict[str, Any]:
    out = {"name": ctr["name"], "image": ctr["image"]}
    if ctr.get("resources"):
        out["resources"] = ctr["resources"]
    if ctr.get("restartPolicy"):
        # A native sidecar (spec.podTemplate.initContainers): Kueue adds its requests to the containers' for
        # the pod's whole life, as the kubelet does, instead of counting it like a passing init container.
        out["restartPolicy"] = ctr["restartPolicy"]
    return out


def _template(pod: dict[str, Any], meta: dict[str, dict[str, str]]) -> dict[str, Any]:
    spec = pod["spec"]
    tpl: dict[str, Any] = {k: spec[k] for k in _SCHEDULING_FIELDS if k in spec}
    tpl["containers"] = [_container(x) for x in spec["containers"]]
    if spec.get("initContainers"):
        tpl["initContainers"] = [_container(x) for x in spec["initContainers"]]
    tpl["restartPolicy"] = spec.get("restartPolicy", "Never")
    return {"metadata": meta, "spec": tpl} if meta else {"spec": tpl}


def workload(
    job: dict[str, Any],
    layout: Layout,
    names: Names,
    pods: list[dict[str, Any]],
    priority: int | None = None,
) -> dict[str, Any]:
    """The Workload for `pods` (one attempt's pods, from `desired()`). A role's template is its last pod:
    torchrun ranks above 0 carry the wait-for-peers init container, which Kueue counts like the kubelet
    (the larger of the init and the regular containers' requests).

    Each pod set's template carries spec.podTemplate's labels and annotations (not the operator's per-pod ones,
    such as the rank): Kueue reads a pod set's template metadata where it makes pods of its own from it, e.g.
    the PodTemplates of a ProvisioningRequest admission check. With spec.podTemplate.priorityClassName, the
    pod sets carry it and the Workload gets `priorityClassRef` and `priority`, the class's value (read by the
    caller), as Kueue's own integrations derive them from the pod template (jobframework.ExtractPriority):
    Kueue orders and preempts Workloads by `priority` and reads nothing else for it."""
    queue = job["spec"]["runPolicy"]["queueName"]
    roles: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        roles.setdefault(pod["metadata"]["labels"][c.LABEL_ROLE], []).append(pod)
    meta = pod_template.metadata(job)
    pod_sets = [
        {"name": role, "count": len(group), "template": _template(group[-1], meta)} for role, group in roles.items()
    ]
    meta_labels = labels(names)
    meta_labels[c.LABEL_KUEUE_QUEUE] = queue
    return {
        "apiVersion": f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": names.workload,
            "namespace": names.namespace,
            "labels": meta_labels,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "queueName": queue,
            "podSets": pod_sets,
            **_priority(job, priority),
        },
    }


def _priority(job: dict[str, Any], value: int | None) -> dict[str, Any]:
    name = pod_template.template(job).get("priorityClassName")
    if not name or value is None:
        return {}
    ref = {"group": PRIORITY_CLASS_GROUP, "kind": PRIORITY_CLASS_KIND, "name": name}
    return {"priorityClassRef": ref, "priority": value}
