"""spec.podTemplate: what a user adds to the pods the operator builds (Kubeflow's pod template overrides, within
what the operator derives).

Which pods get what:
- metadata.labels, metadata.annotations, priorityClassName and imagePullSecrets: every pod of the job, the MPI
  launcher too (an evicted or preempted launcher ends the group as surely as a rank, and Kueue takes one priority
  per Workload; the launcher's image comes from the same registry);
- volumes, volumeMounts and initContainers: the pods of `roles`, by default those that hold ranks (rank, or
  worker under MPI). The launcher only runs mpirun, so a dataset or a sidecar reaches it only when asked.

The user's init containers run first, in their order, then the operator's (wait-for-peers, precompile): data
preparation and sidecars are in place before the operator's first step. restartPolicy Always makes one a native
sidecar (Kubernetes 1.29+), which the kubelet stops once the main container has finished, so it never keeps a
finished rank pod running (a sidecar as a second regular container would, and the job would never end).

Nothing here can replace what the operator sets: the operator's labels win over the user's, its volumes, mounts
and containers come first, and every user container gets the operator's container security context. Admission
(podtemplate_rules.py) refuses the templates that would collide, so these precedences only guard pure code.
Pure: called by pods._pod for every pod, and by workload.py for the Workload's pod sets.
"""

from __future__ import annotations

from typing import Any

from .. import constants as c

# Roles that get volumes, volumeMounts and initContainers when spec.podTemplate.roles is absent: the pods that
# hold ranks.
DEFAULT_ROLES = (c.ROLE_RANK, c.ROLE_WORKER)
# Fields of a user's container copied as written (the rest is the operator's: image default, pull policy,
# securityContext, terminationMessagePolicy).
_CONTAINER_FIELDS = ("command", "args", "workingDir", "restartPolicy", "env", "envFrom", "resources", "volumeMounts")


def template(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"].get("podTemplate") or {})


def roles(job: dict[str, Any]) -> tuple[str, ...]:
    """The roles whose pods get the template's volumes, mounts and init containers."""
    return tuple(template(job).get("roles") or DEFAULT_ROLES)


def metadata(job: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The template's labels and annotations (only those given): for the pods and the Workload's pod sets."""
    meta = template(job).get("metadata") or {}
    return {k: dict(meta[k]) for k in ("labels", "annotations") if meta.get(k)}


def _container(job: dict[str, Any], ctr: dict[str, Any], image: str, security: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": ctr["name"], "image": ctr.get("image") or image}
    pull = ctr.get("imagePullPolicy") or job["spec"].get("imagePullPolicy")
    if pull:
        out["imagePullPolicy"] = pull
    out.update({k: ctr[k] for k in _CONTAINER_FIELDS if k in ctr})
    out["securityContext"] = dict(security)
    # As on the operator's containers: a failed init container's last log lines reach status.failures.
    out["terminationMessagePolicy"] = "FallbackToLogsOnError"
    return out


def apply(pod: dict[str, Any], job: dict[str, Any], role: str, image: str) -> dict[str, Any]:
    """`pod` (built by pods._pod for `role`, with the job's `image`) with spec.podTemplate added; unchanged
    without one."""
    tpl = template(job)
    if not tpl:
        return pod
    meta = metadata(job)
    own = pod["metadata"]
    # The operator's keys first and kept, then the user's (admission refuses a template that sets the same).
    labels = {**own["labels"], **{k: v for k, v in meta.get("labels", {}).items() if k not in own["labels"]}}
    have = own.get("annotations") or {}
    annotations = {**have, **{k: v for k, v in meta.get("annotations", {}).items() if k not in have}}
    out: dict[str, Any] = {}
    for k, v in own.items():  # rebuilt to keep the keys' order: annotations right after labels
        if k == "annotations":
            continue
        out[k] = labels if k == "labels" else v
        if k == "labels" and annotations:
            out["annotations"] = annotations
    pod["metadata"] = out
    spec = pod["spec"]
    if tpl.get("priorityClassName"):
        spec["priorityClassName"] = tpl["priorityClassName"]
    if tpl.get("imagePullSecrets"):
        # The admission plugin appends the ServiceAccount's own to these when the pod is created.
        spec["imagePullSecrets"] = [{"name": s["name"]} for s in tpl["imagePullSecrets"]]
    if role not in roles(job):
        return pod
    mounts = list(tpl.get("volumeMounts") or [])
    for ctr in spec.get("initContainers", []) + spec["containers"]:
        ctr["volumeMounts"] = [*ctr.get("volumeMounts", []), *mounts]
    spec["volumes"] = [*spec.get("volumes", []), *(tpl.get("volumes") or [])]
    users = tpl.get("initContainers") or []
    if users:
        security = spec["containers"][0].get("securityContext") or {}
        init = [_container(job, x, image, security) for x in users] + spec.get("initContainers", [])
        # The key where the Pod has it, before containers, as pods._pod writes it.
        rest = {k: v for k, v in spec.items() if k != "initContainers"}
        spec.clear()
        for k, v in rest.items():
            if k == "containers":
                spec["initContainers"] = init
            spec[k] = v
    return pod
