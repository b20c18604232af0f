"""The precompile relay (finetune_runtime.relay): a launcher's output passes through unchanged, and the
trial's final record reaches the termination message file only when the trial succeeded and the file exists."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from finetune_runtime.progress import format_line
from finetune_runtime.relay import run_relaying, trial_report

REPORT = {"warm": True, "entriesBefore": 12, "entriesAfter": 12, "graphHits": 4, "graphMisses": 0}


def _child(tmp_path: Path, exit_code: int) -> list[str]:
    lines = [
        "[rank0]: starting",
        format_line("precompile", step=1, totalSteps=2),
        format_line("precompile", step=2, totalSteps=2, complete=True, cache=REPORT),
        "bye",
    ]
    script = tmp_path / "child.py"
    script.write_text(f"import sys\nfor x in {lines!r}: print(x, flush=True)\nsys.exit({exit_code})\n")
    return [sys.executable, str(script)]


def test_report_is_relayed_and_output_passes_through(tmp_path: Path, capfdbinary) -> None:  # type: ignore[no-untyped-def]
    message = tmp_path / "termination-log"
    message.write_text("")
    assert run_relaying(_child(tmp_path, 0), termination_log=message) == 0
    out = capfdbinary.readouterr().out.decode()
    assert out.splitlines()[0] == "[rank0]: starting" and out.splitlines()[-1] == "bye"
    doc = json.loads(message.read_text())
    assert doc == {"compileCache": {**REPORT, "steps": 2}}


def test_failed_trial_or_missing_file_writes_nothing(tmp_path: Path) -> None:
    message = tmp_path / "termination-log"
    message.write_text("")
    assert run_relaying(_child(tmp_path, 4), termination_log=message) == 4
    assert message.read_text() == ""  # the kubelet falls back to the log tail (FallbackToLogsOnError)
    absent = tmp_path / "absent"
    assert run_relaying(_child(tmp_path, 0), termination_log=absent) == 0
    assert not absent.exists()


def test_only_the_final_precompile_record_is_a_report() -> None:
    assert trial_report(format_line("precompile", step=1, totalSteps=2)) is None
    assert trial_report(format_line("train", step=2, complete=True)) is None
    assert trial_report("FTJOB_PROGRESS {not json") is None
    assert trial_report("noise " + format_line("precompile", step=2, complete=True))["step"] == 2  # type: ignore[index]
