"""The environment variables the operator sets, which spec.env may not override: derived by rendering every shape
of job the builders know (each profile and stack, launcher, single and multi node, bf16, precompile, S3 output,
own command), so a variable a builder starts setting is reserved without a list to keep in step. A profile
reserves what any of its stacks sets.

spec.env wins over the derived values in the pods (env.py), so overriding MASTER_ADDR, the FTJOB_* contract or a
profile's LD_PRELOAD would silently break rendezvous or the runtime; admission rejects it instead.

Besides those, the device-visibility variables (DEVICE_ENV) are reserved on every profile: the NVIDIA container
toolkit and the Neuron OCI hook expose the devices such a variable names, so NVIDIA_VISIBLE_DEVICES=all in a pod
that requested no GPU would hand it every GPU of the node, outside the scheduler's and Kueue's accounting.

An envFrom prefix is refused when prepending it to some key could make one of these names (FTJOB_MODE from
`prefix: FTJOB_` and a key MODE), since a name the container does not set itself is taken from envFrom.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from .. import profiles
from ..api.rules import Rule
from ..api.schema import PROFILES, openapi_schema
from ..api.validation import apply_defaults
from . import desired
from .objects import SshKeys

RESERVED_PREFIX = "FTJOB_"  # the runtime contract (docs/architecture.md): every FTJOB_* name, present or future
# Variables that choose which accelerator devices a container sees. The device plugins set them from what the pod
# was allocated (nvidia-device-plugin: NVIDIA_VISIBLE_DEVICES; the Neuron device plugin: NEURON_RT_VISIBLE_CORES,
# and AWS_NEURON_VISIBLE_DEVICES for the Neuron OCI hook), the NVIDIA container toolkit reads the NVIDIA_* ones
# (MIG_CONFIG/MIG_MONITOR grant MIG management), and CUDA_VISIBLE_DEVICES / NEURON_RT_NUM_CORES renumber or
# resize what the ranks use, under the launcher's feet.
DEVICE_ENV = (
    "AWS_NEURON_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "NEURON_RT_NUM_CORES",
    "NEURON_RT_VISIBLE_CORES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
)
SHAPE_KEYS = SshKeys("k", "k.pub", "h", "h.pub")  # render the shapes' MPI pods (their Secret's content is moot)


def shapes(profile: str) -> list[dict[str, Any]]:
    """Jobs of every shape on `profile`: what differs between them is which variables the builders set (and,
    for podtemplate_rules.py, which labels, volumes, mounts and containers)."""
    p = profiles.get(profile)
    multi = [i for i in p.instance_types.values() if i.efa] or list(p.instance_types.values())
    instances = [None, *(i.name for i in multi[:1])]
    jobs = []
    for stack, inst, launcher, nodes, own in itertools.product(
        p.stacks, instances, ("torchrun", "mpi"), (1, 2), (False, True)
    ):
        spec: dict[str, Any] = {
            "hardware": {"profile": profile, "stack": stack, "nodes": nodes},
            "launcher": launcher,
        }
        if inst:
            spec["hardware"]["instanceType"] = inst
        if own:
            spec["command"] = ["true"]
        else:
            spec["task"] = {"type": "text-classification", "model": "m", "dataset": {"path": "d"}}
            spec["training"] = {"precision": "bf16"}
            spec["compileCache"] = {"precompile": True}
            spec["output"] = {"url": "s3://b/p"}
        job = {
            "apiVersion": "finetune.dev/v1alpha1",
            "kind": "FineTuneJob",
            "metadata": {"name": "j", "namespace": "n", "uid": "u"},
            "spec": spec,
        }
        jobs.append(apply_defaults(openapi_schema(), job))
    return jobs


@functools.cache
def reserved_env() -> dict[str, tuple[str, ...]]:
    """Per profile: every variable name the builders set in any container (HF_TOKEN apart: see below)."""
    out: dict[str, tuple[str, ...]] = {}
    for profile in PROFILES:
        names: set[str] = set()
        for job in shapes(profile):
            for pod in desired(job, ssh_keys=SHAPE_KEYS).pods:
                for ctr in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
                    names.update(e["name"] for e in ctr.get("env", []))
        out[profile] = tuple(sorted(n for n in names if not n.startswith(RESERVED_PREFIX)))
    return out


def reserved_names(spec: dict[str, Any]) -> set[str]:
    """The exact names spec.env may not set for this spec (besides every FTJOB_* name)."""
    names = set(reserved_env().get(str((spec.get("hardware") or {}).get("profile", "")), ())) | set(DEVICE_ENV)
    if spec.get("hfTokenSecretRef") is not None:
        names.add("HF_TOKEN")
    return names


def prefix_produces(prefix: str, spec: dict[str, Any]) -> list[str]:
    """The reserved names (or `FTJOB_*`) that envFrom's `prefix` followed by some key could make, sorted."""
    if not prefix:
        return []
    out = sorted(n for n in reserved_names(spec) if len(n) > len(prefix) and n.startswith(prefix))
    if prefix.startswith(RESERVED_PREFIX) or RESERVED_PREFIX.startswith(prefix):
        out.insert(0, RESERVED_PREFIX + "*")
    return out


