"""What one training run does, in the terms the throughput model needs, and the data tables it reads.

A Workload comes from a job spec (estimate/predict.py) or from a calibration record (estimate/calibration.py): the
same description on both sides, so a record predicts exactly the work it measured.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .. import profiles
from ..builders.env import thread_env
from ..builders.layout import Layout
from ..profiles import DeviceKind
from .flops import Counts, Lora, ModelShape, flops_per_sample, flops_per_token, trained_params


@dataclass(frozen=True)
class Counted:
    """A model's numbers as a run counted them on the loaded model (the runtime's progress lines, kept in a
    FineTuneJob's status.throughput.model): what a record uses where no config.json of its model is at hand."""

    counts: Counts
    trained_params: int


@dataclass(frozen=True)
class Workload:
    profile: str
    device: str  # device kind of the profile's throughput data
    instance_type: str | None
    nodes: int
    procs_per_node: int
    devices_per_rank: float  # NeuronCores or GPUs: 1; CPUs: the cores (xeon-amx) or vCPUs (cpu) a rank computes on
    precision: str
    compile: bool
    model: str
    shape: ModelShape | None  # from the model's config; None only with `counted`
    lora: Lora | None
    tokens_per_sample: float
    batch_per_device: int
    grad_accum: int = 1
    dataset: str | None = None
    counted: Counted | None = None

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def flops_per_sample(self) -> float:
        if self.shape is not None:
            return flops_per_sample(self.shape, self.tokens_per_sample, self.lora)
        assert self.counted is not None
        return flops_per_token(self.counted.counts, self.tokens_per_sample) * self.tokens_per_sample

    @property
    def trained_params(self) -> int:
        if self.shape is not None:
            return trained_params(self.shape, self.lora)
        assert self.counted is not None
        return self.counted.trained_params

    @property
    def device_kind(self) -> DeviceKind:
        tp = profiles.get(self.profile).throughput
        if tp is None or self.device not in tp.devices:
            raise ValueError(f"profile {self.profile} has no throughput data for device {self.device!r}")
        return tp.devices[self.device]

    @property
    def rank_peak(self) -> float | None:
        """Peak FLOP/s of one rank's share (None where no public peak exists)."""
        per_device = self.device_kind.peak_flops(self.precision)
        return None if per_device is None else per_device * self.devices_per_rank

    @property
    def key(self) -> tuple[str, str, bool]:
        """Efficiency is calibrated per (profile, precision, compile)."""
        return (self.profile, self.precision, self.compile)


def _data(name: str) -> Any:
    return yaml.safe_load(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))


@functools.cache
def hub_models() -> dict[str, dict[str, Any]]:
    """models.yaml: {model id: {source, config}}."""
    out: dict[str, dict[str, Any]] = _data("models.yaml")
    return out


def model_shape(model: str, inline: dict[str, Any] | None = None, cwd: Path | None = None) -> tuple[ModelShape, str]:
    """The model's shape and where it came from: an inline config, a local directory's config.json, models.yaml."""
    if inline:
        return ModelShape.from_config(inline), "the config given"
    local = Path(model) if Path(model).is_absolute() else (cwd or Path.cwd()) / model
    if (local / "config.json").is_file():
        cfg = json.loads((local / "config.json").read_text(encoding="utf-8"))
        return ModelShape.from_config(cfg), f"{model}/config.json"
    known = hub_models().get(model)
    if known:
        return ModelShape.from_config(known["config"]), str(known["source"])
    raise ValueError(
        f"no config for model {model!r}: it is not a local directory with a config.json, nor in the table of hub "
        "models (estimate/models.yaml); pass --model-config with its config.json"
    )


def devices_per_rank_default(profile: str) -> float | None:
    """1 where a rank drives one NeuronCore or GPU; None where it depends on the pod's CPUs (cpu, xeon-amx)."""
    p = profiles.get(profile)
    return 1.0 if p.procs_per in ("core", "device") else None


def rank_share(layout: Layout) -> tuple[DeviceKind | None, float]:
    """The device kind of the job's hardware (None where its profile has no throughput data for it) and how many
    of those devices one rank computes on: 1 NeuronCore or GPU; on CPUs, the threads the pod's env gives a rank
    (OMP_NUM_THREADS: cores on xeon-amx, vCPUs on cpu), else its share of the pod's CPUs. Read by `ftjob estimate`
    and by the operator's MFU (throughput.py), so that both count a job's devices alike."""
    p = layout.profile
    tp = p.throughput
    kind = tp.device_for(layout.instance.name if layout.instance else None) if tp else None
    if p.procs_per in ("core", "device"):
        return kind, 1.0
    threads = thread_env(layout).get("OMP_NUM_THREADS")
    return kind, float(threads) if threads else max(1.0, (layout.cpu_per_pod or 1.0) / layout.procs_per_node)
