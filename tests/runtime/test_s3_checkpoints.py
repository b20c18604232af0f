"""Checkpoints with an S3 output (output.url): uploaded as they are saved, restored after the pod (and its
emptyDir /output) is gone. Against a real S3 server (versitygw, `make versitygw`), through boto3 as in the pods."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEMO_CONFIG, alive, free_port, job_config, kill_tree, poll, run_runtime, runtime_argv, runtime_env
from s3server import S3Server, versitygw
from tierdeps import require

from finetune_runtime import checkpoints
from finetune_runtime.s3sync import CheckpointSync

# boto3 and the server: not in the transformers-4.57 subset (its venv has no boto3).
pytestmark = pytest.mark.slow

BUCKET = "results"


@pytest.fixture
def s3(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[S3Server]:
    with versitygw(require(request, "versitygw"), tmp_path) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


def _fake_checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    """A checkpoint directory with the files checkpoints.is_complete looks for (contents are not loaded here)."""
    d = root / f"checkpoint-{step}"
    (d / "nested").mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 100}))
    (d / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (d / "nested" / "rng_state_1.pth").write_bytes(b"rng")
    if complete:
        checkpoints.mark_complete(d)
    return d


def test_upload_rotate_and_restore_only_complete_checkpoints(
    tmp_path: Path, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    sync = CheckpointSync(f"s3://{BUCKET}/jobs/demo/", s3.client(), keep=2)
    local = tmp_path / "local"
    for step in (5, 10, 15):
        url = sync.upload(_fake_checkpoint(local, step))
        assert url == f"s3://{BUCKET}/jobs/demo/checkpoints/checkpoint-{step}/"
    keys = s3.keys(BUCKET)
    assert {k.split("/")[3] for k in keys} == {"checkpoint-10", "checkpoint-15"}, "rotation keeps the newest 2"
    assert "jobs/demo/checkpoints/checkpoint-15/nested/rng_state_1.pth" in keys
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        sync.upload(_fake_checkpoint(local, 18, complete=False))

    # A pod killed mid-upload: checkpoint-20 has files but no marker. It is never restored.
    partial = _fake_checkpoint(tmp_path / "partial", 20, complete=False)
    s3.client().upload_file(
        str(partial / "model.safetensors"), BUCKET, "jobs/demo/checkpoints/checkpoint-20/model.safetensors"
    )
    fresh = tmp_path / "fresh-pod"
    restored = sync.restore(fresh)
    assert restored is not None
    path, url = restored
    assert path == fresh / "checkpoint-15" and url.endswith("/checkpoints/checkpoint-15/")
    assert checkpoints.newest_complete(fresh) == path
    assert (path / "model.safetensors").read_bytes() == (local / "checkpoint-15" / "model.safetensors").read_bytes()
    assert (path / "nested" / "rng_state_1.pth").read_bytes() == b"rng"
    assert not list(fresh.glob(".download-*"))

    # A node that already has that checkpoint (or a newer one) downloads nothing.
    assert sync.restore(fresh) is None
    # The next upload's rotation removes the partial checkpoint-20 of the earlier life, and the oldest.
    sync.upload(_fake_checkpoint(local, 25))
    assert {k.split("/")[3] for k in s3.keys(BUCKET)} == {"checkpoint-15", "checkpoint-25"}


def test_bad_output_url_names_the_variable() -> None:
    with pytest.raises(ValueError, match="FTJOB_OUTPUT_URL must be an s3://bucket"):
        CheckpointSync("s3:///no-bucket", client=None, keep=3)


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
    env = runtime_env(tmp_path, cfg, FTJOB_OUTPUT_URL=url, **s3.env)
    output = Path(env["FTJOB_OUTPUT_DIR"])

    def remote_complete() -> list[str]:
        return [k for k in s3.keys(BUCKET, "jobs/demo/checkpoints/") if k.endswith(checkpoints.COMPLETE_MARKER)]

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
    assert uploaded and uploaded[0]["url"].startswith(f"{url}/checkpoints/checkpoint-"), uploaded
    steps = sorted(int(k.split("/")[3].removeprefix("checkpoint-")) for k in remote_complete())
    assert steps and steps[-1] < 40

    shutil.rmtree(output)  # the new pod's emptyDir
    run = run_runtime(["launch"], {**env, "FTJOB_MASTER_PORT": str(free_port())}, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    resumed_step = int(json.loads((output / "metrics.json").read_text())["resumedFrom"].rsplit("-", 1)[1])
    assert resumed_step >= steps[-1] > 0
    src = f"{url}/checkpoints/checkpoint-{resumed_step}/"
    assert f"downloaded checkpoint checkpoint-{resumed_step} from {src}" in run.out
    assert f"resuming from {output}/checkpoints/checkpoint-{resumed_step} (downloaded from {src})" in run.out
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
    remote = sorted({k.split("/")[3] for k in remote_complete()}, key=lambda n: int(n.split("-")[1]))
    assert remote[-1] == "checkpoint-40" and len(remote) <= 3, remote
