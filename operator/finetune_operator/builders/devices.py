"""Device limits a user writes into spec.hardware.resources.limits must be the ones the job's processes need.

The operator derives a pod's accelerator request from its processes (layout.device_limits); a user limit replaces
it. One that disagrees either strands devices (8 GPUs for 1 process) or crowds processes onto fewer devices than
they were counted for (4 ranks on 1 GPU, or a NeuronCore request beside a whole-device one): admission refuses
it, naming the value that fits. The CEL twin is generated from the profiles' data, like profiles.profile_rules.
"""

from __future__ import annotations

from typing import Any

from .. import profiles
from ..api.formats import is_quantity, parse_quantity
from ..api.rules import Rule
from .layout import device_limits, procs_per_node

_FIELD = "spec.hardware.resources.limits"


def _cel_map(m: dict[str, Any]) -> str:
    return "{" + ", ".join(f"'{k}': {v}" for k, v in m.items()) + "}"


def mismatches(spec: dict[str, Any]) -> list[str]:
    """One sentence per device limit of spec.hardware.resources.limits that is not what the processes need."""
    hw = spec.get("hardware") or {}
    p = profiles.get(str(hw.get("profile")))
    names = [n for n in (p.device_resource, p.core_resource) if n]
    limits = (hw.get("resources") or {}).get("limits") or {}
    given = {k: limits[k] for k in names if k in limits}
    if not given:
        return []
    procs = procs_per_node(spec)
    want = device_limits(p, p.instance(hw.get("instanceType")), procs)
    out = []
    for name, value in given.items():
        text = str(value)
        if name in want and is_quantity(text) and parse_quantity(text) == want[name]:
            continue
        need = ", ".join(f"{k}: {v}" for k, v in want.items()) or "no device"
        fix = f"set it to {want[name]}" if name in want else f"remove it (and request {need})"
        out.append(
            f"{_FIELD}[{name}] is {text}, but {procs} process(es) per node (spec.hardware.procsPerNode, derived "
            f"when absent) on profile {p.name} need {need}: {fix}, or leave the device limits out (the operator "
            "derives them)"
        )
    return out


def device_limits_rule() -> Rule:
    """CEL: per profile with device resources, each device limit the user gives equals what the processes
    need (layout.device_limits, spelled from the same data)."""
    all_profiles = profiles.load_all()
    defaults = {p.name: repr(p.default_instance_type) for p in all_profiles.values() if p.default_instance_type}
    cores = {
        f"{p.name}/{i.name}": i.cores
        for p in all_profiles.values()
        if p.procs_per in ("core", "device")
        for i in p.instance_types.values()
    }
    per_device = {
        f"{p.name}/{i.name}": i.cores_per_device
        for p in all_profiles.values()
        if p.procs_per == "core"
        for i in p.instance_types.values()
    }
    hw = "self.hardware"
    key = (
        f"(has({hw}.instanceType) ? {hw}.profile + '/' + {hw}.instanceType : "
        f"({hw}.profile in {_cel_map(defaults)} ? {hw}.profile + '/' + {_cel_map(defaults)}[{hw}.profile] : ''))"
    )
    procs = (
        f"(has({hw}.procsPerNode) ? {hw}.procsPerNode : ((has(self.mpi) && has(self.mpi.slotsPerNode)) ? "
        f"self.mpi.slotsPerNode : ({key} in {_cel_map(cores)} ? {_cel_map(cores)}[{key}] : 1)))"
    )
    lim = f"{hw}.resources.limits"

    def eq(name: str, n: str) -> str:
        v = f"string({lim}['{name}'])"
        return f"(isQuantity({v}) && quantity({v}).isInteger() && quantity({v}).asInteger() == {n})"

    def given(name: str) -> str:
        return f"!('{name}' in {lim})"

    clauses = []
    for p in all_profiles.values():
        if p.procs_per == "device" and p.device_resource:
            clauses.append(
                f"{hw}.profile != '{p.name}' || {given(p.device_resource)} || {eq(p.device_resource, procs)}"
            )
        elif p.procs_per == "core" and p.device_resource and p.core_resource:
            cpd = f"{_cel_map(per_device)}[{key}]"
            known = f"{key} in {_cel_map(per_device)}"
            clauses.append(
                f"{hw}.profile != '{p.name}' || !({known}) || (({given(p.core_resource)} || ({procs} < {cpd} && "
                f"{eq(p.core_resource, procs)})) && ({given(p.device_resource)} || ({procs} >= {cpd} && "
                f"{eq(p.device_resource, f'({procs} + {cpd} - 1) / {cpd}')})))"
            )
    cel = f"!has({hw}.resources) || !has({lim}) || (" + ") && (".join(clauses) + ")"
    names = sorted({n for p in all_profiles.values() for n in (p.device_resource, p.core_resource) if n})
    return Rule(
        "device-limits-match-procs",
        "spec",
        cel,
        ".hardware.resources.limits",
        f"device limits in {_FIELD} ({', '.join(names)}) must be what the processes need: one nvidia.com/gpu per "
        "process (spec.hardware.procsPerNode); on Trainium one aws.amazon.com/neuroncore per process below one "
        "device's cores, else the whole aws.amazon.com/neuron devices holding them; set the value that fits, or "
        "leave the device limits out (the operator derives them)",
        lambda s: not mismatches(s),
        describe=lambda s: "; ".join(mismatches(s)),
    )
