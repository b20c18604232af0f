"""Device code paths chosen by `FTJOB_BACKEND`: neuron, neuron-native, xeon, xeon-upstream, cpu, nvidia.

Everything the runtime does differently per backend is a field of its `Backend` entry below; no other module
branches on a backend's name (tests/runtime/test_backends.py checks), so a new backend is one entry here (and its
image). Vendor stacks are not dependencies of this package: the per-hardware images bring them. They are imported
lazily, and a missing one fails with a message that names the image to use.

The operator's profiles choose the backend per software stack (spec.hardware.stack: each stack names one entry
here and its image; tests/unit/test_profile_images.py checks that the two agree).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_BACKEND = "cpu"  # FTJOB_BACKEND unset: a run by hand on any machine
INDUCTOR = "inductor"  # torch.compile's default backend; it builds C++/Triton kernels (compilecache.toolchain_problem)
INDUCTOR_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"  # where torch.compile's inductor keeps its caches (train.py sets it)


class MissingStackError(RuntimeError):
    """The backend's vendor stack is not installed in this image."""


@dataclass(frozen=True)
class VendorModule:
    """A vendor module the backend uses when its image has it, and what happens without it."""

    module: str
    without: str  # logged when absent


@dataclass(frozen=True)
class Backend:
    """One backend: what its runs need and do differently (pure data)."""

    name: str
    ddp_backend: str  # the torch.distributed process group
    # TrainingArguments.ddp_backend is set to ddp_backend: "xla" is no choice there (under torchrun with
    # torch-neuronx, transformers creates the XLA process group itself when it is imported, training_args.py)
    trainer_ddp_backend: bool
    use_cpu: bool  # TrainingArguments.use_cpu
    # bf16: "autocast" (TrainingArguments.bf16) or "cast" (model.to(torch.bfloat16): Neuron's current guidance;
    # XLA_USE_BF16/XLA_DOWNCAST_BF16 are deprecated)
    bf16: str
    bf16_env: dict[str, str] = field(default_factory=dict)  # exported before torch.distributed starts, under bf16
    required: tuple[str, ...] = ()  # modules without which the backend cannot run (MissingStackError)
    required_what: str = ""  # how the message names them
    # modules of another stack whose presence means this is not the backend's image (the XLA torch-neuronx also
    # provides torch_neuronx, and the two stacks cannot share a process)
    excludes: tuple[str, ...] = ()
    needs_cuda: bool = False  # torch must see a CUDA device
    # a faster process group from a vendor module (registered by importing it), else ddp_backend
    vendor_ddp: tuple[str, str] | None = None  # (module, process group)
    optimizer: VendorModule | None = None  # a module whose optimize(model, optimizer) applies (IPEX)
    # torch.compile compiles the graphs (training.compile, the precompile trial); False: the backend's own compiler
    # does (Neuron's neuronx-cc under neuron_parallel_compile)
    torch_compile: bool = True
    compile_backend: str = INDUCTOR  # torch.compile's backend (TrainingArguments.torch_compile_backend)
    static_shapes: bool = False  # pad every batch to maxLength: XLA compiles one graph per shape
    compile_cache_var: str = INDUCTOR_CACHE_VAR  # the variable naming the compile cache the trial fills
    precompile_wrapper: str | None = None  # a program `launch --precompile` runs torchrun under
    mpi: tuple[str, ...] = ()  # the MPI implementations its image ships (FTJOB_MPI_IMPLEMENTATION values)
    env_prefixes: tuple[str, ...] = ()  # its vendor variables, which mpirun forwards to every rank
    packages: tuple[str, ...] = ()  # its vendor distributions, whose versions selfcheck reports

    @property
    def inductor(self) -> bool:
        """torch.compile runs through inductor: its cache variables apply and it needs a C/C++ toolchain."""
        return self.torch_compile and self.compile_backend == INDUCTOR

    @property
    def image(self) -> str:
        """The image that carries this backend's stack, for error messages: images/<backend>/ builds it as
        finetune-operator/<backend> (images/scripts/build.sh), the repository the operator's profiles of that
        backend name (tests/unit/test_profile_images.py checks both)."""
        return f"finetune-operator/{self.name}"


