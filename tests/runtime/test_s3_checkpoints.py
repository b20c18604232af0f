"""Checkpoints with an S3 output (output.url): uploaded as they are saved, restored after the pod (and its
emptyDir /output) is gone. Against a real S3 server (versitygw, `make versitygw`), through boto3 as in the pods."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    DEMO_CONFIG,
    ROOT,
    Run,
    alive,
    free_port,
    job_config,
    kill_tree,
    poll,
    run_runtime,
    runtime_argv,
    runtime_env,
)
from s3server import S3Server, versitygw
from tierdeps import require

from finetune_runtime import checkpoints
from finetune_runtime.s3sync import CheckpointSync, S3Location, S3Url

# boto3 and the server: not in the transformers-4.57 subset (its venv has no boto3).
pytestmark = pytest.mark.slow

BUCKET = "results"
UID = "11111111-aaaa-4aaa-8aaa-000000000001"
OTHER_UID = "22222222-bbbb-4bbb-8bbb-000000000002"


@pytest.fixture
def s3(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[S3Server]:
    with versitygw(require(request, "versitygw"), tmp_path) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


def _fake_checkpoint(root: Path, step: int, complete: bool = True, uid: str = UID) -> Path:
    """A checkpoint directory with the files checkpoints.is_complete looks for (contents are not loaded here)."""
    d = root / f"checkpoint-{step}"
    (d / "nested").mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 100}))
    (d / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (d / "nested" / "rng_state_1.pth").write_bytes(b"rng")
    if complete:
        checkpoints.mark_complete(d, uid)
    return d


def test_upload_rotate_and_restore_only_complete_checkpoints_of_this_job(tmp_path: Path, s3: S3Server) -> None:
    loc = S3Location(S3Url.parse(f"s3://{BUCKET}/jobs/demo/"), s3.client())
    sync = CheckpointSync(loc, UID, keep=2)
    local = tmp_path / "local"
    for step in (5, 10, 15):
        url = sync.upload(_fake_checkpoint(local, step))
        assert url == f"s3://{BUCKET}/jobs/demo/checkpoints/{UID}/checkpoint-{step}/"
    keys = s3.keys(BUCKET)
    assert {k.split("/")[4] for k in keys} == {"checkpoint-10", "checkpoint-15"}, "rotation keeps the newest 2"
    assert f"jobs/demo/checkpoints/{UID}/checkpoint-15/nested/rng_state_1.pth" in keys
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        sync.upload(_fake_checkpoint(local, 18, complete=False))

    # A pod killed mid-upload: checkpoint-20 has files but no marker. It is never restored.
    partial = _fake_checkpoint(tmp_path / "partial", 20, complete=False)
    s3.client().upload_file(
        str(partial / "model.safetensors"), BUCKET, f"jobs/demo/checkpoints/{UID}/checkpoint-20/model.safetensors"
    )
    # Another job of the same name (another uid) has a newer checkpoint in the same location: never restored,
    # and this job's rotation never deletes it.
    other = CheckpointSync(loc, OTHER_UID, keep=2)
    other.upload(_fake_checkpoint(tmp_path / "other", 30, uid=OTHER_UID))
    fresh = tmp_path / "fresh-pod"
    restored = sync.restore(fresh)
    assert restored is not None
    path, url = restored
    assert path == fresh / "checkpoint-15" and url.endswith(f"/checkpoints/{UID}/checkpoint-15/")
    assert checkpoints.newest_complete(fresh, UID) == path
    assert (path / "model.safetensors").read_bytes() == (local / "checkpoint-15" / "model.safetensors").read_bytes()
    assert (path / "nested" / "rng_state_1.pth").read_bytes() == b"rng"
    assert not list(fresh.glob(".download-*"))

    # A node that already has that checkpoint (or a newer one) downloads nothing.
    assert sync.restore(fresh) is None
    # The next upload's rotation removes the partial checkpoint-20 of the earlier life, and the oldest.
    sync.upload(_fake_checkpoint(local, 25))
    assert {k.split("/")[4] for k in s3.keys(BUCKET, f"jobs/demo/checkpoints/{UID}/")} == {
        "checkpoint-15",
        "checkpoint-25",
    }
    assert s3.keys(BUCKET, f"jobs/demo/checkpoints/{OTHER_UID}/checkpoint-30/"), "another job's: untouched"

    # A checkpoint under this job's uid whose marker names another job (copied there by hand) is refused.
    forged = _fake_checkpoint(tmp_path / "forged", 40, uid=OTHER_UID)
    for f in sorted(forged.rglob("*")):
        if f.is_file():
            loc.put(f, f"checkpoints/{UID}/checkpoint-40/{f.relative_to(forged).as_posix()}")
    again = sync.restore(tmp_path / "another-pod")
    assert again is not None and again[0].name == "checkpoint-25"


def test_bad_output_url_names_the_variable() -> None:
    with pytest.raises(ValueError, match="FTJOB_OUTPUT_URL must be an s3://bucket"):
        S3Url.parse("s3:///no-bucket")


def test_killed_run_with_s3_output_resumes_from_the_uploaded_checkpoint(
    tmp_path: Path,
    s3: S3Server,  # type: ignore[no-untyped-def]
    popen_group,
) -> None:
    """2-rank torchrun with output.url: the pod dies (its emptyDir /output with it), a new pod starts with an
    empty /output and continues from the newest checkpoint in S3, then uploads the final artefacts."""
    cfg = (
        job_config(DEMO_CONFIG)
        .training(maxSteps=40, epochs=100, checkpointEverySteps=5, logEverySteps=1, batchSizePerDevice=8)
        .write(tmp_path / "config.json")
    )
    url = f"s3://{BUCKET}/jobs/demo"
    env = runtime_env(tmp_path, cfg, FTJOB_OUTPUT_URL=url, FTJOB_JOB_UID=UID, **s3.env)
    output = Path(env["FTJOB_OUTPUT_DIR"])
    mine = f"jobs/demo/checkpoints/{UID}/"

    def remote_complete() -> list[str]:
        return [k for k in s3.keys(BUCKET, mine) if k.endswith(checkpoints.COMPLETE_MARKER)]

    with (tmp_path / "first.log").open("w") as log:
        proc = popen_group(runtime_argv("launch"), env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        poll(lambda: remote_complete() or proc.poll() is not None, 300, "the first checkpoint in S3")
        assert proc.poll() is None, "the run ended before it could be killed\n" + (tmp_path / "first.log").read_text()
        pids = kill_tree(proc.pid)
        proc.wait(timeout=60)
        poll(lambda: not alive(pids), 30, "the killed ranks to be gone")
    first = (tmp_path / "first.log").read_text()
    uploaded = [
        r
        for r in (
            json.loads(line.split("FTJOB_PROGRESS ", 1)[1]) for line in first.splitlines() if "FTJOB_PROGRESS " in line
        )
        if r["event"] == "checkpoint"
    ]
    assert uploaded and uploaded[0]["url"].startswith(f"{url}/checkpoints/{UID}/checkpoint-"), uploaded
    steps = sorted(int(k.split("/")[4].removeprefix("checkpoint-")) for k in remote_complete())
    assert steps and steps[-1] < 40

    shutil.rmtree(output)  # the new pod's emptyDir
    run = run_runtime(["launch"], {**env, "FTJOB_MASTER_PORT": str(free_port())}, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    resumed_step = int(json.loads((output / "metrics.json").read_text())["resumedFrom"].rsplit("-", 1)[1])
    assert resumed_step >= steps[-1] > 0
    src = f"{url}/checkpoints/{UID}/checkpoint-{resumed_step}/"
    assert f"downloaded checkpoint checkpoint-{resumed_step} from {src}" in run.out
    assert f"resuming from {output}/checkpoints/{UID}/checkpoint-{resumed_step} (downloaded from {src})" in run.out
    assert json.loads((output / "metrics.json").read_text())["resumedFromUrl"] == src
    train = run.events("train")
    assert train[0]["step"] > resumed_step, "global step continues from the S3 checkpoint, not from 0"
    assert run.done["step"] == 40 and run.done["outputDir"] == url

    final = s3.keys(BUCKET, "jobs/demo/")
    assert "jobs/demo/metrics.json" in final and "jobs/demo/model/config.json" in final
    assert (
        json.loads(s3.client().get_object(Bucket=BUCKET, Key="jobs/demo/metrics.json")["Body"].read())["globalStep"]
        == 40
    )
    remote = sorted({k.split("/")[4] for k in remote_complete()}, key=lambda n: int(n.split("-")[1]))
    assert remote[-1] == "checkpoint-40" and len(remote) <= 3, remote


# --- jobs sharing one output.url ---------------------------------------------------------------------------


def _job_env(name: str, uid: str, url: str, resume_from: str | None = None) -> dict[str, str]:
    """What the operator's builders give the pods of FineTuneJob `name` (uid `uid`) in namespace team with
    output.url `url`: its identity, its location and output.resumeFrom."""
    from finetune_operator.admission import validate
    from finetune_operator.builders import Names, resolve
    from finetune_operator.builders.env import derived_env, output_location

    doc = yaml.safe_load((ROOT / "manifests" / "samples" / "cpu-bert-ja.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": "team", "uid": uid}
    doc["spec"]["output"] = {"url": url, **({"resumeFrom": resume_from} if resume_from else {})}
    del doc["spec"]["compileCache"]
    job = validate(doc)
    layout = resolve(job)
    names = Names.of(job, layout.launcher)
    env = derived_env(job, layout, names)
    assert env["FTJOB_OUTPUT_URL"] == output_location(job, names) == f"{url}/team/{name}/"
    keep = ("FTJOB_JOB_NAME", "FTJOB_NAMESPACE", "FTJOB_JOB_UID", "FTJOB_OUTPUT_URL", "FTJOB_RESUME_FROM")
    return {k: v for k, v in env.items() if k in keep}


def _etags(s3: S3Server, prefix: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
    return out


def _train(tmp_path: Path, s3: S3Server, run_name: str, job_env: dict[str, str], **training: Any) -> Run:
    """One 2-rank run of the demo job in a fresh pod (empty scratch /output) with the job's env."""
    work = tmp_path / run_name
    work.mkdir()
    cfg = (
        job_config(DEMO_CONFIG)
        .training(**{"epochs": 100, "checkpointEverySteps": 4, "logEverySteps": 1, "batchSizePerDevice": 8, **training})
        .write(work / "config.json")
    )
    env = runtime_env(work, cfg, **job_env, **s3.env)
    env["FTJOB_CACHE_DIR"] = str(tmp_path / "cache")  # one cache claim: the tokenised dataset is built once
    run = run_runtime(["launch"], env, work)
    assert run.rc == 0, run.out[-4000:]
    return run


