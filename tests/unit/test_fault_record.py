"""The fault tier's record (docs/reliability.md) says what pytest saw: a row's outcome comes from pytest's own report
of the test that ran the scenario, and a session that failed writes nothing.

Each case runs the fault tier's real conftest files (copied beside a few tiny scenario tests) in a pytest of its own
(pytester), without a cluster: the tiny tests use no fixture."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
# What the fault tier's own session loads before its tests: the shared conftest, the tier's conftest and library.
TIER_FILES = ("tests/conftest.py", "tests/faults/conftest.py", "tests/faults/faultlib.py")

SCENARIOS = """
import pytest
from faultlib import record


def test_holds():
    rec = record("test_holds", "nothing injected")
    rec.trials = 1
    rec.notes.append("all quiet")


def test_breaks():
    rec = record("test_breaks", "an invariant broken")
    rec.trials = 1
    assert 1 == 2, "the invariant broke"


def test_is_skipped():
    rec = record("test_is_skipped", "a tool this machine lacks")
    rec.trials = 1
    pytest.skip("no such tool here")
"""


@pytest.fixture
def tier(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the fault tier's conftest files and the tiny scenarios; returns the record's output path."""
    for rel in TIER_FILES:
        (pytester.path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, pytester.path / rel)
    (pytester.path / "tests" / "faults" / "test_tiny.py").write_text(SCENARIOS)
    out = pytester.path / "reliability.md"
    monkeypatch.setenv("FTJOB_RELIABILITY_OUT", str(out))
    monkeypatch.delenv("FTJOB_FAULTS", raising=False)
    return out


def rows(doc: str) -> dict[str, str]:
    """Scenario -> outcome cell of the record's table."""
    out = {}
    for line in doc.splitlines():
        if line.startswith("| `test_"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0].strip("`")] = cells[-1]
    return out


def test_a_passing_session_writes_each_outcome_as_pytest_reported_it(pytester: pytest.Pytester, tier: Path) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "tests/faults", "-k", "not breaks")
    result.assert_outcomes(passed=1, skipped=1)
    got = rows(tier.read_text())
    assert got == {"test_holds": "held; all quiet", "test_is_skipped": "skipped: no such tool here"}


def test_a_failing_session_leaves_the_record_as_it_was(pytester: pytest.Pytester, tier: Path) -> None:
    tier.write_text("the record of the last session that passed\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "tests/faults")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    assert tier.read_text() == "the record of the last session that passed\n"
    # What would have been written is shown instead, the failed scenario with pytest's own message.
    result.stdout.fnmatch_lines(
        [
            f"*fault record not written to {tier}: the session failed*",
            "*test_breaks*FAILED: AssertionError: the invariant broke*",
        ]
    )


def test_the_fault_tier_rewrites_only_its_own_section(pytester: pytest.Pytester, tier: Path) -> None:
    e2e = "<!-- BEGIN e2e -->\nthe failure table, measured on real nodes\n<!-- END e2e -->\n"
    tier.write_text("# Reliability\n\n<!-- BEGIN faults -->\nan older record\n<!-- END faults -->\n\n" + e2e)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "tests/faults", "-k", "not breaks")
    result.assert_outcomes(passed=1, skipped=1)
    doc = tier.read_text()
    assert doc.startswith("# Reliability\n\n<!-- BEGIN faults -->\n## The fault suite's results")
    assert "an older record" not in doc and set(rows(doc)) == {"test_holds", "test_is_skipped"}
    assert doc.endswith("<!-- END faults -->\n\n" + e2e)
