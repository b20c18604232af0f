"""Device code paths chosen by `FTJOB_BACKEND`: neuron, xeon, cpu, nvidia.

Vendor stacks are not dependencies of this package: the per-hardware images bring them. They are imported
lazily, and a missing one fails with a message that names the image to use.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

BACKENDS = ("neuron", "xeon", "cpu", "nvidia")
# The image that carries each backend's stack, for error messages: images/<backend>/ builds it as
# finetune-operator/<backend> (images/scripts/build.sh), the repository the operator's profiles of that backend
# name (tests/unit/test_profile_images.py checks both).
IMAGES = {backend: f"finetune-operator/{backend}" for backend in BACKENDS}


class MissingStackError(RuntimeError):
    """The backend's vendor stack is not installed in this image."""


def _default_importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class BackendPlan:
    """What the Trainer and the model need for one backend (pure data; unit-tested per backend)."""

    name: str
    ddp_backend: str | None  # TrainingArguments.ddp_backend
    use_cpu: bool  # TrainingArguments.use_cpu
    trainer_bf16: bool  # TrainingArguments.bf16 (autocast): xeon/nvidia
    cast_model_bf16: bool  # model.to(torch.bfloat16): Neuron's current bf16 guidance
    ipex: bool  # run ipex.optimize on model + optimizer
    env: dict[str, str] = field(default_factory=dict)  # variables to export before torch.distributed starts
    notes: list[str] = field(default_factory=list)


def plan_backend(
    backend: str,
    precision: str,
    importable: Callable[[str], bool] = _default_importable,
    cuda_available: Callable[[], bool] | None = None,
) -> BackendPlan:
    """Choose the code path; raise MissingStackError when the backend's stack is absent."""
    bf16 = precision == "bf16"
    if backend == "cpu":
        return BackendPlan("cpu", "gloo", True, bf16, False, False)
    if backend == "xeon":
        ipex = importable("intel_extension_for_pytorch")
        ccl = importable("oneccl_bindings_for_pytorch")
        notes = []
        if not ipex:
            notes.append(
                "intel_extension_for_pytorch not installed: plain torch (bf16 autocast still uses AMX through oneDNN)"
            )
        if not ccl:
            notes.append("oneccl_bindings_for_pytorch not installed: gloo instead of ccl")
        return BackendPlan("xeon", "ccl" if ccl else "gloo", True, bf16, False, ipex, notes=notes)
    if backend == "nvidia":
        ok = cuda_available() if cuda_available else _cuda_available()
        if not ok:
            raise MissingStackError(
                f"FTJOB_BACKEND=nvidia but torch sees no CUDA device; use the {IMAGES['nvidia']} image on a node "
                "with nvidia.com/gpu"
            )
        return BackendPlan("nvidia", "nccl", False, bf16, False, False)
    if backend == "neuron":
        if not importable("torch_xla"):
            raise MissingStackError(
                "FTJOB_BACKEND=neuron needs torch-neuronx (torch_xla) and the Neuron runtime; they are not "
                f"installed here: use the {IMAGES['neuron']} image"
            )
        env = {"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"} if bf16 else {}
        # bf16 on Neuron: cast the model (XLA_USE_BF16/XLA_DOWNCAST_BF16 are deprecated); autocast stays off.
        return BackendPlan("neuron", "xla", False, False, bf16, False, env=env)
    raise ValueError(f"FTJOB_BACKEND must be one of {', '.join(BACKENDS)}, got {backend!r}")


def backend_from_env(env: Mapping[str, str]) -> str:
    return env.get("FTJOB_BACKEND") or "cpu"


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def import_vendor(backend: str, module: str) -> Any:
    """Import a vendor module or fail naming the image that carries it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingStackError(
            f"{module} is not installed (backend {backend}); use the {IMAGES[backend]} image"
        ) from e


def require_binary(name: str, backend: str) -> str:
    path = shutil.which(name)
    if not path:
        raise MissingStackError(f"{name} is not on PATH (backend {backend}); use the {IMAGES[backend]} image")
    return path


def prepare_process(plan: BackendPlan) -> None:
    """Imports and environment that must happen before torch.distributed initialises."""
    os.environ.update({k: v for k, v in plan.env.items() if k not in os.environ})
    if plan.ddp_backend == "ccl":
        import_vendor("xeon", "oneccl_bindings_for_pytorch")  # registers the "ccl" process-group backend
    if plan.name == "neuron":
        import_vendor("neuron", "torch_xla")
    for note in plan.notes:
        log.info("%s", note)


def optimize_for_backend(plan: BackendPlan, model: Any, optimizer: Any) -> tuple[Any, Any]:
    """Backend-specific model/optimizer changes (IPEX)."""
    if plan.ipex:
        import torch

        ipex = import_vendor("xeon", "intel_extension_for_pytorch")
        dtype = torch.bfloat16 if plan.trainer_bf16 else torch.float32
        model, optimizer = ipex.optimize(model, optimizer=optimizer, dtype=dtype)
        log.info("ipex.optimize applied (dtype %s)", dtype)
    return model, optimizer
