"""Real trainings on CPU: 2-rank torchrun and mpirun (MPICH, OpenMPI) of both tasks, kill + resume, the
accuracy of the demo job, the dataset cache, torch.compile precompile. Tiny models, few steps."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import (
    DEMO_CONFIG,
    SQUAD_CONFIG,
    alive,
    free_port,
    job_config,
    kill_tree,
    poll,
    run_runtime,
    runtime_argv,
    runtime_env,
)
from tierdeps import MPI_IMPLEMENTATIONS, mpi_env

from finetune_runtime import checkpoints, location

pytestmark = pytest.mark.slow


def _check_progress_stream(records: list[dict[str, object]], total: int) -> None:
    train = [r for r in records if r["event"] == "train"]
    assert train, "no train progress lines"
    steps = [int(str(r["step"])) for r in train]
    assert steps == sorted(steps) and steps[-1] <= total
    for r in train:
        assert r["totalSteps"] == total and isinstance(r["loss"], float)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", str(r["time"]))
    assert records[-1]["event"] == "done"


@pytest.mark.tf457
def test_demo_job_torchrun_two_ranks_accuracy_and_pipeline(tmp_path: Path) -> None:
    """The demo config exactly as shipped (examples/jobs/demo-ja-config.json), 2 ranks, gloo."""
    cfg = job_config(DEMO_CONFIG).write(tmp_path / "config.json")
    run = run_runtime(["launch"], runtime_env(tmp_path, cfg), tmp_path)
    assert run.rc == 0, run.out[-4000:]
    assert "rank 0 of 2 (torchrun)" in run.out
    assert "initialising the model from its config" in run.out
    done = run.done
    _check_progress_stream(run.progress, int(done["totalSteps"]))
    metrics = json.loads((run.output_dir / "metrics.json").read_text())
    assert metrics["evalRows"] == 64 and metrics["worldSize"] == 2
    # The eval split is balanced (32 negative / 32 positive): chance is 0.5.
    assert done["metrics"]["accuracy"] >= 0.7, done
    assert metrics["eval"]["accuracy"] == done["metrics"]["accuracy"]
    assert run.events("eval") and run.events("checkpoint")
    # Older checkpoints are rotated away (save_total_limit); the newest one announced must be complete.
    last = Path(str(run.events("checkpoint")[-1]["path"]))
    assert checkpoints.newest_complete(last.parent) == last
    assert all(checkpoints.is_complete(p) for _, p in checkpoints.list_checkpoints(last.parent))

    from transformers import pipeline

    from finetune_runtime.tokenization import load_tokenizer

    model_dir = run.output_dir / "model"
    clf = pipeline("text-classification", model=str(model_dir), tokenizer=load_tokenizer(str(model_dir)), device="cpu")
    good, bad = clf(
        ["家族にも好評で大満足です。本当におすすめです。", "最悪です。すぐに壊れました。二度と買いません。"]
    )
    assert good["label"] == "positive" and bad["label"] == "negative", (good, bad)
    preds = json.loads((run.output_dir / "predictions.json").read_text())
    assert len(preds["predictions"]) == 3
    assert {p["label"] for p in preds["predictions"]} <= {"negative", "positive"}


@pytest.mark.tf457
def test_question_answering_torchrun_two_ranks(tmp_path: Path) -> None:
    cfg = (
        job_config(SQUAD_CONFIG)
        .training(maxSteps=6, checkpointEverySteps=3, logEverySteps=2)
        .write(tmp_path / "config.json")
    )
    run = run_runtime(["launch"], runtime_env(tmp_path, cfg), tmp_path)
    assert run.rc == 0, run.out[-4000:]
    done = run.done
    assert done["step"] == 6 and set(done["metrics"]) >= {"exact_match", "f1"}
    assert 0.0 <= done["metrics"]["f1"] <= 100.0
    _check_progress_stream(run.progress, 6)
    preds = json.loads((run.output_dir / "predictions.json").read_text())
    from transformers.pipelines import SUPPORTED_TASKS

    # transformers 4.x has the question-answering pipeline; 5.x dropped it (the runtime's own path runs then)
    assert preds["method"].startswith("pipeline:") == ("question-answering" in SUPPORTED_TASKS)
    assert len(preds["predictions"]) == 3
    for p in preds["predictions"]:
        assert p["answer"] in p["context"]
    assert (run.output_dir / "model" / "config.json").exists()
    from finetune_runtime.tokenization import load_tokenizer

    tok = load_tokenizer(str(run.output_dir / "model"))  # the tokenizer is saved beside the model
    assert tok.tokenize("When was it built?") == ["when", "was", "it", "built", "?"]


def test_a_job_recreated_on_its_claim_directory_starts_fresh_and_loses_nothing(tmp_path: Path) -> None:
    """The output claim: a job deleted and created again under its name (new uid) mounts the same directory. It
    does not resume its predecessor's checkpoints, and moves the predecessor's model aside instead of overwriting
    it; a third job resumes from that directory because its spec says so (output.resumeFrom, mounted read-only)."""
    cfg = (
        job_config(DEMO_CONFIG)
        .training(maxSteps=4, epochs=100, checkpointEverySteps=2, logEverySteps=1, batchSizePerDevice=8)
        .write(tmp_path / "config.json")
    )
    old, new = "10000000-0000-4000-8000-000000000001", "20000000-0000-4000-8000-000000000002"
    first = run_runtime(["launch"], runtime_env(tmp_path, cfg, FTJOB_JOB_UID=old), tmp_path)
    assert first.rc == 0, first.out[-4000:]
    out = first.output_dir

    def files(d: Path) -> dict[Path, bytes]:
        return {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}

    old_checkpoints = files(out / "checkpoints")
    old_model = (out / "model" / "model.safetensors").read_bytes()

    second = run_runtime(["launch"], runtime_env(tmp_path, cfg, FTJOB_JOB_UID=new), tmp_path)
    assert second.rc == 0, second.out[-4000:]
    assert second.events("train") and second.events("train")[0]["step"] == 1, "a new job of an old name starts fresh"
    assert json.loads((out / "metrics.json").read_text())["resumedFrom"] is None
    now = files(out / "checkpoints")
    assert {k: now.get(k) for k in old_checkpoints} == old_checkpoints, "the old job's checkpoints are untouched"
    assert (out / "previous" / old / "model" / "model.safetensors").read_bytes() == old_model
    assert json.loads((out / "job.json").read_text())["uid"] == new
    old_ckpt = out / "checkpoints" / old / "checkpoint-4"
    assert checkpoints.newest_complete(old_ckpt.parent, old) == old_ckpt
    assert checkpoints.newest_complete(out / "checkpoints" / new, new) is not None

    third_dir = tmp_path / "third"
    third_dir.mkdir()
    cfg3 = job_config(DEMO_CONFIG).training(maxSteps=6, epochs=100, checkpointEverySteps=2, logEverySteps=1)
    env3 = runtime_env(
        third_dir,
        cfg3.training(batchSizePerDevice=8).write(third_dir / "config.json"),
        FTJOB_JOB_UID="30000000-0000-4000-8000-000000000003",
        FTJOB_RESUME_FROM=str(out / "checkpoints" / old),
    )
    env3["FTJOB_CACHE_DIR"] = str(tmp_path / "cache")
    third = run_runtime(["launch"], env3, third_dir)
    assert third.rc == 0, third.out[-4000:]
    assert third.events("train")[0]["step"] == 5, "output.resumeFrom: continues the old job's step 4"
    assert json.loads((third.output_dir / "metrics.json").read_text())["resumedFrom"] == str(old_ckpt)


def test_killed_run_resumes_from_newest_complete_checkpoint(tmp_path: Path, popen_group) -> None:  # type: ignore[no-untyped-def]
    cfg = (
        job_config(DEMO_CONFIG)
        .training(maxSteps=60, epochs=100, checkpointEverySteps=5, logEverySteps=1, batchSizePerDevice=8)
        .write(tmp_path / "config.json")
    )
    env = runtime_env(tmp_path, cfg)
    ckpt_root = tmp_path / "output" / location.checkpoint_dir(location.LOCAL_UID)  # no FTJOB_JOB_UID: a hand run
    with (tmp_path / "first.log").open("w") as log:
        proc = popen_group(runtime_argv("launch"), env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        poll(
            lambda: checkpoints.newest_complete(ckpt_root) or proc.poll() is not None,
            300,
            "the first complete checkpoint",
        )
        assert proc.poll() is None, "the run ended before it could be killed"
        pids = kill_tree(proc.pid)  # the whole pod dies: launcher and ranks
        proc.wait(timeout=60)
        poll(lambda: not alive(pids), 30, "the killed ranks to be gone")
    first = (tmp_path / "first.log").read_text()
    assert "cache miss" in first
    newest = checkpoints.newest_complete(ckpt_root)
    assert newest is not None
    killed_at = checkpoints.checkpoint_step(newest)
    assert killed_at is not None and killed_at < 60

    run = run_runtime(["launch"], {**env, "FTJOB_MASTER_PORT": str(free_port())}, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    assert f"resuming from {ckpt_root}/checkpoint-" in run.out
    assert "cache hit" in run.out, "the second run must reuse the tokenised dataset"
    resumed = json.loads((run.output_dir / "metrics.json").read_text())["resumedFrom"]
    resumed_step = checkpoints.checkpoint_step(Path(resumed))
    assert resumed_step is not None and resumed_step >= killed_at
    train = run.events("train")
    assert train[0]["step"] > resumed_step, "global step continues, not from 0"
    assert run.done["step"] == 60

    # A pod restarted after the last checkpoint: no step past max_steps, just the final artefacts again.
    again = run_runtime(["launch"], {**env, "FTJOB_MASTER_PORT": str(free_port())}, tmp_path)
    assert again.rc == 0, again.out[-4000:]
    assert "training had finished" in again.out and not again.events("train")
    assert again.done["step"] == 60 and (again.output_dir / "model" / "config.json").exists()


def _mpi_env(tmp_path: Path, cfg: Path, impl: str, request: pytest.FixtureRequest) -> dict[str, str]:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n" if impl == "openmpi" else "localhost:2\n")
    home = tmp_path / "home"
    home.mkdir()
    return runtime_env(
        tmp_path,
        cfg,
        FTJOB_LAUNCHER="mpi",
        **mpi_env(request, impl),
        FTJOB_HOSTFILE=str(hostfile),
        FTJOB_WORLD_SIZE="2",
        FTJOB_MPI_SLOTS_PER_NODE="2",
        FTJOB_SSH_SECRET_DIR=str(tmp_path / "no-secret"),
        HOME=str(home),
    )


@pytest.mark.parametrize("impl", MPI_IMPLEMENTATIONS)
@pytest.mark.parametrize("task", ["text-classification", "question-answering"])
def test_mpirun_two_ranks(tmp_path: Path, impl: str, task: str, request: pytest.FixtureRequest) -> None:
    base = DEMO_CONFIG if task == "text-classification" else SQUAD_CONFIG
    cfg = job_config(base).training(maxSteps=4, checkpointEverySteps=2, logEverySteps=1).write(tmp_path / "config.json")
    env = _mpi_env(tmp_path, cfg, impl, request)
    run = run_runtime(["mpirun"], env, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    source = "openmpi" if impl == "openmpi" else "hydra"
    assert f"rank 0 of 2 ({source})" in run.out  # PMI_*/OMPI_* were mapped onto RANK/WORLD_SIZE
    assert (tmp_path / "home" / ".ssh" / "config").exists()  # no FTJOB_SSH_DIR: the pods' default, ~/.ssh
    assert run.done["step"] == 4
    assert json.loads((run.output_dir / "metrics.json").read_text())["worldSize"] == 2
    key = "accuracy" if task == "text-classification" else "exact_match"
    assert key in run.done["metrics"]


def test_precompile_warms_the_torch_compile_cache(tmp_path: Path) -> None:
    """Two trials on one cache: the first compiles (cold), the second finds every graph in the cache (warm).
    Each reports so in its final record and, relayed by the launcher, in the termination message file that
    the kubelet turns into the init container's status (read by the operator for status.compileCache)."""
    cfg = (
        job_config(DEMO_CONFIG)
        .training(compile=True, batchSizePerDevice=4)
        .task(maxLength=32)
        .write(tmp_path / "config.json")
    )
    message = tmp_path / "termination-log"
    message.write_text("")  # the kubelet creates the file; the relay never does
    env = runtime_env(
        tmp_path, cfg, FTJOB_NPROC_PER_NODE="1", FTJOB_PRECOMPILE_STEPS="2", FTJOB_TERMINATION_LOG=str(message)
    )
    reports = []
    for trial in ("cold", "warm"):
        run = run_runtime(["launch", "--precompile"], env, tmp_path, timeout=540)
        assert run.rc == 0, run.out[-4000:]
        pre = run.events("precompile")
        assert pre and pre[-1].get("complete") is True and pre[-1]["step"] == 2
        assert not run.events("done") and not (run.output_dir / "model").exists()
        cache = tmp_path / "cache" / "torch-compile"
        assert pre[-1]["cacheDir"] == str(cache)
        assert sum(1 for p in cache.rglob("*") if p.is_file()) > 0, "inductor wrote nothing to the cache"
        relayed = json.loads(message.read_text())["compileCache"]
        assert relayed["steps"] == 2 and relayed["warm"] == pre[-1]["cache"]["warm"], (relayed, pre[-1])
        reports.append((trial, relayed))
    (_, cold), (_, warm) = reports
    assert cold["warm"] is False and cold["graphMisses"] > 0 and cold["entriesBefore"] == 0, cold
    assert warm["warm"] is True and warm["graphMisses"] == 0 and warm["graphHits"] > 0, warm
    assert warm["entriesBefore"] == cold["entriesAfter"] > 0, reports
