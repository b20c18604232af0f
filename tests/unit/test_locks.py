"""The locks (hack/lock.py, `make lock`) agree with what is declared, offline: a pin changed, a requirement added
or dropped without `make lock` fails here. Each pin is written once; the images' version labels come from the
locks (or, for the flavors that cannot be locked here, from their pins)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hack_lock", ROOT / "hack" / "lock.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


LOCK = tool()


@pytest.mark.parametrize("lock", LOCK.LOCKS, ids=lambda lock: lock.path)
def test_lock_agrees_with_what_is_declared(lock: object) -> None:
    assert LOCK.problems(lock) == []


def test_dev_lock_resolves_every_requirements_file() -> None:
    """`make setup` installs requirements/dev.lock only: a new requirements/*.txt must reach it."""
    dev = next(lock for lock in LOCK.LOCKS if lock.path == LOCK.DEV)
    for path in sorted((ROOT / "requirements").glob("*.txt")):
        assert f"requirements/{path.name}" in dev.inputs


@pytest.fixture
def copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of what the check reads (declared requirements and locks), which the module then reads instead."""
    files = [
        *ROOT.glob("requirements/**/*.txt"),
        *ROOT.glob("requirements/*.lock"),
        *ROOT.glob("images/*/requirements*"),
        *(ROOT / package / "pyproject.toml" for package in LOCK.DEV_PACKAGES),
    ]
    for path in files:
        (tmp_path / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / path.relative_to(ROOT))
    monkeypatch.setattr(LOCK, "ROOT", tmp_path)
    return tmp_path


def all_problems() -> list[str]:
    return [p for lock in LOCK.LOCKS for p in LOCK.problems(lock)]


def test_a_changed_pin_is_caught(copy: Path) -> None:
    common = copy / "requirements" / "stack" / "common.txt"
    common.write_text(re.sub(r"^peft==.*$", "peft==99.0", common.read_text(), flags=re.M))
    found = all_problems()
    # Every lock that holds peft: both venvs and the three locked runtime images, not the operator's.
    assert len([p for p in found if "peft" in p and "wants peft==99.0" in p]) == 5, found


def test_a_new_requirement_is_caught(copy: Path) -> None:
    dev = copy / "requirements" / "dev.txt"
    dev.write_text(dev.read_text() + "tomli-w\n")
    assert "requirements/dev.lock lacks tomli-w (requirements/dev.txt): run `make lock`" in all_problems()


def test_a_dropped_requirement_is_caught(copy: Path) -> None:
    pyproject = copy / "operator" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('  "tqdm>=4.60",', ""))
    found = all_problems()
    assert any(
        p.startswith("images/operator/requirements.lock locks tqdm, which nothing declared needs") for p in found
    )


def test_a_lock_made_from_other_inputs_is_caught(copy: Path) -> None:
    lock = copy / "images" / "nvidia" / "requirements.lock"
    lock.write_text(lock.read_text().replace(" -c requirements/dev.lock", ""))
    assert any(p.startswith("images/nvidia/requirements.lock was made by") for p in all_problems())


def test_a_stripped_hash_is_caught(copy: Path) -> None:
    lock = copy / "images" / "operator" / "requirements.lock"
    lock.write_text(LOCK.strip_hashes(lock.read_text(), ["kopf"]))
    assert "images/operator/requirements.lock: kopf has no hashes: run `make lock`" in all_problems()


def test_an_image_lock_behind_the_dev_lock_is_caught(copy: Path) -> None:
    lock = copy / "images" / "cpu" / "requirements.lock"
    lock.write_text(re.sub(r"^filelock==\S+", "filelock==0.0.1", lock.read_text(), flags=re.M))
    assert any("locks filelock==0.0.1, requirements/dev.lock" in p for p in all_problems())


def test_torch_is_locked_by_version_only_where_its_index_varies() -> None:
    """cpu and xeon-upstream take torch from the index build.sh picks (+cpu from the PyTorch CPU index); nvidia and
    the venvs from PyPI, hash-checked."""
    for lock in LOCK.LOCKS:
        entries = LOCK.entries((ROOT / lock.path).read_text())
        if "torch" in entries:
            assert bool(entries["torch"].hashes) == ("torch" not in lock.unhashed), lock.path
    unhashed = {lock.path for lock in LOCK.LOCKS if "torch" in lock.unhashed}
    assert unhashed == {"images/cpu/requirements.lock", "images/xeon/requirements-upstream.lock"}


def test_setup_file_takes_unidic_lite_from_the_wheelhouse() -> None:
    text = LOCK.setup_file(LOCK.DEV)
    entries = LOCK.entries(text)
    assert entries["unidic-lite"].hashes == []
    assert all(e.hashes for name, e in entries.items() if name != "unidic-lite")
    # The wheel is built from the lock's own line: the sdist's hash.
    assert "--hash=sha256:" in LOCK.pin(LOCK.DEV, "unidic-lite")


def declared_pins() -> dict[str, dict[str, str]]:
    """package -> {file: version} of every `==` pin in a declared requirements file or pyproject.toml."""
    out: dict[str, dict[str, str]] = {}
    files = [*ROOT.glob("requirements/**/*.txt"), *ROOT.glob("images/*/requirements*.txt")]
    for path in files:
        for name, version in LOCK.pins(str(path.relative_to(ROOT)), follow=False).items():
            out.setdefault(name, {})[str(path.relative_to(ROOT))] = version
    for pyproject in ROOT.glob("*/pyproject.toml"):
        for req in tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", []):
            m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)", req)
            if m:
                out.setdefault(LOCK.normalize(m[1]), {})[str(pyproject.relative_to(ROOT))] = m[2]
    return out


def test_each_pin_is_written_once() -> None:
    """A package pinned in two files must differ there (a flavor's own version, e.g. the IPEX image's torch 2.7);
    the same pin written twice is a copy that can drift."""
    copies = {
        name: files
        for name, files in declared_pins().items()
        if len(files) > 1 and len(set(files.values())) < len(files)
    }
    assert copies == {}, "pin it once (requirements/stack*) and include that file"


@pytest.mark.parametrize("flavor", sorted(LOCK.FLAVORS))
def test_labels_are_the_locked_versions(flavor: str) -> None:
    f = LOCK.FLAVORS[flavor]
    labels = dict(line.split("=", 1) for line in LOCK.labels(flavor))
    assert sorted(labels) == sorted(f"dev.finetune.versions.{p}" for p in f.labels)
    for package in f.labels:
        if f.lock:
            want = LOCK.entries((ROOT / f.lock).read_text())[LOCK.normalize(package)].version
        else:
            want = LOCK.pins(f.requirements)[LOCK.normalize(package)]
        assert labels[f"dev.finetune.versions.{package}"] == want
