"""The pure parts of docs/reliability.md's writers (tests/support/reliability.py): one tier's section replaced with
the other's kept, the e2e failure table's rows (a row only for a test that passed), and the times read back from
kubelet log timestamps and API times. No cluster."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import reliability
from reliability import Disruption

FAULTS = "## The fault suite\n\n| `test_a` | held |\n"
E2E = "## The failure table\n\n| node lost | 52 s |\n"


def test_a_section_is_appended_to_a_file_without_it_and_replaced_in_place_after() -> None:
    doc = "# Reliability\n\nIntroduction, by hand.\n"
    one = reliability.replace_section(doc, "faults", FAULTS)
    assert one.startswith(doc) and "<!-- BEGIN faults -->\n## The fault suite" in one
    two = reliability.replace_section(one, "e2e", E2E)
    assert two.index("BEGIN faults") < two.index("BEGIN e2e")
    # Rewriting one section keeps the introduction and the other section byte for byte.
    three = reliability.replace_section(two, "faults", "## The fault suite\n\n| `test_b` | held |\n")
    assert reliability.section(three, "e2e") == E2E.strip()
    assert reliability.section(three, "faults") == "## The fault suite\n\n| `test_b` | held |"
    assert three.replace("test_b", "test_a") == two
    # Idempotent: the same body twice is the same file.
    assert reliability.replace_section(three, "faults", "## The fault suite\n\n| `test_b` | held |\n") == three


def test_the_e2e_section_never_touches_the_faults_section_before_or_after_it() -> None:
    doc = reliability.replace_section(reliability.replace_section("", "e2e", E2E), "faults", FAULTS)
    assert doc.index("BEGIN e2e") < doc.index("BEGIN faults")  # whatever the order in the file
    new = reliability.replace_section(doc, "e2e", "## The failure table\n\n| drain | 9 s |\n")
    assert reliability.section(new, "faults") == FAULTS.strip()
    assert new.split("<!-- END e2e -->")[1] == doc.split("<!-- END e2e -->")[1]


def test_an_empty_file_gets_only_the_section_and_a_broken_marker_is_refused() -> None:
    assert reliability.replace_section("", "e2e", E2E) == f"<!-- BEGIN e2e -->\n{E2E.strip()}\n<!-- END e2e -->\n"
    assert reliability.section("no markers here", "e2e") is None
    with pytest.raises(ValueError, match="never ends"):
        reliability.replace_section("<!-- BEGIN e2e -->\nhalf a section\n", "e2e", E2E)


def _row(mode: str, result: str | None, **measured: object) -> Disruption:
    r = Disruption(mode, f"{mode} injected", **measured)  # type: ignore[arg-type]
    r.result = result
    return r


def _rows(text: str) -> dict[str, list[str]]:
    out = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| Failure mode") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0]] = cells
    return out


def test_the_failure_table_has_a_row_only_for_a_test_that_passed() -> None:
    records = [
        _row(
            "node lost",
            "passed",
            detected_s=51.6,
            detected_note="NodeLost in status.failures",
            training_s=97.2,
            steps_lost=2,
            steps_note="step 10 logged, resumed from checkpoint 8",
            goal="NodeLost within nodeLossSeconds (30 s) + 10 s",
            goal_held=True,
            goal_note="31 s",
        ),
        _row("hang", "failed", detected_s=80.0),
        _row("node drained", "skipped"),
        _row("OOM", None),
        _row("drain", "passed", steps_lost=3, goal="drained work lost ≤ 1 step", goal_held=False, goal_note="3"),
    ]
    text = reliability.render_disruptions(records, written=datetime(2026, 12, 4, 22, 0, tzinfo=UTC))
    rows = _rows(text)
    assert list(rows) == ["node lost", "drain"]  # in the order the tests ran; nothing from a failed or skipped test
    assert rows["node lost"][2:] == [
        "52 s (NodeLost in status.failures)",
        "97 s",
        "2 (step 10 logged, resumed from checkpoint 8)",
        "NodeLost within nodeLossSeconds (30 s) + 10 s",
        "yes (31 s)",
    ]
    assert rows["drain"][2:] == ["—", "—", "3", "drained work lost ≤ 1 step", "NO (3)"]
    assert "Written 2026-12-04 22:00 UTC" in text


def test_a_pipe_in_a_cell_does_not_split_the_row() -> None:
    text = reliability.render_disruptions([_row("a | b", "passed")])
    assert "| a \\| b | a \\| b injected |" in text


def test_times_from_the_api_and_from_kubelet_log_timestamps() -> None:
    api = reliability.utc("2026-12-04T22:11:45Z")
    assert api == datetime(2026, 12, 4, 22, 11, 45, tzinfo=UTC)
    nano = reliability.utc("2026-12-04T22:11:46.123456789Z")
    assert reliability.seconds(api, nano) == pytest.approx(1.123456)
    assert reliability.utc("2026-12-04T22:11:46.5+00:00") - api == timedelta(seconds=1.5)


LOG = """2026-12-04T22:00:01.000000001Z loading the model
2026-12-04T22:00:02.5Z FTJOB_PROGRESS {"event":"train","step":10,"totalSteps":40}
2026-12-04T22:00:03Z FTJOB_PROGRESS {"event":"checkpoint","step":10}
2026-12-04T22:00:04Z FTJOB_PROGRESS {"event":"train","step":12,"totalSteps":40}
not a timestamp FTJOB_PROGRESS {"event":"train","step":99}
2026-12-04T22:00:09Z FTJOB_PROGRESS {"event":"train","step":14,"totalSteps":40}
"""


def test_progress_lines_with_the_kubelets_timestamps() -> None:
    lines = reliability.progress_lines(LOG)
    assert [r["event"] for _, r in lines] == ["train", "checkpoint", "train", "train"]
    assert reliability.last_step(lines) == 14
    # Training again: the first training line past the step resumed from.
    assert reliability.first_step_after(lines, 10) == (datetime(2026, 12, 4, 22, 0, 4, tzinfo=UTC), 12)
    assert reliability.first_step_after(lines, 14) is None
    assert reliability.last_step([]) is None


def test_the_committed_failure_table_lists_only_modes_the_e2e_tests_measure() -> None:
    """docs/reliability.md's e2e section is what `make test-e2e E2E_RELIABILITY_OUT=docs/reliability.md`
    writes: a row for a mode no e2e test records any more is out of date (and rewriting one section must not
    have broken the other's markers)."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "reliability.md").read_text()
    assert reliability.section(doc, "faults") is not None, "docs/reliability.md lost its `faults` section markers"
    table = reliability.section(doc, "e2e")
    if table is None:
        pytest.skip(
            "docs/reliability.md has no e2e section yet "
            "(`make test-e2e E2E_RELIABILITY_OUT=docs/reliability.md` writes it)"
        )
    declared: set[str] = set()
    for path in (root / "tests" / "e2e").glob("test_*.py"):
        declared |= set(re.findall(r'disruption\(\s*"([^"]+)"', path.read_text()))
    listed = set(_rows(table))
    assert listed, "the e2e section has no row"
    assert listed <= declared, f"rows for modes no e2e test records: {sorted(listed - declared)}; run make test-e2e"


def test_a_time_to_an_api_time_has_its_whole_second_resolution() -> None:
    # The API cuts its times to the second: a failure recorded 0.4 s after a fault at .6 reads as the fault's
    # own second, 0 s (never -1 s), and one at the next second as 1 s.
    fault = datetime(2026, 12, 4, 22, 0, 10, 600_000, tzinfo=UTC)
    assert reliability.api_seconds(fault, "2026-12-04T22:00:10Z") == 0
    assert reliability.api_seconds(fault, "2026-12-04T22:00:11Z") == 1
    assert reliability.api_seconds(fault, "2026-12-04T22:01:00Z") == 50


def test_a_failure_entry_reads_with_its_rank_and_exit_code() -> None:
    assert reliability.failure_note({"reason": "Error", "rank": 1, "exitCode": 137}) == (
        "rank 1 Error, exit code 137 in status.failures"
    )
    assert (
        reliability.failure_note({"reason": "Drained", "rank": 0, "node": "b"}) == "rank 0 Drained in status.failures"
    )
    assert reliability.failure_note({"reason": "Hung"}) == "Hung in status.failures"
