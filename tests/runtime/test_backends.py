"""A backend is one entry of backends.py: no other module of the runtime branches on a backend's name."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from finetune_runtime import backends, launcher, selfcheck, sshd
from finetune_runtime.backends import BACKENDS, MissingStackError, plan_backend

PACKAGE = Path(backends.__file__).parent


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name a backend)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _names_in(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in BACKENDS]


def backend_literals(path: Path) -> list[str]:
    """Where a module names a backend in code: any string literal neuron/xeon/nvidia (cpu is also torch's device
    name, so it counts only where compared or looked up)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docs and node.value in set(BACKENDS) - {"cpu"}:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
        if isinstance(node, ast.Compare | ast.Subscript) and "cpu" in _names_in(node):
            found.append(f"{path.name}:{node.lineno}: compares or looks up 'cpu'")
    return found


def test_every_backend_is_one_entry_and_nothing_else_branches_on_its_name() -> None:
    assert set(BACKENDS) == {"neuron", "neuron-native", "xeon", "xeon-upstream", "cpu", "nvidia"}
    offenders = [
        hit for path in sorted(PACKAGE.rglob("*.py")) if path.name != "backends.py" for hit in backend_literals(path)
    ]
    assert offenders == [], "backend differences belong in backends.Backend fields"


def test_the_check_sees_a_branch_on_a_backend(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""A docstring may say neuron."""\nif plan.name == "neuron":\n    pass\nok = x != "cpu"\n')
    assert sorted(backend_literals(bad)) == ["bad.py:2: 'neuron'", "bad.py:4: compares or looks up 'cpu'"]


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backends_facts_reach_the_modules_that_use_them(name: str) -> None:
    b = BACKENDS[name]
    assert b.image == backends.IMAGES[name]
    assert set(b.env_prefixes) <= set(launcher.FORWARD_PREFIXES)
    assert set(b.packages) <= set(selfcheck.PACKAGES)
    accept = next(x for x in sshd.sshd_config(Path("/k"), "22").splitlines() if x.startswith("AcceptEnv "))
    assert all(f"{p}*" in accept.split() for p in launcher.FORWARD_PREFIXES)
    plan = plan_backend(name, "bf16", importable=lambda m: m not in b.excludes, cuda_available=lambda: True)
    assert plan.trainer_bf16 != plan.cast_model_bf16, "bf16 is either autocast or a cast of the model"
    assert plan.trainer_ddp_backend in (plan.ddp_backend, None)


def test_a_missing_precompile_wrapper_names_the_backends_image() -> None:
    for b in BACKENDS.values():
        if b.precompile_wrapper:
            with pytest.raises(MissingStackError, match=f"{b.precompile_wrapper}.*{b.image}"):
                launcher.launch_plan({"FTJOB_BACKEND": b.name}, True, which=lambda _: None)


# --- the native Neuron stack (TorchNeuron): Trainium cannot exist here, so its module presence is faked ---------


def _fake_stack(*present: str) -> Callable[[str], bool]:
    """What find_spec would say in an image that has exactly these vendor modules."""
    return lambda m: m in present


def test_native_neuron_plan_with_a_fake_torch_neuronx() -> None:
    plan = plan_backend("neuron-native", "bf16", importable=_fake_stack("torch_neuronx"))
    # bf16 as on CUDA: the Trainer's autocast on the neuron device, no cast of the model, no XLA variables
    assert plan.trainer_bf16 and not plan.cast_model_bf16 and plan.env == {}
    # torch_neuronx is imported before torch.distributed starts: importing it registers the "neuron" group
    assert plan.ddp_backend == plan.trainer_ddp_backend == "neuron"
    assert plan.preload == ("torch_neuronx",)
    b = plan.backend
    assert b.torch_compile and b.compile_backend == "neuron" and not b.inductor
    assert b.static_shapes, "torch.compile's neuron backend refuses dynamic shapes: pad to maxLength"
    assert b.compile_cache_var == "TORCH_NEURONX_NEFF_CACHE_DIR" and b.precompile_wrapper is None


def test_native_neuron_without_torch_neuronx_names_its_image_fake_empty_image() -> None:
    with pytest.raises(MissingStackError, match=r"TorchNeuron.*finetune-operator/neuron-native"):
        plan_backend("neuron-native", "fp32", importable=_fake_stack())


def test_native_neuron_in_the_xla_image_is_refused_fake_xla_image() -> None:
    """torch-neuronx 2.9 (XLA) also provides torch_neuronx: its torch_xla tells the two images apart."""
    with pytest.raises(MissingStackError, match="torch_xla, another stack's: use the finetune-operator/neuron-native"):
        plan_backend("neuron-native", "fp32", importable=_fake_stack("torch_neuronx", "torch_xla"))
    xla = plan_backend("neuron", "bf16", importable=_fake_stack("torch_neuronx", "torch_xla"))
    assert xla.cast_model_bf16 and xla.ddp_backend == "xla" and not xla.backend.torch_compile


def test_xla_neuron_in_the_native_image_names_the_xla_image_fake_native_image() -> None:
    with pytest.raises(MissingStackError, match="finetune-operator/neuron image"):
        plan_backend("neuron", "fp32", importable=_fake_stack("torch_neuronx"))


def test_xeon_upstream_is_gloo_and_autocast_without_ipex() -> None:
    plan = plan_backend("xeon-upstream", "bf16", importable=_fake_stack())
    assert plan.ddp_backend == "gloo" and plan.trainer_bf16 and plan.optimizer_module is None and plan.notes == []
    assert plan.backend.mpi == ("intel",) and plan.backend.inductor
    # the IPEX backend on the same (IPEX-less) image falls back to the same path, and says so
    ipex = plan_backend("xeon", "bf16", importable=_fake_stack())
    assert ipex.ddp_backend == "gloo" and len(ipex.notes) == 2


def test_selfcheck_and_forwarding_list_each_name_once() -> None:
    assert len(selfcheck.PACKAGES) == len(set(selfcheck.PACKAGES))
    assert len(launcher.FORWARD_PREFIXES) == len(set(launcher.FORWARD_PREFIXES))
