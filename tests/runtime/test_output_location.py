"""A job's location (issue: two jobs with one output.url shared <url>/checkpoints/, restored each other's
checkpoints, rotated each other's away and overwrote each other's model). Each job now has a location of its own,
`<url>/<namespace>/<job>/` or the claim's `<path>/<namespace>/<job>`, and inside it a job keeps to what carries its
uid: a job re-created under the same name starts fresh and loses nothing of its predecessor's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_runtime import checkpoints, location
from finetune_runtime.location import DirLocation, Identity, find_checkpoint, take_over

A = Identity("team", "bert", "11111111-aaaa-4aaa-8aaa-000000000001")
B = Identity("team", "bert", "22222222-bbbb-4bbb-8bbb-000000000002")


def _ckpt(root: Path, step: int, uid: str | None, weights: str = "model.safetensors") -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 100}))
    (d / weights).write_bytes(b"w" * 64)
    if uid is None:
        (d / checkpoints.COMPLETE_MARKER).write_text("ok\n")  # an older runtime's marker: no uid
    else:
        checkpoints.mark_complete(d, uid)
    return d


def test_a_checkpoint_records_the_uid_and_the_files_its_save_wrote(tmp_path: Path) -> None:
    mine = _ckpt(tmp_path, 5, A.uid)
    assert checkpoints.marker_uid(mine) == A.uid and checkpoints.is_complete(mine)
    theirs = _ckpt(tmp_path, 10, B.uid)
    legacy = _ckpt(tmp_path, 15, None)
    assert checkpoints.newest_complete(tmp_path) == legacy, "without a uid: the newest complete one, as before"
    assert checkpoints.newest_complete(tmp_path, A.uid) == mine, "another job's (or an unknown) one is refused"
    assert checkpoints.newest_complete(tmp_path, B.uid) == theirs
    assert checkpoints.foreign(tmp_path, A.uid) == [theirs, legacy]
    # A file the save wrote and that is gone since makes the checkpoint incomplete (whatever its name: a LoRA
    # checkpoint holds adapter weights, a full one the model's; no weight-file names are needed for that).
    (mine / "model.safetensors").unlink()
    assert not checkpoints.is_complete(mine) and checkpoints.newest_complete(tmp_path, A.uid) is None
    adapter = _ckpt(tmp_path, 20, A.uid, weights="adapter_model.safetensors")
    assert checkpoints.newest_complete(tmp_path, A.uid) == adapter


def test_a_new_job_of_the_same_name_moves_its_predecessors_final_artefacts_aside(tmp_path: Path) -> None:
    loc = DirLocation(tmp_path)
    assert take_over(loc, A) is None and json.loads((tmp_path / "job.json").read_text())["uid"] == A.uid
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"a": 1}')
    (tmp_path / "metrics.json").write_text('{"eval": {}}')
    (tmp_path / ".cache").mkdir()  # the runtime's own cache when FTJOB_CACHE_DIR is unset: not an artefact
    old = _ckpt(tmp_path / location.checkpoint_dir(A.uid), 5, A.uid)
    assert take_over(loc, A) is None, "the same job (a restart) keeps everything where it is"

    moved = take_over(loc, B)
    assert moved == (f"previous/{A.uid}", ["metrics.json", "model"])
    prev = tmp_path / "previous" / A.uid
    assert (prev / "model" / "config.json").read_text() == '{"a": 1}' and (prev / "metrics.json").exists()
    assert json.loads((prev / "job.json").read_text())["uid"] == A.uid, "the record goes with the artefacts"
    assert json.loads((tmp_path / "job.json").read_text())["uid"] == B.uid
    assert checkpoints.is_complete(old) and (tmp_path / ".cache").is_dir(), "checkpoints are uid-keyed: untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cache", "checkpoints", "job.json", "previous"]


def test_artefacts_of_an_older_runtime_move_to_previous_unknown_without_replacing_anything(tmp_path: Path) -> None:
    loc = DirLocation(tmp_path)
    for n in (1, 2):  # two generations without a job.json (an older runtime wrote them)
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "weights").write_text(str(n))
        (tmp_path / "job.json").unlink(missing_ok=True)
        take_over(loc, A if n == 1 else B)
    unknown = tmp_path / "previous" / "unknown"
    assert (unknown / "model" / "weights").read_text() == "1" and (unknown / "model-1" / "weights").read_text() == "2"


def test_resume_from_finds_the_newest_complete_checkpoint_of_a_location() -> None:
    marker = checkpoints.COMPLETE_MARKER
    keys = [
        f"checkpoints/{A.uid}/checkpoint-10/{marker}",
        f"checkpoints/{A.uid}/checkpoint-10/model.safetensors",
        f"checkpoints/{A.uid}/checkpoint-30/model.safetensors",  # cut off mid-upload: no marker
        f"checkpoints/{B.uid}/checkpoint-20/{marker}",
        f"checkpoints/checkpoint-15/{marker}",  # an older runtime's layout
        f"previous/{A.uid}/checkpoint-99/{marker}",  # not a checkpoint place
        "model/config.json",
    ]
    assert find_checkpoint(keys) == (f"checkpoints/{B.uid}/checkpoint-20", 20)
    assert find_checkpoint(k.removeprefix(f"checkpoints/{A.uid}/") for k in keys[:3]) == ("checkpoint-10", 10)
    assert find_checkpoint(["model/config.json"]) is None


def test_identity_comes_from_the_env_and_rejects_a_uid_that_is_no_path_segment() -> None:
    env = {"FTJOB_NAMESPACE": "team", "FTJOB_JOB_NAME": "bert", "FTJOB_JOB_UID": A.uid}
    assert Identity.from_env(env) == A
    assert Identity.from_env({}).uid == location.LOCAL_UID
    with pytest.raises(location.ConfigurationError, match="FTJOB_JOB_UID"):
        Identity.from_env({"FTJOB_JOB_UID": "../x"})
