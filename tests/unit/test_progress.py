from finetune_operator import progress

LOG = """\
[rank0]: loading dataset
FTJOB_PROGRESS {"event":"train","step":120,"totalSteps":500,"epoch":1.2,"loss":0.41,\
"samplesPerSecond":35.2,"etaSeconds":96}
some noise
FTJOB_PROGRESS {"event":"eval","step":125,"totalSteps":500,"metrics":{"accuracy":0.86,"f1":0.85}}
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
    p = progress.fold([{"event": "done", "step": 500, "totalSteps": 500, "metrics": {"exact_match": 71.2}}])
    assert p is not None and p["summary"] == "500/500 (100%) exact_match 71.2 done"


def test_prefixed_lines_from_torchrun_are_parsed() -> None:
    rec = progress.parse_line('[default0]:FTJOB_PROGRESS {"event":"train","step":1}')
    assert rec == {"event": "train", "step": 1}


def test_text_joined_after_the_object_is_ignored() -> None:
    # Another MPI rank's output can land on the same launcher line after the newline-less write.
    rec = progress.parse_line('FTJOB_PROGRESS {"event":"train","step":7}[1] warning: something')
    assert rec == {"event": "train", "step": 7}
