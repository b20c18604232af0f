"""The docs that describe the operator's shape name what the code has: every phase of a reconcile pass
(`reconcile.PHASES`, then `converge`) in docs/architecture.md and docs/operator.md, and every test tier (each
folder of tests/ with tests in it, each make target in TEST_TIERS) in docs/architecture.md and README's test table.
A phase or tier added without its docs fails here, naming the file to update."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from finetune_operator import reconcile

ROOT = Path(__file__).resolve().parents[2]
PHASE_DOCS = ("docs/architecture.md", "docs/operator.md")


def phase_names() -> list[str]:
    return [phase.__name__ for phase in reconcile.PHASES] + [reconcile.converge.__name__]


def test_the_phase_list_is_what_reconcile_runs() -> None:
    assert phase_names()[:2] == ["terminal", "allowlists"] and phase_names()[-1] == "converge"


@pytest.mark.parametrize("doc", PHASE_DOCS)
def test_docs_name_every_reconcile_phase(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    missing = [name for name in phase_names() if f"`{name}`" not in text]
    assert not missing, f"{doc} does not name the reconcile phase(s) {missing} (reconcile.PHASES): describe them there"


def configured_tiers() -> list[str]:
    """The make targets appended to TEST_TIERS in the Makefile and mk/*.mk, plus the unit tier `make test` runs
    directly."""
    sources = [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))]
    tiers = ["test-unit"]
    for source in sources:
        for line in source.read_text(encoding="utf-8").splitlines():
            if line.startswith("TEST_TIERS +="):
                tiers += line.split("+=", 1)[1].split()
    return tiers


def tier_folders() -> list[str]:
    """tests/<tier>/ folders that hold tests (support is the test support package, not a tier)."""
    return sorted(p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def test_readme_names_every_test_tier_target() -> None:
    table = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    named = {target for line in table for target in re.findall(r"`(test-[a-z0-9-]+)`", line)}
    missing = [tier for tier in configured_tiers() if tier not in named]
    assert not missing, f"README.md's test table has no row naming {missing} (TEST_TIERS in the Makefile, mk/*.mk)"


def test_architecture_names_every_test_folder() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    line = next((ln for ln in text.split("\n- ") if ln.startswith("Tests live in `tests/<tier>/`")), "")
    missing = [folder for folder in tier_folders() if f"`{folder}`" not in line]
    assert line and not missing, (
        f"docs/architecture.md's 'Tests live in `tests/<tier>/`' list lacks {missing}: name each tier folder there"
    )
