"""The environment variables the operator sets, which spec.env may not override: derived by rendering every shape
of job the builders know (each profile, launcher, single and multi node, bf16, precompile, S3 output, own
command), so a variable a builder starts setting is reserved without a list to keep in step.

spec.env wins over the derived values in the pods (env.py), so overriding MASTER_ADDR, the FTJOB_* contract or a
profile's LD_PRELOAD would silently break rendezvous or the runtime; admission rejects it instead.
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
_KEYS = SshKeys("k", "k.pub", "h", "h.pub")


def _shapes(profile: str) -> list[dict[str, Any]]:
    """Jobs of every shape on `profile`: what differs between them is which variables the builders set."""
    p = profiles.get(profile)
    multi = [i for i in p.instance_types.values() if i.efa] or list(p.instance_types.values())
    instances = [None, *(i.name for i in multi[:1])]
    jobs = []
    for inst, launcher, nodes, own in itertools.product(instances, ("torchrun", "mpi"), (1, 2), (False, True)):
        spec: dict[str, Any] = {"hardware": {"profile": profile, "nodes": nodes}, "launcher": launcher}
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
        for job in _shapes(profile):
            for pod in desired(job, ssh_keys=_KEYS).pods:
                for ctr in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
                    names.update(e["name"] for e in ctr.get("env", []))
        out[profile] = tuple(sorted(n for n in names if not n.startswith(RESERVED_PREFIX)))
    return out


def _cel_map(m: dict[str, tuple[str, ...]]) -> str:
    return "{" + ", ".join(f"'{k}': [" + ", ".join(f"'{v}'" for v in vs) + "]" for k, vs in m.items()) + "}"


def reserved_env_rule() -> Rule:
    """spec.env may not set what the operator sets. HF_TOKEN is the operator's only with hfTokenSecretRef;
    without it, a user's own HF_TOKEN (e.g. from a secretKeyRef) is fine."""
    table = reserved_env()
    union = sorted(set().union(*table.values()))

    def check(spec: dict[str, Any]) -> bool:
        reserved = set(table.get(spec.get("hardware", {}).get("profile", ""), ()))
        if spec.get("hfTokenSecretRef") is not None:
            reserved.add("HF_TOKEN")
        return not any(
            str(e.get("name", "")).startswith(RESERVED_PREFIX) or e.get("name") in reserved
            for e in spec.get("env") or []
        )

    return Rule(
        "env-not-reserved",
        "spec",
        f"!has(self.env) || self.env.all(e, !e.name.startsWith('{RESERVED_PREFIX}') && "
        f"!(e.name in {_cel_map(table)}[self.hardware.profile]) && "
        "!(has(self.hfTokenSecretRef) && e.name == 'HF_TOKEN'))",
        ".env",
        f"spec.env may not set variables the operator sets: {RESERVED_PREFIX}* and, depending on the profile, "
        f"{', '.join(union)} (plus HF_TOKEN with spec.hfTokenSecretRef); remove them (thread counts follow "
        "spec.hardware.resources, the model token spec.hfTokenSecretRef)",
        check,
    )