def _started_fresh(run: Run) -> bool:
    metrics = json.loads((run.output_dir / "metrics.json").read_text())
    return run.events("train")[0]["step"] == 1 and metrics["resumedFrom"] is None


def test_jobs_sharing_an_output_url_never_touch_each_others_checkpoints_or_models(tmp_path: Path, s3: S3Server) -> None:
    """Job a and job b share output.url; then a is deleted and created again (same name, new uid); then job c
    starts from a's checkpoints by output.resumeFrom. Each writes only its own location and uid."""
    url = f"s3://{BUCKET}/shared"
    uid_a, uid_b, uid_a2, uid_c = (f"{n}0000000-0000-4000-8000-00000000000{n}" for n in range(1, 5))
    a = _job_env("a", uid_a, url)
    run_a = _train(tmp_path, s3, "a", a, maxSteps=8)
    assert _started_fresh(run_a) and run_a.done["outputDir"] == f"{url}/team/a/"
    a_files = _etags(s3, "shared/team/a/")
    assert {"shared/team/a/model/config.json", "shared/team/a/metrics.json"} <= set(a_files)

    # b, same url: its own location; it neither resumes a's checkpoints nor rotates or overwrites anything of a's.
    run_b = _train(tmp_path, s3, "b", _job_env("b", uid_b, url), maxSteps=8)
    assert _started_fresh(run_b)
    assert _etags(s3, "shared/team/a/") == a_files
    assert all(k.startswith(("shared/team/a/", "shared/team/b/")) for k in s3.keys(BUCKET))

    # a, deleted and created again: same location, new uid. It starts fresh; a's checkpoints stay where they
    # are and its model, metrics and predictions move to previous/<old uid>/, unchanged.
    run_a2 = _train(tmp_path, s3, "a2", _job_env("a", uid_a2, url), maxSteps=8)
    assert _started_fresh(run_a2)
    now = _etags(s3, "shared/team/a/")
    for key, etag in a_files.items():
        rel = key.removeprefix("shared/team/a/")
        kept = key if rel.startswith("checkpoints/") else f"shared/team/a/previous/{uid_a}/{rel}"
        assert now.get(kept) == etag, f"{key} of the deleted job is gone or changed (looked for {kept})"
    assert f"shared/team/a/checkpoints/{uid_a}/checkpoint-8/{checkpoints.COMPLETE_MARKER}" in a_files
    job = json.loads(s3.client().get_object(Bucket=BUCKET, Key="shared/team/a/job.json")["Body"].read())
    assert job == {"namespace": "team", "name": "a", "uid": uid_a2}
    assert f"shared/team/a/checkpoints/{uid_a2}/checkpoint-8/{checkpoints.COMPLETE_MARKER}" in now

    # c resumes from a's location (status.output.location of a): the newest complete checkpoint there.
    run_c = _train(tmp_path, s3, "c", _job_env("c", uid_c, url, resume_from=f"{url}/team/a/"), maxSteps=12)
    metrics = json.loads((run_c.output_dir / "metrics.json").read_text())
    assert (
        metrics["resumedFromUrl"].startswith(f"{url}/team/a/checkpoints/")
        and "checkpoint-8" in metrics["resumedFromUrl"]
    )
    assert run_c.events("train")[0]["step"] == 9, "c continues a's run at step 8"
    assert run_c.done["step"] == 12
    assert f"shared/team/c/checkpoints/{uid_c}/checkpoint-12/{checkpoints.COMPLETE_MARKER}" in s3.keys(BUCKET)
    assert {k: v for k, v in _etags(s3, "shared/team/a/").items()} == now, "c only read a's location"
