"""The e2e tier's failure table (the `e2e` section of docs/reliability.md) says what pytest saw: a row only for a test
that passed, nothing written from a session that failed or measured nothing, and the rest of the file (the fault
tier's section) kept as it was.

Each case runs the e2e tier's real conftest files (copied beside a few tiny tests that add rows) in a pytest of its
own (pytester), without nodes: the tiny tests use no fixture."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import reliability

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
# What the e2e tier's own session loads before its tests (its conftest reads VERSION for the image tags).
TIER_FILES = ("VERSION", "tests/conftest.py", "tests/e2e/conftest.py")

TESTS = """
import pytest
from reliability import disruption


def test_drain():
    row = disruption("node drained", "kubectl drain")
    row.detected_s, row.steps_lost = 4.2, 0
    row.goal, row.goal_held, row.goal_note = "drained work lost <= 1 step", True, "0"


def test_hang_breaks():
    row = disruption("hang", "a rank blocks")
    row.detected_s = 75.0
    assert 1 == 2, "the job never ended"


def test_oom_is_skipped():
    disruption("OOM", "a memory limit")
    pytest.skip("no memory cgroup here")


def test_without_a_row():
    pass
"""

FAULTS = "<!-- BEGIN faults -->\n## The fault suite's results\n\n| `test_x` | held |\n<!-- END faults -->\n"
OLD = "# Reliability\n\nBy hand.\n\n" + FAULTS + "\n<!-- BEGIN e2e -->\nthe last good table\n<!-- END e2e -->\n"


@pytest.fixture
def tier(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the e2e tier's conftest files and the tiny tests; returns the output path (holding OLD)."""
    for rel in TIER_FILES:
        (pytester.path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, pytester.path / rel)
    (pytester.path / "tests" / "e2e" / "test_tiny.py").write_text(TESTS)
    out = pytester.path / "reliability.md"
    out.write_text(OLD)
    monkeypatch.setenv("FTJOB_E2E_RELIABILITY_OUT", str(out))
    return out


def test_a_passing_session_writes_rows_of_passed_tests_only_and_keeps_the_faults_section(
    pytester: pytest.Pytester, tier: Path
) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "tests/e2e", "-k", "not breaks")
    result.assert_outcomes(passed=2, skipped=1)
    doc = tier.read_text()
    table = reliability.section(doc, "e2e")
    assert table is not None and "the last good table" not in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and "Failure mode" not in line]
    assert len(rows) == 1 and rows[0].startswith("| node drained | kubectl drain | 4 s | — | 0 |"), rows
    assert "OOM" not in table  # skipped: measured nothing, so no row
    # Everything outside the e2e section is as it was.
    assert doc.split("<!-- BEGIN e2e -->")[0] == OLD.split("<!-- BEGIN e2e -->")[0]


def test_a_failing_session_leaves_the_table_as_it_was(pytester: pytest.Pytester, tier: Path) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "tests/e2e")
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    assert tier.read_text() == OLD
    result.stdout.fnmatch_lines(
        [f"*failure table not written to {tier}: the session failed*", "*hang: failed AssertionError: the job never*"]
    )


def test_a_session_that_measured_nothing_leaves_the_table_as_it_was(pytester: pytest.Pytester, tier: Path) -> None:
    # As on a machine that cannot run a node: every test that adds a row skipped.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "tests/e2e", "-k", "oom or without")
    result.assert_outcomes(passed=1, skipped=1)
    assert tier.read_text() == OLD
    result.stdout.fnmatch_lines([f"*failure table not written to {tier}: no test that measures a failure mode*"])
