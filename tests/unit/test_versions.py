"""The release version has one home, VERSION. Everything that names it reads it, or is written from it by
hack/version.py and checked here (`make generate` rewrites; `make release` builds on that)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import finetune_operator
import finetune_runtime

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()
# Where the version may still be written: generated from VERSION (hack/version.py, checked below) or the builders'
# output for it (the goldens, checked by test_builders.py::test_golden and below).
GENERATED = ("charts/finetune-operator/Chart.yaml", "manifests/", "tests/unit/golden/")
# Third-party versions that may equal ours by chance: Go module sums, the Python locks, recorded benchmark results.
UNRELATED = re.compile(r"(^|/)go\.(mod|sum)$|\.lock$|^benchmarks/results/")


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("version", ROOT / "hack" / "version.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_version_file_is_a_release_version() -> None:
    assert generator().read_version() == VERSION


def test_files_that_hold_the_version_carry_this_one() -> None:
    gen = generator()
    assert gen.stale(VERSION) == {}, "run `make generate` (hack/version.py)"
    chart = yaml.safe_load((ROOT / "charts" / "finetune-operator" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    assert len(gen.targets()) > 1, "hack/version.py found no manifest to stamp"


def test_a_new_version_makes_them_stale() -> None:
    """What the test above catches when VERSION changes and nobody runs `make generate`."""
    stale = generator().stale("99.0.0")
    assert ROOT / "charts" / "finetune-operator" / "Chart.yaml" in stale
    assert ROOT / "manifests" / "operator" / "deployment.yaml" in stale
    assert all("99.0.0" in text for text in stale.values())


@pytest.mark.parametrize("package", ["operator", "runtime"])
def test_packages_read_their_version_from_the_file(package: str) -> None:
    project = tomllib.loads((ROOT / package / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"file": "VERSION"}
    link = ROOT / package / "VERSION"
    assert link.is_symlink() and link.resolve() == ROOT / "VERSION"


def test_installed_packages_carry_the_version() -> None:
    """A stale editable install (VERSION changed, `make setup` not rerun) would tag images the old version."""
    assert finetune_operator.__version__ == finetune_runtime.__version__ == VERSION


def test_goldens_show_this_version() -> None:
    """They are the builders' output for VERSION (default tag: the operator's version); `UPDATE_GOLDEN=1`."""
    tags = set()
    for golden in (ROOT / "tests" / "unit" / "golden").glob("*.yaml"):
        tags |= set(re.findall(r"image: finetune-operator/[a-z-]+:(\S+)", golden.read_text()))
    assert tags == {VERSION}


def test_the_version_is_written_nowhere_else() -> None:
    word = re.compile(rf"(?<![\w.]){re.escape(VERSION)}(?![\w.])")
    found = []
    for path in tracked():
        if path == "VERSION" or path.startswith(GENERATED) or UNRELATED.search(path):
            continue
        file = ROOT / path
        if file.is_symlink() or not file.is_file():
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path}:{n}" for n, line in enumerate(text.splitlines(), 1) if word.search(line)]
    assert found == [], f"VERSION {VERSION} written out; read VERSION or generate it (hack/version.py): {found}"


def test_no_image_reference_pins_a_release_tag() -> None:
    """Docs and comments say `finetune-operator/cpu:"$(cat VERSION)"`, never a frozen release tag."""
    ref = re.compile(r"finetune-operator/[a-z-]+:\d+\.\d+\.\d+")
    found = []
    for path in tracked():
        if path.startswith(GENERATED) or UNRELATED.search(path):
            continue
        file = ROOT / path
        if file.is_symlink() or not file.is_file():
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path}:{n}" for n, line in enumerate(text.splitlines(), 1) if ref.search(line)]
    assert found == []