_BACKENDS = (
    Backend(
        "neuron",
        ddp_backend="xla",
        trainer_ddp_backend=False,
        use_cpu=False,
        bf16="cast",
        bf16_env={"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"},
        required=("torch_xla",),
        required_what="torch-neuronx (torch_xla) and the Neuron runtime",
        torch_compile=False,
        static_shapes=True,
        compile_cache_var="NEURON_COMPILE_CACHE_URL",
        precompile_wrapper="neuron_parallel_compile",
        env_prefixes=("NEURON_", "XLA_"),
        packages=("torch-neuronx", "torch-xla"),
    ),
    # TorchNeuron (torch-neuronx >= 2.13, Neuron SDK 2.33+, Trn2/Trn3): native PyTorch on the `neuron` device. The
    # Trainer places the model there and autocasts under bf16 (accelerate picks the device and the "neuron" process
    # group when torch_neuronx is importable); torch.compile's "neuron" backend lowers graphs to neuronx-cc, one
    # graph per input shape (dynamic shapes are refused), and keeps the NEFFs in TORCH_NEURONX_NEFF_CACHE_DIR.
    Backend(
        "neuron-native",
        ddp_backend="neuron",
        trainer_ddp_backend=True,
        use_cpu=False,
        bf16="autocast",
        required=("torch_neuronx",),
        required_what="TorchNeuron (torch-neuronx 2.13 or newer, the native backend) and the Neuron runtime",
        excludes=("torch_xla",),
        compile_backend="neuron",
        static_shapes=True,
        compile_cache_var="TORCH_NEURONX_NEFF_CACHE_DIR",
        env_prefixes=("NEURON_",),
        packages=("torch-neuronx", "neuronx-cc"),
    ),
    Backend(
        "xeon",
        ddp_backend="gloo",
        trainer_ddp_backend=True,
        use_cpu=True,
        bf16="autocast",
        vendor_ddp=("oneccl_bindings_for_pytorch", "ccl"),
        optimizer=VendorModule(
            "intel_extension_for_pytorch", "plain torch (bf16 autocast still uses AMX through oneDNN)"
        ),
        mpi=("intel",),
        env_prefixes=("CCL_", "I_MPI_"),
        packages=("intel-extension-for-pytorch", "oneccl-bind-pt"),
    ),
    # Current PyTorch on Xeon: AMX bf16 through oneDNN under autocast, gloo between the ranks (no oneCCL binding
    # exists for it), Intel MPI to launch them.
    Backend(
        "xeon-upstream",
        ddp_backend="gloo",
        trainer_ddp_backend=True,
        use_cpu=True,
        bf16="autocast",
        mpi=("intel",),
        env_prefixes=("I_MPI_",),
    ),
    Backend("cpu", ddp_backend="gloo", trainer_ddp_backend=True, use_cpu=True, bf16="autocast", mpi=("mpich",)),
    Backend(
        "nvidia",
        ddp_backend="nccl",
        trainer_ddp_backend=True,
        use_cpu=False,
        bf16="autocast",
        needs_cuda=True,
        env_prefixes=("NCCL_", "CUDA_"),
    ),
)
BACKENDS: dict[str, Backend] = {b.name: b for b in _BACKENDS}
IMAGES = {name: b.image for name, b in BACKENDS.items()}


def get(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"FTJOB_BACKEND must be one of {', '.join(BACKENDS)}, got {name!r}")
    return BACKENDS[name]


def backend_from_env(env: Mapping[str, str]) -> str:
    return env.get("FTJOB_BACKEND") or DEFAULT_BACKEND


def images_with_mpi(implementation: str) -> list[str]:
    """The images that ship an MPI implementation (for messages that tell users which image to use)."""
    return [b.image for b in BACKENDS.values() if implementation in b.mpi]


