"""From a validated spec and its profile to the job's shape: launcher, ranks, per-pod resources, threads.

Everything here comes from the profile's data and the spec, never from the machine the code runs on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import profiles
from ..api.formats import parse_quantity
from ..profiles import InstanceType, Profile, Stack


@dataclass(frozen=True)
class Layout:
    profile: Profile
    stack: Stack  # spec.hardware.stack, else the profile's default: image, runtime backend, cache, its env
    instance: InstanceType | None
    launcher: str  # torchrun | mpi
    nodes: int
    procs_per_node: int
    requests: dict[str, str]
    limits: dict[str, str]
    efa: bool  # pods request EFA interfaces (multi-node on an EFA instance)
    mpi_implementation: str | None
    cpu_per_pod: float | None  # effective CPUs of a rank pod, for thread math
    # Each rank pod is sized to take its whole instance (pods.scheduling then keeps two of them off one node).
    whole_node: bool = False

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def parse_cpu(q: str) -> float:
    """Kubernetes CPU quantity to cores ('8', '7500m', '0.5', '2k'); admission has checked it is a quantity."""
    return float(parse_quantity(str(q)))


def _procs(spec_hw: dict[str, Any], spec: dict[str, Any], p: Profile, inst: InstanceType | None) -> int:
    if "procsPerNode" in spec_hw:
        return int(spec_hw["procsPerNode"])
    slots = (spec.get("mpi") or {}).get("slotsPerNode")
    if slots:
        return int(slots)
    if inst is None:
        return 1
    if p.procs_per in ("core", "device"):
        return inst.cores
    if p.procs_per == "socket":
        return inst.sockets
    return 1


def _share(p: Profile, inst: InstanceType, procs: int) -> float:
    """The part of the instance one pod takes: its devices' share where processes follow devices, else all of it
    (one per socket, or one per pod, is sized to the whole machine)."""
    return procs / inst.cores if p.procs_per in ("core", "device") and inst.cores else 1.0


def _sized_resources(p: Profile, inst: InstanceType, procs: int, guaranteed: bool) -> dict[str, str]:
    """CPU and memory for one pod: the instance minus the system's share, in proportion to the devices used."""
    share = _share(p, inst, procs)
    vcpus = (inst.vcpus - p.reserved_vcpus) * share
    if guaranteed and p.threads:
        # Whole cores for every rank, so the static CPU manager can give each rank its own physical cores.
        unit = p.threads.threads_per_core * procs
        cpus = max(unit, int(vcpus // unit) * unit)
    else:
        cpus = max(1, int(vcpus))
    mem_gib = max(1, int(inst.memory_gib * p.memory_fraction * share))
    return {"cpu": str(cpus), "memory": f"{mem_gib}Gi"}


def device_limits(p: Profile, inst: InstanceType | None, procs: int) -> dict[str, int]:
    """The accelerator devices a pod of `procs` processes requests: one GPU per process (nvidia); on Trainium
    the NeuronCores, or the whole devices that hold them (what the Neuron scheduler places). spec.hardware's
    own device limits must agree (builders/devices.py)."""
    if p.procs_per == "core" and p.device_resource and p.core_resource and inst is not None:
        if procs < inst.cores_per_device:
            return {p.core_resource: procs}
        return {p.device_resource: math.ceil(procs / inst.cores_per_device)}
    if p.procs_per == "device" and p.device_resource:
        return {p.device_resource: procs}
    return {}


def procs_per_node(spec: dict[str, Any]) -> int:
    """Training processes per pod: spec.hardware.procsPerNode, else spec.mpi.slotsPerNode, else the profile's
    derivation from the instance type."""
    hw = spec["hardware"]
    p = profiles.get(hw["profile"])
    return _procs(hw, spec, p, p.instance(hw.get("instanceType")))


def launcher_of(spec: dict[str, Any]) -> str:
    """spec.launcher, else the profile's default (torchrun; mpi on xeon-amx)."""
    return str(spec.get("launcher") or profiles.get(spec["hardware"]["profile"]).default_launcher)


def resolve(job: dict[str, Any]) -> Layout:
    """The job's shape. `job` must have passed admission.validate (defaults applied)."""
    spec = job["spec"]
    hw = spec["hardware"]
    p = profiles.get(hw["profile"])
    inst = p.instance(hw.get("instanceType"))
    launcher = launcher_of(spec)
    nodes = int(hw.get("nodes", 1))
    procs = _procs(hw, spec, p, inst)

    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if inst is not None:
        requests.update(_sized_resources(p, inst, procs, p.guaranteed_qos))
    else:
        requests.update(p.default_resources)
    limits.update({k: str(v) for k, v in device_limits(p, inst, procs).items()})
    efa = bool(p.efa and inst is not None and inst.efa > 0 and nodes > 1)
    if efa and p.efa and inst is not None:
        limits[p.efa.resource] = str(inst.efa)
        if p.efa.hugepages_2mi:
            limits["hugepages-2Mi"] = p.efa.hugepages_2mi

    user = hw.get("resources") or {}
    # int-or-string in the spec (`cpu: 2`); always strings in the pods, as the API server returns them.
    requests.update({k: str(v) for k, v in (user.get("requests") or {}).items()})
    limits.update({k: str(v) for k, v in (user.get("limits") or {}).items()})
    for k in ("cpu", "memory"):  # a derived request never exceeds the user's limit (the pod would be refused)
        if (
            k in limits
            and k in requests
            and k not in (user.get("requests") or {})
            and parse_quantity(requests[k]) > parse_quantity(limits[k])
        ):
            requests[k] = limits[k]
    if p.guaranteed_qos:
        # Guaranteed QoS: limits equal requests for cpu and memory.
        for k in ("cpu", "memory"):
            if k in requests and k not in limits:
                limits[k] = requests[k]
    for k, v in limits.items():  # extended resources and hugepages must be requested as limited
        if k not in ("cpu", "memory"):
            requests[k] = v
    if "memory" in limits and "memory" not in requests:
        requests["memory"] = limits["memory"]

    cpu_q = limits.get("cpu") or requests.get("cpu")
    mpi = spec.get("mpi") or {}
    return Layout(
        profile=p,
        stack=p.stack(hw.get("stack")),
        instance=inst,
        launcher=launcher,
        nodes=nodes,
        procs_per_node=procs,
        requests=dict(sorted(requests.items())),
        limits=dict(sorted(limits.items())),
        efa=efa,
        mpi_implementation=(mpi.get("implementation") or p.default_mpi) if launcher == "mpi" else None,
        cpu_per_pod=parse_cpu(cpu_q) if cpu_q else None,
        # From the instance and the process count, not from resources the user set: a trn1.32xlarge pod with
        # all 32 NeuronCores still owns its node when its memory request is lowered.
        whole_node=inst is not None and _share(p, inst, procs) >= 1.0,
    )
