"""Rank pods (torchrun), worker pods + launcher pod (MPI)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .. import constants as c
from ..api.schema import CACHE_FOLDER
from . import podtemplate as pod_template
from .env import command_env, container_env, resume_from_sub_path
from .flavors import Placement, place
from .layout import Layout
from .names import Names
from .objects import labels, owner_reference

WAIT_TIMEOUT_S = 900  # peers pulling a multi-GB image can take minutes; then the pod fails and the group restarts


def _volumes(job: dict[str, Any], layout: Layout, names: Names, role: str) -> tuple[list[Any], list[Any]]:
    spec = job["spec"]
    cache = spec.get("compileCache") or {}
    output = spec.get("output") or {}
    vols: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.config_map, "defaultMode": 0o444}},
        {"name": "home", "emptyDir": {}},
        # torch's shared-memory tensors and data-loader workers need more than the runtime's 64 MiB /dev/shm.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": c.CONFIG_DIR, "readOnly": True},
        {"name": "home", "mountPath": c.HOME_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if role != c.ROLE_LAUNCHER:
        if cache.get("claimName"):
            # Shared across jobs on purpose, but only the claim's cache folder: the same claim may hold other
            # jobs' outputs, which the cache mount must not reach (api/schema.py CACHE_FOLDER).
            vols.append({"name": "cache", "persistentVolumeClaim": {"claimName": cache["claimName"]}})
            mounts.append({"name": "cache", "mountPath": c.CACHE_DIR, "subPath": CACHE_FOLDER})
        else:
            vols.append({"name": "cache", "emptyDir": {}})
            mounts.append({"name": "cache", "mountPath": c.CACHE_DIR})
        if output.get("claimName"):
            vols.append({"name": "output", "persistentVolumeClaim": {"claimName": output["claimName"]}})
            sub = names.output_sub_path(output.get("path"))  # this job's directory only (the kubelet makes it)
            mounts.append({"name": "output", "mountPath": c.OUTPUT_DIR, "subPath": sub})
            resume = resume_from_sub_path(output)  # output.resumeFrom: another directory of the same claim
            if resume is not None:
                mounts.append({"name": "output", "mountPath": c.RESUME_FROM_DIR, "subPath": resume, "readOnly": True})
        else:  # output.url: a scratch directory the runtime uploads from
            vols.append({"name": "output", "emptyDir": {}})
            mounts.append({"name": "output", "mountPath": c.OUTPUT_DIR})
    if layout.launcher == "mpi":
        keys = c.SSH_LAUNCHER_KEYS if role == c.ROLE_LAUNCHER else c.SSH_WORKER_KEYS
        vols.append(
            {
                "name": "ssh",
                "secret": {
                    "secretName": names.ssh_secret,
                    "defaultMode": 0o400,
                    "items": [{"key": k, "path": k} for k in keys],
                },
            }
        )
        mounts.append({"name": "ssh", "mountPath": c.SSH_DIR, "readOnly": True})
    return vols, mounts


def _security(uid: int) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = {
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return pod, container


# Where "one pod per node" is counted: the node itself (every node has this label, set by the kubelet).
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def _one_per_node(affinity: Any, job_name: str, role: str) -> Any:
    """`affinity` (the user's, or None) plus a required pod anti-affinity between this job's pods of `role` on
    HOSTNAME_TOPOLOGY: a job whose pods each take a whole instance never gets two on one node, whatever the
    scheduler's scoring or a node's spare capacity. A user's affinity of the wrong shape is passed on unchanged
    (the API server refuses it with its own message, as for any malformed affinity)."""
    term = {
        "labelSelector": {"matchLabels": {c.LABEL_JOB_NAME: job_name, c.LABEL_ROLE: role}},
        "topologyKey": HOSTNAME_TOPOLOGY,
    }
    out = affinity if affinity is not None else {}
    if not isinstance(out, dict):
        return affinity
    anti = out.setdefault("podAntiAffinity", {})
    if not isinstance(anti, dict):
        return affinity
    required = anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
    if not isinstance(required, list):
        return affinity
    required.append(term)
    return out


def scheduling(job: dict[str, Any], layout: Layout, role: str) -> dict[str, Any]:
    """A role's scheduling fields from the job alone (before any Kueue flavor is placed on them). The MPI
    launcher only runs mpirun: it goes wherever it fits, not onto an accelerator node. Rank-holding pods that
    each take a whole instance (Layout.whole_node) of a multi-node job go one per node."""
    hw = job["spec"]["hardware"]
    if role == c.ROLE_LAUNCHER:
        return {"schedulerName": hw["schedulerName"]} if hw.get("schedulerName") else {}
    p = layout.profile
    selector = dict(p.node_selector)
    if layout.instance is not None:
        selector["node.kubernetes.io/instance-type"] = layout.instance.name
    selector.update(hw.get("nodeSelector") or {})
    out: dict[str, Any] = {}
    if selector:
        out["nodeSelector"] = dict(sorted(selector.items()))
    tolerations = [dict(t) for t in p.tolerations] + list(hw.get("tolerations") or [])
    if tolerations:
        out["tolerations"] = tolerations
    affinity = copy.deepcopy(hw["affinity"]) if hw.get("affinity") else None
    if layout.nodes > 1 and layout.whole_node:
        affinity = _one_per_node(affinity, job["metadata"]["name"], role)
    if affinity:
        out["affinity"] = affinity
    if hw.get("schedulerName"):
        out["schedulerName"] = hw["schedulerName"]
    return out


# Pod role -> what Kueue's admission places on that role's pods (builders.flavors); None without a queue.
Placements = Mapping[str, Placement] | None


def _pod(
    job: dict[str, Any],
    layout: Layout,
    names: Names,
    *,
    role: str,
    rank: int | None,
    attempt: int,
    image: str,
    containers: list[dict[str, Any]],
    init_containers: list[dict[str, Any]],
    placements: Placements,
) -> dict[str, Any]:
    """The pod of `rank` (the launcher's when None) in `role`."""
    spec = job["spec"]
    name = names.launcher if rank is None else names.rank_pod(rank)
    meta_labels = labels(names, role, rank)
    meta_labels[c.LABEL_ATTEMPT] = str(attempt)
    vols, mounts = _volumes(job, layout, names, role)
    pod_sec, ctr_sec = _security(layout.profile.run_as_user)
    pull = spec.get("imagePullPolicy")
    for ctr in init_containers + containers:
        ctr.setdefault("image", image)
        if pull:
            ctr["imagePullPolicy"] = pull
        ctr["volumeMounts"] = mounts
        ctr["securityContext"] = ctr_sec
        # The kubelet copies the last log lines into the termination message: the operator reports them
        # when a rank fails, without reading logs.
        ctr["terminationMessagePolicy"] = "FallbackToLogsOnError"
        if spec.get("envFrom"):
            ctr["envFrom"] = spec["envFrom"]
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": names.service,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # pods report progress through logs, never the API
        "enableServiceLinks": False,
        "securityContext": pod_sec,
        **_placed(job, layout, role, placements),
        "initContainers": init_containers,
        "containers": containers,
        "volumes": vols,
    }
    if not init_containers:
        del pod_spec["initContainers"]
    grace = (spec.get("runPolicy") or {}).get("terminationGracePeriodSeconds")
    if grace is not None:
        # A drain's or deletion's SIGTERM makes the ranks save the current step (runtime preemption.py) in it.
        pod_spec["terminationGracePeriodSeconds"] = grace
    if spec.get("serviceAccountName"):
        pod_spec["serviceAccountName"] = spec["serviceAccountName"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": names.namespace,
            "labels": meta_labels,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": pod_spec,
    }
    return pod_template.apply(pod, job, role, image)  # spec.podTemplate's additions (builders/podtemplate.py)


def _resources(layout: Layout) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if layout.requests:
        out["requests"] = dict(layout.requests)
    if layout.limits:
        out["limits"] = dict(layout.limits)
    return out


def _placed(job: dict[str, Any], layout: Layout, role: str, placements: Placements) -> dict[str, Any]:
    return place(scheduling(job, layout, role), (placements or {}).get(role))


def torchrun_pods(
    job: dict[str, Any], layout: Layout, names: Names, image: str, attempt: int, placements: Placements = None
) -> list[Any]:
    spec = job["spec"]
    precompile = bool((spec.get("compileCache") or {}).get("precompile"))
    command = spec.get("command") or [c.RUNTIME_CMD, "launch"]
    pods = []
    for i in range(layout.nodes):
        env_extra = {"FTJOB_NODE_RANK": str(i)}
        if spec.get("command"):  # bring-your-own script: torchrun's variables (PET_*), nothing else assumed
            env_extra.update(command_env(layout.nodes, layout.procs_per_node, names.master_addr, c.MASTER_PORT, i))
        env = container_env(job, layout, names, env_extra)
        init = []
        if i > 0:
            init.append(
                {
                    "name": c.INIT_WAIT,
                    "command": [
                        c.RUNTIME_CMD,
                        "wait-for",
                        "--dns",
                        names.master_addr,
                        "--timeout",
                        str(WAIT_TIMEOUT_S),
                    ],
                    "env": env,
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            )
        if precompile:
            init.append(
                {
                    "name": c.INIT_PRECOMPILE,
                    "command": [c.RUNTIME_CMD, "launch", "--precompile"],
                    "env": [*env, {"name": "FTJOB_MODE", "value": "precompile"}],
                    "resources": _resources(layout),
                }
            )
        trainer = {
            "name": c.CONTAINER_TRAINER,
            "command": list(command),
            "env": env,
            "resources": _resources(layout),
            "ports": [{"name": "rendezvous", "containerPort": c.MASTER_PORT}],
        }
        pods.append(
            _pod(
                job,
                layout,
                names,
                role=c.ROLE_RANK,
                rank=i,
                attempt=attempt,
                image=image,
                containers=[trainer],
                init_containers=init,
                placements=placements,
            )
        )
    return pods


def mpi_pods(
    job: dict[str, Any], layout: Layout, names: Names, image: str, attempt: int, placements: Placements = None
) -> list[Any]:
    spec = job["spec"]
    env = container_env(job, layout, names)
    pods = []
    for i in range(layout.nodes):
        sshd = {
            "name": c.CONTAINER_SSHD,
            "command": [c.RUNTIME_CMD, "sshd"],
            "env": env,
            "resources": _resources(layout),
            "ports": [{"name": "ssh", "containerPort": c.SSH_PORT}],
            "readinessProbe": {"tcpSocket": {"port": c.SSH_PORT}, "periodSeconds": 2},
        }
        pods.append(
            _pod(
                job,
                layout,
                names,
                role=c.ROLE_WORKER,
                rank=i,
                attempt=attempt,
                image=image,
                containers=[sshd],
                init_containers=[],
                placements=placements,
            )
        )
    # The launcher's own name first: the workers' proxies resolve it through the same cluster DNS.
    wait_cmd = [c.RUNTIME_CMD, "wait-for", "--timeout", str(WAIT_TIMEOUT_S), "--dns", names.fqdn(names.launcher)]
    for i in range(layout.nodes):
        host = names.fqdn(names.rank_pod(i))
        wait_cmd += ["--dns", host, "--ssh", host]
    mpirun = [c.RUNTIME_CMD, "mpirun"]
    if spec.get("command"):
        mpirun += ["--", *spec["command"]]
    init = [
        {
            "name": c.INIT_WAIT,
            "command": wait_cmd,
            "env": env,
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        }
    ]
    if (spec.get("compileCache") or {}).get("precompile"):
        # mpirun forwards the launcher's environment, so FTJOB_MODE reaches every rank.
        init.append(
            {
                "name": c.INIT_PRECOMPILE,
                "command": mpirun,
                "env": [*env, {"name": "FTJOB_MODE", "value": "precompile"}],
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
            }
        )
    launcher = {
        "name": c.CONTAINER_LAUNCHER,
        "command": mpirun,
        "env": env,
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    }
    pods.append(
        _pod(
            job,
            layout,
            names,
            role=c.ROLE_LAUNCHER,
            rank=None,
            attempt=attempt,
            image=image,
            containers=[launcher],
            init_containers=init,
            placements=placements,
        )
    )
    return pods
