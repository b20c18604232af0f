"""How the test tiers, the tools and the benchmarks find each other's code: by installed package or by pytest's
`pythonpath` (pyproject.toml), never by editing sys.path at import time, and in one direction only.

- ftjob_cluster (tools/cluster) and the test support (tests/support) are installed editable by `make setup`;
- benchmarks may use both; tests import a benchmark script only in its own unit test (tests/unit/test_bench_*.py),
  through the `pythonpath` entry for benchmarks/;
- the tools import neither the tests' support nor the benchmarks."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
SCANNED = ("tests", "tools", "benchmarks", "hack")


def python_files(*tops: str) -> Iterator[Path]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts and not any(p.endswith(".egg-info") for p in path.parts):
                yield path


def imported(tree: ast.AST) -> set[str]:
    """Top-level module names a file imports (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def path_edits(tree: ast.AST) -> list[int]:
    """Lines that change the import path: sys.path.insert/append/extend, an assignment to sys.path, site.addsitedir."""
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (_is_sys_path(f.value) and f.attr in ("insert", "append", "extend")) or (
                f.attr == "addsitedir" and isinstance(f.value, ast.Name) and f.value.id == "site"
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(t) for t in targets):
                lines.append(node.lineno)
    return lines


def test_no_file_edits_the_import_path() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in python_files(*SCANNED)
        for line in path_edits(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, (
        f"sys.path edited at {found}: import tools/cluster's ftjob_cluster and tests/support's modules by name "
        "(`make setup` installs both), benchmark scripts through pytest's `pythonpath` (pyproject.toml)"
    )


def test_the_path_edit_check_sees_every_form() -> None:
    source = (
        "import sys, site\n"
        "sys.path.insert(0, 'a')\n"
        "sys.path.append('b')\n"
        "sys.path.extend(['c'])\n"
        "sys.path = ['d']\n"
        "sys.path += ['e']\n"
        "site.addsitedir('f')\n"
        "x = 'sys.path.insert(0, \"only a string\")'\n"
    )
    assert sorted(path_edits(ast.parse(source))) == [2, 3, 4, 5, 6, 7]


def benchmark_modules() -> set[str]:
    return {p.stem for p in (ROOT / "benchmarks").glob("*.py")}


def test_tests_import_a_benchmark_only_in_its_own_unit_test() -> None:
    scripts = benchmark_modules()
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported(ast.parse(path.read_text(encoding="utf-8"))) & scripts)
        for path in python_files("tests")
        if not (path.parent.name == "unit" and path.name.startswith("test_bench_"))
    }
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, (
        f"{wrong} import benchmark scripts: a library both use belongs in tools/cluster (ftjob_cluster) or "
        "tests/support; only tests/unit/test_bench_*.py import a benchmark, to test it"
    )


def test_tools_import_neither_test_support_nor_benchmarks() -> None:
    above = {p.stem for p in SUPPORT.glob("*.py")} | benchmark_modules()
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported(ast.parse(path.read_text(encoding="utf-8"))) & above)
        for path in python_files("tools")
    }
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"{wrong}: the tools sit below the tests and the benchmarks, which import them"


def test_benchmark_scripts_shadow_no_standard_module() -> None:
    # pytest puts benchmarks/ first on sys.path (pyproject.toml `pythonpath`): a script named like a standard
    # module would replace it for every test.
    assert not benchmark_modules() & set(sys.stdlib_module_names)


def test_make_setup_installs_what_the_tests_import_by_name() -> None:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["pythonpath"] == ["benchmarks"]
    makefile = (ROOT / "Makefile").read_text()
    assert "DEV_PACKAGES := $(shell python3 $(ROOT)/hack/lock.py dev-packages)" in makefile
    listed = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "lock.py"), "dev-packages"], capture_output=True, text=True, check=True
    )
    packages = listed.stdout.split()
    for package in ("tools/cluster", "tests/support"):
        assert package in packages and (ROOT / package / "pyproject.toml").is_file(), package


# The project's own packages: a module of theirs that a test, tool or benchmark names must exist (a module moved or
# renamed by one change and still imported by another's new test fails here, in the unit tier, rather than at the
# collection of a tier that runs half an hour later).
OWN_PACKAGES = ("finetune_operator", "finetune_runtime", "ftjob_cluster")


def test_every_imported_module_of_our_packages_exists() -> None:
    import importlib.util

    missing = []
    for path in python_files(*SCANNED):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            for module in modules:
                if module.split(".")[0] in OWN_PACKAGES and importlib.util.find_spec(module) is None:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module}")
    assert not missing, f"modules that do not exist: {missing}"