def _cel_map(m: dict[str, tuple[str, ...]]) -> str:
    return "{" + ", ".join(f"'{k}': [" + ", ".join(f"'{v}'" for v in vs) + "]" for k, vs in m.items()) + "}"


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in items) + "]"


def reserved_env_rule() -> Rule:
    """spec.env may not set what the operator sets, nor a device-visibility variable. HF_TOKEN is the operator's
    only with hfTokenSecretRef; without it, a user's own HF_TOKEN (e.g. from a secretKeyRef) is fine."""
    table = reserved_env()
    union = sorted(set().union(*table.values()))

    def check(spec: dict[str, Any]) -> bool:
        reserved = reserved_names(spec)
        return not any(
            str(e.get("name", "")).startswith(RESERVED_PREFIX) or e.get("name") in reserved
            for e in spec.get("env") or []
        )

    return Rule(
        "env-not-reserved",
        "spec",
        f"!has(self.env) || self.env.all(e, !e.name.startsWith('{RESERVED_PREFIX}') && "
        f"!(e.name in {_cel_map(table)}[self.hardware.profile]) && !(e.name in {_cel_list(DEVICE_ENV)}) && "
        "!(has(self.hfTokenSecretRef) && e.name == 'HF_TOKEN'))",
        ".env",
        f"spec.env may not set variables the operator sets: {RESERVED_PREFIX}* and, depending on the profile, "
        f"{', '.join(union)} (plus HF_TOKEN with spec.hfTokenSecretRef), nor the device-visibility variables "
        f"{', '.join(DEVICE_ENV)} (the pods see the devices they request in spec.hardware.resources); remove them "
        "(thread counts follow spec.hardware.resources, the model token spec.hfTokenSecretRef)",
        check,
    )


def env_from_prefix_rule() -> Rule:
    """An envFrom prefix may not be the start of a reserved name (nor of FTJOB_*, nor extend it)."""
    table = reserved_env()

    def check(spec: dict[str, Any]) -> bool:
        return not any(prefix_produces(str(e.get("prefix") or ""), spec) for e in spec.get("envFrom") or [])

    # n.startsWith(p) && size(n) > size(p): some non-empty key completes the prefix to n.
    produces = "(size(n) > size(e.prefix) && n.startsWith(e.prefix))"
    return Rule(
        "env-from-prefix-not-reserved",
        "spec",
        "!has(self.envFrom) || self.envFrom.all(e, !has(e.prefix) || e.prefix == '' || ("
        f"!e.prefix.startsWith('{RESERVED_PREFIX}') && !'{RESERVED_PREFIX}'.startsWith(e.prefix) && "
        f"!{_cel_map(table)}[self.hardware.profile].exists(n, {produces}) && "
        f"!{_cel_list(DEVICE_ENV)}.exists(n, {produces}) && "
        "!(has(self.hfTokenSecretRef) && 'HF_TOKEN'.startsWith(e.prefix) && e.prefix != 'HF_TOKEN')))",
        ".envFrom",
        "a spec.envFrom prefix followed by a key could make a variable the operator reserves (the FTJOB_* contract, "
        "the profile's variables listed under spec.env, the device-visibility variables); a name the container "
        "does not set itself is taken from envFrom, e.g. prefix FTJOB_ and key MODE would set FTJOB_MODE: choose a "
        "prefix that no reserved name starts with (e.g. APP_), or none",
        check,
    )
