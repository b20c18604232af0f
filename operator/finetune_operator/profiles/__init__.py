"""Hardware profiles: versioned YAML data (one file per profile) and the rules derived from it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from ..api.formats import STACK_NAME, re2_search
from ..api.rules import Rule
from ..api.schema import HARDWARE, PRECISIONS, PROFILES

STACK_NAME_MAX = HARDWARE["properties"]["stack"]["maxLength"]  # what spec.hardware.stack can hold


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gib: int
    devices: int = 0  # Neuron devices or GPUs
    cores_per_device: int = 1  # NeuronCores per device
    device_memory_gib: int = 0
    sockets: int = 1
    efa: int = 0

    @property
    def cores(self) -> int:
        """Accelerator cores (NeuronCores) or GPUs exposed to pods."""
        return self.devices * self.cores_per_device


@dataclass(frozen=True)
class Efa:
    resource: str
    env: dict[str, str]
    hugepages_2mi: str | None = None


@dataclass(frozen=True)
class Threads:
    threads_per_core: int
    tcmalloc: str | None = None


@dataclass(frozen=True)
class CompileCache:
    """A stack's compile cache: the variable the operator sets, and where."""

    variable: str  # e.g. NEURON_COMPILE_CACHE_URL; the runtime backend's compile_cache_var names the same
    directory: str  # under the pods' cache mount (constants.CACHE_DIR), when spec.compileCache.url is not given
    url: bool  # spec.compileCache.url (s3://... or an absolute path) may take the directory's place


@dataclass(frozen=True)
class Stack:
    """One software stack of a profile (spec.hardware.stack): what its pods run and how."""

    name: str
    description: str
    backend: str  # the runtime backend (FTJOB_BACKEND): an entry of runtime/finetune_runtime/backends.py
    image_repository: str  # the default image's repository; registry and tag: builders.images
    env: dict[str, str] = field(default_factory=dict)  # over the profile's env
    bf16_env: dict[str, str] = field(default_factory=dict)  # added under training.precision bf16
    ccl_worker_count: int = 0  # oneCCL progress threads per rank, taken from the rank's cores (builders/env.py)
    compile_cache: CompileCache | None = None  # None: the runtime keeps torch.compile's cache itself


@dataclass(frozen=True)
class Peak:
    """Dense peak of one device at one training precision, and the public number it comes from."""

    tflops: float | None  # None: no public number (the reason is in source)
    source: str


@dataclass(frozen=True)
class DeviceKind:
    """What one rank's share of the hardware is (a NeuronCore, a GPU, a CPU core or vCPU) and its peaks."""

    name: str
    peaks: dict[str, Peak]  # by training precision (api.schema.PRECISIONS)

    def peak_flops(self, precision: str) -> float | None:
        """FLOP/s, or None where no public peak exists."""
        tf = self.peaks[precision].tflops
        return None if tf is None else tf * 1e12


@dataclass(frozen=True)
class Throughput:
    """The `throughput:` block of a profile: read by `ftjob estimate` (estimate/) for peaks and MFU."""

    unit: str  # what a device is: NeuronCore, GPU, core (physical, Xeon) or vCPU
    devices: dict[str, DeviceKind]
    default_device: str | None
    instance_devices: dict[str, str]  # instance type -> device kind, where not the default

    def device_for(self, instance_type: str | None) -> DeviceKind | None:
        name = self.instance_devices.get(instance_type or "") or self.default_device
        return self.devices.get(name) if name else None


