"""A backend is one entry of backends.py: no other module of the runtime branches on a backend's name."""

from __future__ import annotations

import ast
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
    assert set(BACKENDS) == {"neuron", "xeon", "cpu", "nvidia"}
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
    plan = plan_backend(name, "bf16", importable=lambda m: True, cuda_available=lambda: True)
    assert plan.trainer_bf16 != plan.cast_model_bf16, "bf16 is either autocast or a cast of the model"
    assert plan.trainer_ddp_backend in (plan.ddp_backend, None)


def test_a_missing_precompile_wrapper_names_the_backends_image() -> None:
    for b in BACKENDS.values():
        if b.precompile_wrapper:
            with pytest.raises(MissingStackError, match=f"{b.precompile_wrapper}.*{b.image}"):
                launcher.launch_plan({"FTJOB_BACKEND": b.name}, True, which=lambda _: None)
