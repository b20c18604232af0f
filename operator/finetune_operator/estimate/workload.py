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
from ..profiles import DeviceKind
from .flops import Lora, ModelShape, flops_per_sample, trained_params


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
    shape: ModelShape
    lora: Lora | None
    tokens_per_sample: float
    batch_per_device: int
    grad_accum: int = 1
    dataset: str | None = None

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def flops_per_sample(self) -> float:
        return flops_per_sample(self.shape, self.tokens_per_sample, self.lora)

    @property
    def trained_params(self) -> int:
        return trained_params(self.shape, self.lora)

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