@dataclass(frozen=True)
class Profile:
    name: str
    revision: str
    description: str
    backend: str  # the device family (neuron, xeon, cpu, nvidia); each stack names its runtime backend
    default_launcher: str
    stacks: dict[str, Stack]  # spec.hardware.stack -> Stack, the default first
    default_stack: str
    procs_per: str  # core | socket | device | one
    run_as_user: int
    reserved_vcpus: int
    memory_fraction: float
    instance_types: dict[str, InstanceType]
    default_instance_type: str | None = None
    device_resource: str | None = None
    core_resource: str | None = None
    placeable_device_counts: tuple[int, ...] = ()
    multi_node_needs_efa: bool = False
    guaranteed_qos: bool = False
    tolerations: tuple[dict[str, Any], ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    multi_node_env: dict[str, str] = field(default_factory=dict)
    efa: Efa | None = None
    threads: Threads | None = None
    default_resources: dict[str, str] = field(default_factory=dict)
    default_mpi: str = "mpich"  # MPI implementation in the profile's image
    throughput: Throughput | None = None

    def stack(self, name: str | None) -> Stack:
        """spec.hardware.stack, else the profile's default (admission refused a stack the profile lacks)."""
        return self.stacks[name or self.default_stack]

    @property
    def image_repository(self) -> str:
        """The default stack's image repository: the profile's default image."""
        return self.stacks[self.default_stack].image_repository

    def instance(self, name: str | None) -> InstanceType | None:
        key = name or self.default_instance_type
        return self.instance_types[key] if key else None

    def max_procs(self, inst: InstanceType) -> int:
        """Most processes one pod of this instance type can hold."""
        if self.procs_per in ("core", "device"):
            return inst.cores
        return max(1, inst.vcpus // (self.threads.threads_per_core if self.threads else 1))

    def placeable_procs(self, inst: InstanceType) -> list[int]:
        """Process counts per pod the Neuron scheduler can place (empty: no restriction)."""
        if self.procs_per != "core" or not self.placeable_device_counts:
            return []
        within_one = list(range(1, inst.cores_per_device + 1))
        whole = [d * inst.cores_per_device for d in self.placeable_device_counts if 1 < d <= inst.devices]
        return within_one + whole


def _instance(name: str, raw: dict[str, Any]) -> InstanceType:
    return InstanceType(
        name=name,
        vcpus=int(raw["vcpus"]),
        memory_gib=int(raw["memoryGiB"]),
        devices=int(raw.get("devices", 0)),
        cores_per_device=int(raw.get("coresPerDevice", 1)),
        device_memory_gib=int(raw.get("deviceMemoryGiB", 0)),
        sockets=int(raw.get("sockets", 1)),
        efa=int(raw.get("efa", 0)),
    )


def _throughput(profile: str, raw: Any, instance_types: set[str]) -> Throughput | None:
    """Validate and read the `throughput:` block; a mistake names the profile file and the key."""
    if raw is None:
        return None
    where = f"profiles/{profile}.yaml throughput"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping")
    unit = raw.get("unit")
    if not isinstance(unit, str) or not unit:
        raise ValueError(f"{where}.unit: name what one device is (NeuronCore, GPU, core, vCPU)")
    devices: dict[str, DeviceKind] = {}
    for name, dev in (raw.get("devices") or {}).items():
        if not isinstance(dev, dict):
            raise ValueError(f"{where}.devices.{name}: expected a mapping of precision to peakTflops and source")
        peaks: dict[str, Peak] = {}
        for precision in PRECISIONS:
            entry = dev.get(precision)
            if not isinstance(entry, dict) or "peakTflops" not in entry:
                raise ValueError(f"{where}.devices.{name}.{precision}: give peakTflops (a number, or null) and source")
            tf = entry["peakTflops"]
            if tf is not None and (isinstance(tf, bool) or not isinstance(tf, int | float) or tf <= 0):
                raise ValueError(f"{where}.devices.{name}.{precision}.peakTflops: a positive number, or null")
            source = entry.get("source")
            if not isinstance(source, str) or not source.strip():
                raise ValueError(
                    f"{where}.devices.{name}.{precision}.source: say where the number comes from (a public URL "
                    "and the arithmetic), or why there is none"
                )
            peaks[precision] = Peak(None if tf is None else float(tf), " ".join(source.split()))
        unknown = set(dev) - set(PRECISIONS)
        if unknown:
            raise ValueError(f"{where}.devices.{name}: unknown keys {sorted(unknown)}; one per precision {PRECISIONS}")
        devices[str(name)] = DeviceKind(str(name), peaks)
    if not devices:
        raise ValueError(f"{where}.devices: at least one device kind")
    default = raw.get("defaultDevice")
    if default is not None and default not in devices:
        raise ValueError(f"{where}.defaultDevice: {default!r} is not one of devices {sorted(devices)}")
    by_type = {str(k): str(v) for k, v in (raw.get("instanceDevices") or {}).items()}
    for itype, dev_name in by_type.items():
        if itype not in instance_types:
            raise ValueError(f"{where}.instanceDevices.{itype}: not an instance type of this profile")
        if dev_name not in devices:
            raise ValueError(f"{where}.instanceDevices.{itype}: {dev_name!r} is not one of devices {sorted(devices)}")
    if default is None:
        missing = sorted(instance_types - set(by_type))
        if missing:
            raise ValueError(f"{where}: no defaultDevice and no instanceDevices entry for {missing}")
    return Throughput(unit, devices, default, by_type)


_STACK_KEYS = {"description", "backend", "imageRepository", "env", "bf16Env", "cclWorkerCount", "compileCache"}


def _stacks(profile: str, raw: Any, default: Any) -> dict[str, Stack]:
    """Validate and read the `stacks:` block; a mistake names the profile file and the key."""
    where = f"profiles/{profile}.yaml stacks"
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{where}: at least one stack, by name (spec.hardware.stack)")
    out: dict[str, Stack] = {}
    for name, s in raw.items():
        if not isinstance(s, dict):
            raise ValueError(f"{where}.{name}: expected a mapping with backend, imageRepository and description")
        if not re2_search(STACK_NAME, str(name)) or len(str(name)) > STACK_NAME_MAX:
            raise ValueError(
                f"{where}.{name}: a stack name is lower-case letters, digits and '-' (spec.hardware.stack)"
            )
        unknown = set(s) - _STACK_KEYS
        if unknown:
            raise ValueError(f"{where}.{name}: unknown keys {sorted(unknown)}; known: {sorted(_STACK_KEYS)}")
        missing = [k for k in ("description", "backend", "imageRepository") if not s.get(k)]
        if missing:
            raise ValueError(f"{where}.{name}: give {', '.join(missing)}")
        cache = s.get("compileCache")
        out[str(name)] = Stack(
            name=str(name),
            description=str(s["description"]),
            backend=str(s["backend"]),
            image_repository=str(s["imageRepository"]),
            env={k: str(v) for k, v in (s.get("env") or {}).items()},
            bf16_env={k: str(v) for k, v in (s.get("bf16Env") or {}).items()},
            ccl_worker_count=int(s.get("cclWorkerCount", 0)),
            compile_cache=CompileCache(str(cache["variable"]), str(cache["directory"]), bool(cache["url"]))
            if cache
            else None,
        )
    if default not in out:
        raise ValueError(f"profiles/{profile}.yaml defaultStack: {default!r} is not one of stacks {sorted(out)}")
    return {default: out[default], **out}


def _parse(raw: dict[str, Any]) -> Profile:
    efa = raw.get("efa")
    threads = raw.get("threads")
    return Profile(
        name=raw["name"],
        revision=str(raw["revision"]),
        description=raw["description"],
        backend=raw["backend"],
        default_launcher=raw["defaultLauncher"],
        stacks=_stacks(raw["name"], raw.get("stacks"), raw.get("defaultStack")),
        default_stack=str(raw.get("defaultStack")),
        procs_per=raw["procsPer"],
        run_as_user=int(raw["runAsUser"]),
        reserved_vcpus=int(raw["reservedVcpus"]),
        memory_fraction=float(raw["memoryFraction"]),
        instance_types={k: _instance(k, v) for k, v in (raw.get("instanceTypes") or {}).items()},
        default_instance_type=raw.get("defaultInstanceType"),
        device_resource=raw.get("deviceResource"),
        core_resource=raw.get("coreResource"),
        placeable_device_counts=tuple(raw.get("placeableDeviceCounts") or ()),
        multi_node_needs_efa=bool(raw.get("multiNodeNeedsEfa", False)),
        guaranteed_qos=bool(raw.get("guaranteedQos", False)),
        tolerations=tuple(raw.get("tolerations") or ()),
        node_selector={k: str(v) for k, v in (raw.get("nodeSelector") or {}).items()},
        env={k: str(v) for k, v in (raw.get("env") or {}).items()},
        multi_node_env={k: str(v) for k, v in (raw.get("multiNodeEnv") or {}).items()},
        efa=Efa(efa["resource"], {k: str(v) for k, v in (efa.get("env") or {}).items()}, efa.get("hugepages2Mi"))
        if efa
        else None,
        threads=Threads(int(threads["threadsPerCore"]), threads.get("tcmalloc")) if threads else None,
        default_resources={k: str(v) for k, v in (raw.get("defaultResources") or {}).items()},
        default_mpi=raw.get("defaultMpi", "mpich"),
        throughput=_throughput(raw["name"], raw.get("throughput"), set(raw.get("instanceTypes") or {})),
    )


@functools.cache
def load_all() -> dict[str, Profile]:
    """Every profile shipped with the package, by name."""
    out: dict[str, Profile] = {}
    for name in PROFILES:
        text = resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
        out[name] = _parse(yaml.safe_load(text))
    return out


def get(name: str) -> Profile:
    return load_all()[name]


def default_mpi_profiles() -> tuple[str, ...]:
    return tuple(p.name for p in load_all().values() if p.default_launcher == "mpi")


def _cel_list(items: list[Any]) -> str:
    return "[" + ", ".join(f"'{i}'" if isinstance(i, str) else str(i) for i in items) + "]"


def _cel_map(m: dict[str, Any]) -> str:
    return "{" + ", ".join(f"'{k}': {v}" for k, v in m.items()) + "}"


def profile_rules() -> list[Rule]:
    """Rules generated from the profile data, so a new instance type needs no code change."""
    profiles = load_all()
    by_profile = {p.name: sorted(p.instance_types) for p in profiles.values()}
    max_procs = {f"{p.name}/{i.name}": p.max_procs(i) for p in profiles.values() for i in p.instance_types.values()}
    placeable = {
        f"{p.name}/{i.name}": p.placeable_procs(i)
        for p in profiles.values()
        for i in p.instance_types.values()
        if p.placeable_procs(i)
    }
    single_node_only = sorted(
        f"{p.name}/{i.name}"
        for p in profiles.values()
        for i in p.instance_types.values()
        if p.multi_node_needs_efa and i.efa == 0
    )
    defaults = {p.name: p.default_instance_type for p in profiles.values() if p.default_instance_type}
    stacks = {p.name: list(p.stacks) for p in profiles.values()}
    default_stacks = {p.name: p.default_stack for p in profiles.values()}
    # "profile/stack" of the stacks whose compile cache spec.compileCache.url may name (the XLA Neuron cache)
    url_caches = sorted(
        f"{p.name}/{s.name}"
        for p in profiles.values()
        for s in p.stacks.values()
        if s.compile_cache and s.compile_cache.url
    )

    def itype(h: dict[str, Any]) -> str | None:
        t = h.get("instanceType") or defaults.get(h.get("profile", ""))
        return f"{h.get('profile')}/{t}" if t else None

    # CEL: the effective instance type key "profile/type", with the profile's default when absent.
    key_cel = (
        "(has(self.instanceType) ? self.profile + '/' + self.instanceType : "
        f"(self.profile in {_cel_map({k: repr(v) for k, v in defaults.items()})} ? "
        f"self.profile + '/' + {_cel_map({k: repr(v) for k, v in defaults.items()})}[self.profile] : ''))"
    )
    table = "\n".join(f"  {p}: {', '.join(t)}" for p, t in by_profile.items())
    offered = "\n".join(
        f"  {p}: {', '.join(f'{s} (default)' if s == default_stacks[p] else s for s in names)}"
        for p, names in stacks.items()
    )

    def stack_key(spec: dict[str, Any]) -> str:
        hw = spec.get("hardware") or {}
        profile = str(hw.get("profile", ""))
        return f"{profile}/{hw.get('stack') or default_stacks.get(profile, '')}"

    # CEL: the effective "profile/stack", with the profile's default stack when spec.hardware.stack is absent.
    stack_key_cel = (
        "self.hardware.profile + '/' + (has(self.hardware.stack) ? self.hardware.stack : "
        f"{_cel_map({k: repr(v) for k, v in default_stacks.items()})}[self.hardware.profile])"
    )
    return [
        Rule(
            "stack-offered",
            "spec.hardware",
            f"!has(self.stack) || self.stack in {_cel_map({k: _cel_list(v) for k, v in stacks.items()})}[self.profile]",
            ".stack",
            "spec.hardware.stack is not a stack of this profile; use one of (or leave it out for the default):\n"
            + offered,
            lambda h: "stack" not in h or h["stack"] in stacks.get(h.get("profile", ""), []),
            describe=lambda h: (
                f"spec.hardware.stack: {h.get('profile')} offers "
                + ", ".join(stacks.get(h.get("profile", ""), []))
                + f", not {h.get('stack')!r}; set one of them or leave the field out for the default "
                f"({default_stacks.get(h.get('profile', ''))}). Each profile's stacks:\n" + offered
            ),
        ),
        Rule(
            "instance-type-known",
            "spec.hardware",
            "!has(self.instanceType) || self.instanceType in "
            f"{_cel_map({k: _cel_list(v) for k, v in by_profile.items()})}[self.profile]",
            ".instanceType",
            "spec.hardware.instanceType is not an instance type of this profile; use one of:\n" + table,
            lambda h: "instanceType" not in h or h["instanceType"] in by_profile.get(h.get("profile", ""), []),
        ),
        Rule(
            "procs-fit-instance",
            "spec.hardware",
            f"!has(self.procsPerNode) || !({key_cel} in {_cel_map(max_procs)}) || "
            f"self.procsPerNode <= {_cel_map(max_procs)}[{key_cel}]",
            ".procsPerNode",
            "spec.hardware.procsPerNode exceeds what one node of spec.hardware.instanceType holds (NeuronCores, "
            "GPUs or cores); lower it or pick a larger instance type",
            lambda h: (
                "procsPerNode" not in h or (itype(h) not in max_procs) or h["procsPerNode"] <= max_procs[str(itype(h))]
            ),
        ),
        Rule(
            "neuron-placeable",
            "spec.hardware",
            f"!has(self.procsPerNode) || !({key_cel} in {_cel_map({k: _cel_list(v) for k, v in placeable.items()})})"
            f" || self.procsPerNode in {_cel_map({k: _cel_list(v) for k, v in placeable.items()})}[{key_cel}]",
            ".procsPerNode",
            "the Neuron scheduler places only 1, 4, 8 or 16 trn1 devices per pod (or 1-2 NeuronCores of one device);"
            " set spec.hardware.procsPerNode to 1, 2, 8, 16 or 32",
            lambda h: (
                "procsPerNode" not in h or itype(h) not in placeable or h["procsPerNode"] in placeable[str(itype(h))]
            ),
        ),
        Rule(
            "multi-node-needs-efa",
            "spec.hardware",
            f"self.nodes == 1 || !({key_cel} in {_cel_list(single_node_only)})",
            ".nodes",
            "this instance type has no EFA, which Neuron collectives between nodes need; use nodes: 1 or an "
            "EFA instance type such as trn1.32xlarge",
            lambda h: h.get("nodes", 1) == 1 or itype(h) not in single_node_only,
        ),
        Rule(
            "cache-url-stack",
            "spec",
            f"!has(self.compileCache) || !has(self.compileCache.url) || {stack_key_cel} in {_cel_list(url_caches)}",
            ".compileCache.url",
            "spec.compileCache.url names the Neuron compile cache of the XLA stack (NEURON_COMPILE_CACHE_URL: s3:// "
            f"or a path), which only {', '.join(url_caches)} use; this profile and stack keep their compile cache in "
            "a directory: use spec.compileCache.claimName",
            lambda s: "url" not in (s.get("compileCache") or {}) or stack_key(s) in url_caches,
        ),
    ]
