import json

import pytest

from finetune_operator import progress

LOG = """\
[rank0]: loading dataset
FTJOB_PROGRESS {"event":"train","step":120,"totalSteps":500,"epoch":1.2,"loss":0.41,\
"samplesPerSecond":35.2,"etaSeconds":96}
some noise
FTJOB_PROGRESS {"event":"eval","step":125,"totalSteps":500,"metrics":{"accuracy":0.86,"f1":0.85},\
"summaryMetric":"accuracy"}
FTJOB_PROGRESS {broken json
"""


def test_latest_state_keeps_step_and_metrics() -> None:
    p = progress.from_text(LOG)
    assert p is not None
    assert p["step"] == 125 and p["loss"] == 0.41 and p["metrics"]["accuracy"] == 0.86
    assert p["summary"] == "125/500 (25%) loss 0.41 accuracy 0.86 ETA 1m36s"


def test_no_lines_keeps_previous() -> None:
    prev = {"step": 3, "summary": "x"}
    assert progress.from_text("nothing here\n", prev) is prev


def test_done_summary() -> None:
    done = {"event": "done", "step": 500, "totalSteps": 500, "metrics": {"f1": 80.1, "exact_match": 71.2}}
    p = progress.fold([{**done, "summaryMetric": "exact_match"}])
    assert p is not None and p["summary"] == "500/500 (100%) exact_match 71.2 done"


def test_the_summary_shows_the_metric_the_task_names() -> None:
    """Each task plugin names its headline metric (summaryMetric); the summary once knew only accuracy, f1 and
    exact_match, so a causal-lm job showed no metric at all."""
    ev = {"event": "eval", "step": 8, "totalSteps": 10, "metrics": {"loss": 1.16, "perplexity": 3.19}}
    p = progress.fold([{**ev, "summaryMetric": "perplexity"}])
    assert p is not None and p["summary"] == "8/10 (80%) perplexity 3.19"
    later = progress.fold([{"event": "train", "step": 9, "totalSteps": 10, "loss": 1.1}], p)
    assert later is not None and "perplexity 3.19" in later["summary"], "kept across later lines"
    # A job's own command may print progress lines without summaryMetric: the alphabetically first metric.
    assert progress.fold([ev]) is not None and str(progress.fold([ev])["summary"]) == "8/10 (80%) loss 1.16"


def test_prefixed_lines_from_torchrun_are_parsed() -> None:
    rec = progress.parse_line('[default0]:FTJOB_PROGRESS {"event":"train","step":1}')
    assert rec == {"event": "train", "step": 1}


def test_text_joined_after_the_object_is_ignored() -> None:
    # Another MPI rank's output can land on the same launcher line after the newline-less write.
    rec = progress.parse_line('FTJOB_PROGRESS {"event":"train","step":7}[1] warning: something')
    assert rec == {"event": "train", "step": 7}


def test_nan_and_infinity_are_dropped() -> None:
    """Python's json reads NaN, Infinity and 1e999; a diverged loss must not reach the status or the summary."""
    text = (
        'FTJOB_PROGRESS {"event":"train","step":5,"totalSteps":10,"loss":0.5}\n'
        'FTJOB_PROGRESS {"event":"train","step":6,"totalSteps":10,"loss":NaN,"etaSeconds":Infinity,'
        '"samplesPerSecond":-Infinity,"metrics":{"accuracy":1e999,"f1":0.5},"learningRate":[1e999, 0.1]}\n'
    )
    p = progress.from_text(text)
    assert p is not None
    assert p["step"] == 6 and p["loss"] == 0.5  # the older finite loss stays
    assert "etaSeconds" not in p and "samplesPerSecond" not in p
    assert p["metrics"] == {"f1": 0.5} and p["learningRate"] == [0.1]
    json.dumps(p, allow_nan=False)  # what reaches the API server is plain JSON
    assert "nan" not in p["summary"] and "inf" not in p["summary"]


def test_runtime_parser_rejects_nan_and_infinity() -> None:
    from finetune_runtime.progress import format_line, parse_line

    for bad in ("NaN", "Infinity", "-Infinity", "1e999"):
        with pytest.raises(ValueError):
            parse_line('FTJOB_PROGRESS {"event":"train","loss":' + bad + "}")
    # The runtime writes a diverged loss as null, never as NaN.
    assert parse_line(format_line("train", loss=float("nan"), step=1)) == {"event": "train", "loss": None, "step": 1}


def test_time_to_first_step_from_the_train_lines_start_and_first_step() -> None:
    """startedAt (the launcher's start) and firstStepAt (the end of rank 0's first step) on a train line become
    timeToFirstStepSeconds; later lines carry the same two, and a new attempt's replace them (docs/runtime.md)."""
    line = 'FTJOB_PROGRESS {"event":"train","step":%d,"totalSteps":9,"loss":1.0,"startedAt":"%s","firstStepAt":"%s"}'
    t0, t1 = "2026-12-04T19:33:30.250Z", "2026-12-04T19:33:34.570Z"
    p = progress.from_text("\n".join([line % (1, t0, t1), line % (5, t0, t1)]))
    assert p is not None and p["timeToFirstStepSeconds"] == 4.32
    again = progress.from_text(line % (1, "2026-12-04T19:40:00.000Z", "2026-12-04T19:40:03.000Z"), p)
    assert again is not None and again["timeToFirstStepSeconds"] == 3.0
    # Lines without both, eval lines, and times that are malformed, naive or out of order change nothing.
    for text in (
        'FTJOB_PROGRESS {"event":"train","step":6,"totalSteps":9,"loss":1.0}',
        'FTJOB_PROGRESS {"event":"eval","step":6,"totalSteps":9,"metrics":{},'
        '"startedAt":"2026-12-04T19:40:00Z","firstStepAt":"2026-12-04T19:40:01Z"}',
        line % (6, "yesterday", t1),
        line % (6, "2026-12-04T19:33:30", t1),
        line % (6, t1, t0),
    ):
        later = progress.from_text(text, p)
        assert later is not None and later["timeToFirstStepSeconds"] == 4.32, text
    assert "timeToFirstStepSeconds" not in (progress.from_text(LOG) or {})
