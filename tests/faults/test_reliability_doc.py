"""docs/reliability.md's `faults` section is the suite's own output (`make test-faults`): it must list exactly the
scenarios the suite runs, from the long variant. No cluster needed."""

from __future__ import annotations

import re
from pathlib import Path

import reliability

HERE = Path(__file__).resolve().parent
DOC = HERE.parents[1] / "docs" / "reliability.md"


def declared() -> set[str]:
    """Scenario names recorded by the suite's tests (faultlib.record / _once), which are their test names."""
    names: set[str] = set()
    for path in HERE.glob("test_*.py"):
        text = path.read_text()
        found = set(re.findall(r'(?:record|_once)\(\s*"(test_\w+)"', text))
        tests = set(re.findall(r"^def (test_\w+)\(", text, re.M))
        assert found <= tests, f"{path.name}: records for no test: {found - tests}"
        names |= found
    return names


def test_every_test_records_its_scenario() -> None:
    for path in HERE.glob("test_*.py"):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        tests = set(re.findall(r"^def (test_\w+)\(", text, re.M))
        assert tests <= declared(), f"{path.name}: tests without a record in docs/reliability.md: {tests - declared()}"


def test_reliability_doc_lists_exactly_the_suites_scenarios() -> None:
    text = reliability.section(DOC.read_text(), "faults")
    assert text is not None, "docs/reliability.md has no `faults` section: run `make test-faults` (writes it)"
    listed = set(re.findall(r"^\| `(test_\w+)` \|", text, re.M))
    assert listed == declared(), (
        "docs/reliability.md is out of date: run `make test-faults` (writes it); "
        f"missing {sorted(declared() - listed)}, extra {sorted(listed - declared())}"
    )
    assert "Variant: long." in text, "docs/reliability.md must come from the long variants (`make test-faults`)"
