"""Service, ConfigMap (runtime config + MPI hostfile) and the per-job SSH Secret."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from .. import constants as c
from ..api.schema import COMPILE_CACHE, TRAINING
from ..api.validation import apply_defaults
from .layout import Layout
from .names import Names


@dataclass(frozen=True)
class SshKeys:
    """OpenSSH-format key material for one MPI job (made by sshkeys.generate_keys, outside the pure builders)."""

    private_key: str
    public_key: str
    host_private_key: str
    host_public_key: str


def job_uid(job: dict[str, Any]) -> str:
    """The job's uid (owner references, and FTJOB_JOB_UID: the runtime's checkpoints record it). Offline renders
    have no uid yet; the operator always has the real one."""
    return str(job["metadata"].get("uid") or "00000000-0000-0000-0000-000000000000")


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "name": meta["name"],
        "uid": job_uid(job),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(names: Names, role: str | None = None, rank: int | None = None) -> dict[str, str]:
    out = {
        c.LABEL_NAME: "finetune-job",
        c.LABEL_INSTANCE: names.job,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_PART_OF: "finetune-operator",
        c.LABEL_JOB_NAME: names.job,
    }
    if role:
        out[c.LABEL_COMPONENT] = role
        out[c.LABEL_ROLE] = role
    if rank is not None:
        out[c.LABEL_RANK] = str(rank)
    return out


def metadata(job: dict[str, Any], names: Names, name: str, role: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": names.namespace,
        "labels": labels(names, role),
        "ownerReferences": [owner_reference(job)],
    }


def service(job: dict[str, Any], layout: Layout, names: Names) -> dict[str, Any]:
    """Headless Service: gives every rank pod a stable name ({pod}.{job}.{ns}.svc), published before it is
    ready so peers can resolve each other during start-up."""
    port = c.SSH_PORT if layout.launcher == "mpi" else c.MASTER_PORT
    pname = "ssh" if layout.launcher == "mpi" else "rendezvous"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, names, names.service),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {c.LABEL_JOB_NAME: names.job, c.LABEL_MANAGED_BY: c.MANAGED_BY},
            "ports": [{"name": pname, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def hostfile(layout: Layout, names: Names) -> str:
    """Intel MPI and MPICH (Hydra) read `host:N`; OpenMPI reads `host slots=N`."""
    hosts = [names.fqdn(names.rank_pod(i)) for i in range(layout.nodes)]
    n = layout.procs_per_node
    if layout.mpi_implementation == "openmpi":
        return "".join(f"{h} slots={n}\n" for h in hosts)
    return "".join(f"{h}:{n}\n" for h in hosts)


def runtime_config(job: dict[str, Any]) -> dict[str, Any]:
    """config.json: the spec blocks the runtime reads, with every default spelled out."""
    spec = job["spec"]
    meta = job["metadata"]
    task = spec.get("task")
    return {
        "jobName": meta["name"],
        "namespace": meta.get("namespace") or "default",
        "task": task,
        "training": apply_defaults(TRAINING, spec.get("training") or {}) if task else None,
        "compileCache": apply_defaults(COMPILE_CACHE, spec.get("compileCache") or {}),
        "output": spec.get("output"),
    }


def _api_numbers(v: Any) -> Any:
    """Whole floats as ints, the way the API server hands JSON numbers back (0.0 is stored as 0): the operator,
    which reads jobs from the API, and `ftjob render`, which reads YAML, then write the same config.json."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _api_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_api_numbers(x) for x in v]
    return v


def config_map(job: dict[str, Any], layout: Layout, names: Names) -> dict[str, Any]:
    config = _api_numbers(runtime_config(job))
    data = {"config.json": json.dumps(config, indent=2, sort_keys=True) + "\n"}
    if layout.launcher == "mpi":
        data["hostfile"] = hostfile(layout, names)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(job, names, names.config_map), "data": data}


def known_hosts(layout: Layout, names: Names, host_public_key: str) -> str:
    """The launcher's known_hosts: every worker's stable names (the hostfile's FQDN and the short
    `{pod}.{service}` form) at the sshd port, with the workers' one host key. Names, not addresses: pod IPs
    change on restart, the names and the key do not."""
    key = " ".join(host_public_key.split()[:2])  # type and base64, without the comment
    lines = []
    for i in range(layout.nodes):
        pod = names.rank_pod(i)
        hosts = [names.fqdn(pod), f"{pod}.{names.service}"]
        lines.append(",".join(f"[{h}]:{c.SSH_PORT}" for h in hosts) + f" {key}\n")
    return "".join(lines)


def ssh_secret(job: dict[str, Any], layout: Layout, names: Names, keys: SshKeys) -> dict[str, Any]:
    """Immutable: a job keeps one identity for its lifetime; a restart reuses it. Each role mounts only its
    own keys (constants.SSH_LAUNCHER_KEYS / SSH_WORKER_KEYS)."""

    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": metadata(job, names, names.ssh_secret),
        "data": {
            "id_ed25519": b64(keys.private_key),
            "id_ed25519.pub": b64(keys.public_key),
            "authorized_keys": b64(keys.public_key),
            "ssh_host_ed25519_key": b64(keys.host_private_key),
            "ssh_host_ed25519_key.pub": b64(keys.host_public_key),
            "known_hosts": b64(known_hosts(layout, names, keys.host_public_key)),
        },
    }


def network_policy(job: dict[str, Any], names: Names, extra_ingress: list[dict[str, Any]]) -> dict[str, Any]:
    """Ingress to the job's pods only from pods of the same job (rendezvous, collectives, MPI's SSH and data
    ports), plus the operator's configured extras (e.g. a metrics agent). Egress stays open: ranks resolve
    DNS, read datasets and models and upload results. One policy per job, because policies are additive: a
    namespace-wide "same operator" rule would let jobs reach each other."""
    same_job = {"podSelector": {"matchLabels": {c.LABEL_JOB_NAME: names.job, c.LABEL_MANAGED_BY: c.MANAGED_BY}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(job, names, names.job),
        "spec": {
            "podSelector": {"matchLabels": {c.LABEL_JOB_NAME: names.job, c.LABEL_MANAGED_BY: c.MANAGED_BY}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [same_job]}, *extra_ingress],
        },
    }
