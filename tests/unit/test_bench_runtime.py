"""benchmarks/runtime_overhead.py and data_prep.py: the timing lines they read and the summaries they write."""

from __future__ import annotations

import json
from pathlib import Path

import data_prep
import pytest
import runtime_overhead as ro

from finetune_runtime.progress import format_line

ROOT = Path(__file__).resolve().parents[2]


def test_step_of_reads_runtime_progress_lines_and_bare_lines() -> None:
    assert ro.step_of(format_line("train", step=10, totalSteps=30, loss=0.5)) == 10
    assert ro.step_of("2026-12-03 [rank 0] x: " + format_line("train", step=1, totalSteps=30)) == 1
    assert ro.step_of(format_line("eval", step=10, totalSteps=30, metrics={})) is None
    assert ro.step_of("BENCH-STEP 20") == 20
    assert ro.step_of("{'loss': 0.69}") is None


def test_samples_per_second_from_first_to_last_logged_step() -> None:
    lines = [
        (0.5, "loading"),
        (12.0, "BENCH-STEP 1"),
        (20.0, "BENCH-STEP 10"),
        (29.0, "{'eval_loss': 1}"),
        (32.0, "BENCH-STEP 20"),
        (35.0, "BENCH-DONE"),
    ]
    r = ro.result_from_lines("bare", lines, wall=36.0, batch=16)
    assert r.seconds_to_first_step == 12.0
    assert r.samples_per_second == pytest.approx(19 * 16 / 20.0, abs=0.01)
    assert r.steps == 20


def test_a_run_without_a_step_one_line_is_an_error() -> None:
    with pytest.raises(ValueError, match="step-1 line"):
        ro.result_from_lines("runtime", [(1.0, "BENCH-STEP 10"), (2.0, "BENCH-STEP 20")], 3.0, 16)


def test_summary_is_ratio_of_medians_and_per_pair_ratios() -> None:
    runs = [
        ro.RunResult("runtime", 5.0, 9.0, 0, 30),
        ro.RunResult("bare", 4.0, 10.0, 0, 30),
        ro.RunResult("runtime", 7.0, 10.0, 0, 30),
        ro.RunResult("bare", 6.0, 10.0, 0, 30),
        ro.RunResult("runtime", 6.0, 99.0, 0, 30),
        ro.RunResult("bare", 5.0, 11.0, 0, 30),
    ]
    s = ro.summarize(runs)
    assert s["median"]["runtime"] == {"samplesPerSecond": 10.0, "secondsToFirstStep": 6.0}
    assert s["median"]["bare"] == {"samplesPerSecond": 10.0, "secondsToFirstStep": 5.0}
    assert s["samplesPerSecondRatio"] == 1.0
    assert s["firstStepDelaySeconds"] == 1.0
    assert s["pairRatios"] == [0.9, 1.0, 9.0] and s["pairRatioMedian"] == 1.0


def test_scaled_data_repeats_rows_with_unique_ids(tmp_path: Path) -> None:
    texts = data_prep.write_scaled(tmp_path, 3)
    train = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    original = (ROOT / "examples/data/ja-reviews/train.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(train) == len(texts) == 3 * len(original)
    assert len({r["review_id"] for r in train}) == len(train)


def test_compile_cache_job_is_the_sample_with_a_trial_and_compile(tmp_path: Path) -> None:
    import compile_cache as cc

    from finetune_operator.admission import validate

    doc = cc.job_doc(trial_steps=3)
    spec = validate(doc)["spec"]  # what ftjob run checks first: the benchmark's job is a valid FineTuneJob
    assert spec["compileCache"] == {"precompile": True, "precompileSteps": 3} | {
        k: v for k, v in spec["compileCache"].items() if k not in ("precompile", "precompileSteps")
    }
    assert spec["training"]["compile"] is True and spec["hardware"]["procsPerNode"] == 1
    assert Path(spec["task"]["model"]).is_dir() and Path(spec["task"]["dataset"]["path"]).is_dir()
    log = tmp_path / "precompile-node0.log"
    log.write_text(
        "noise\n"
        + format_line("precompile", step=1)
        + "\n"
        + "[rank0]: "
        + format_line("precompile", step=2, complete=True, cache={"warm": True})
        + "\n"
    )
    assert [r["step"] for r in cc.records(log, "precompile")] == [1, 2]
    assert cc.records(log, "train") == [] and cc.records(tmp_path / "absent.log", "train") == []