def _default_importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class BackendPlan:
    """What the Trainer and the model need for one run: the backend's entry, resolved against the precision and
    the stack this image has (pure data; unit-tested per backend)."""

    backend: Backend
    ddp_backend: str  # the process group this run uses (the vendor one when its module is there)
    trainer_bf16: bool  # TrainingArguments.bf16 (autocast): xeon/cpu/nvidia under bf16
    cast_model_bf16: bool  # model.to(torch.bfloat16): Neuron under bf16
    optimizer_module: str | None  # e.g. intel_extension_for_pytorch: its optimize() runs on model + optimizer
    preload: tuple[str, ...] = ()  # modules imported before torch.distributed initialises
    env: dict[str, str] = field(default_factory=dict)  # variables to export before torch.distributed starts
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def use_cpu(self) -> bool:
        return self.backend.use_cpu

    @property
    def trainer_ddp_backend(self) -> str | None:
        """TrainingArguments.ddp_backend (None: transformers sets the process group up itself)."""
        return self.ddp_backend if self.backend.trainer_ddp_backend else None

    @property
    def ipex(self) -> bool:
        return self.optimizer_module is not None


def plan_backend(
    backend: str,
    precision: str,
    importable: Callable[[str], bool] = _default_importable,
    cuda_available: Callable[[], bool] | None = None,
) -> BackendPlan:
    """Choose the code path; raise MissingStackError when the backend's stack is absent."""
    b = get(backend)
    bf16 = precision == "bf16"
    missing = [m for m in b.required if not importable(m)]
    if missing:
        raise MissingStackError(
            f"FTJOB_BACKEND={b.name} needs {b.required_what or ', '.join(missing)}; not installed here: "
            f"use the {b.image} image"
        )
    other = [m for m in b.excludes if importable(m)]
    if other:
        raise MissingStackError(
            f"FTJOB_BACKEND={b.name} but this image has {', '.join(other)}, another stack's: use the {b.image} "
            "image (or the stack this image carries, spec.hardware.stack)"
        )
    if b.needs_cuda and not (cuda_available() if cuda_available else _cuda_available()):
        raise MissingStackError(
            f"FTJOB_BACKEND={b.name} but torch sees no CUDA device; use the {b.image} image on a node with "
            "nvidia.com/gpu"
        )
    notes: list[str] = []
    preload = list(b.required)
    ddp = b.ddp_backend
    if b.vendor_ddp:
        module, group = b.vendor_ddp
        if importable(module):
            ddp = group
            preload.append(module)  # importing it registers the process group
        else:
            notes.append(f"{module} not installed: {b.ddp_backend} instead of {group}")
    optimizer = None
    if b.optimizer:
        if importable(b.optimizer.module):
            optimizer = b.optimizer.module
        else:
            notes.append(f"{b.optimizer.module} not installed: {b.optimizer.without}")
    return BackendPlan(
        backend=b,
        ddp_backend=ddp,
        trainer_bf16=bf16 and b.bf16 == "autocast",
        cast_model_bf16=bf16 and b.bf16 == "cast",
        optimizer_module=optimizer,
        preload=tuple(preload),
        env=dict(b.bf16_env) if bf16 else {},
        notes=notes,
    )


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def import_vendor(backend: Backend, module: str) -> Any:
    """Import a vendor module or fail naming the image that carries it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingStackError(
            f"{module} is not installed (backend {backend.name}); use the {backend.image} image"
        ) from e


def prepare_process(plan: BackendPlan) -> None:
    """Imports and environment that must happen before torch.distributed initialises."""
    os.environ.update({k: v for k, v in plan.env.items() if k not in os.environ})
    for module in plan.preload:
        import_vendor(plan.backend, module)
    for note in plan.notes:
        log.info("%s", note)


def optimize_for_backend(plan: BackendPlan, model: Any, optimizer: Any) -> tuple[Any, Any]:
    """The backend's optimizer module on model + optimizer (IPEX's ipex.optimize)."""
    if plan.optimizer_module:
        import torch

        vendor = import_vendor(plan.backend, plan.optimizer_module)
        dtype = torch.bfloat16 if plan.trainer_bf16 else torch.float32
        model, optimizer = vendor.optimize(model, optimizer=optimizer, dtype=dtype)
        log.info("%s.optimize applied (dtype %s)", plan.optimizer_module, dtype)
    return model, optimizer
