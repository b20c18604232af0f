"""Checkpoint on SIGTERM (runtime preemption.py), with real torchrun and mpirun trainings on CPU: one rank
signalled alone (the drained node's) makes every rank save the same step and stop; torchrun's own SIGTERM (what
the kubelet sends a rank pod) is passed on to its workers; the next run resumes from the step the signal
interrupted, not from an older periodic checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import (
    DEMO_CONFIG,
    descendants,
    free_port,
    job_config,
    poll,
    progress_records,
    run_runtime,
    runtime_argv,
    runtime_env,
)
from test_training import _mpi_env
from tierdeps import MPI_IMPLEMENTATIONS

from finetune_runtime import checkpoints, location

# Periodic checkpoints never fall due in these runs: any checkpoint is the signal's.
NO_PERIODIC = 100_000


def _workers(pid: int) -> dict[int, int]:
    """rank -> pid of the runtime's worker processes below `pid`: their rank from /proc/<pid>/environ, as torchrun
    (RANK) or mpirun (PMI_RANK under hydra, OMPI_COMM_WORLD_RANK under Open MPI; the worker maps it onto RANK in
    its own environment later, which /proc does not show) set it."""
    out = {}
    for child in descendants(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            env = dict(
                kv.split(b"=", 1) for kv in Path(f"/proc/{child}/environ").read_bytes().split(b"\0") if b"=" in kv
            )
        except OSError:
            continue
        rank = next((env[k] for k in (b"RANK", b"PMI_RANK", b"OMPI_COMM_WORLD_RANK") if k in env), None)
        if b"finetune_runtime" in cmd and b"worker" in cmd and rank is not None:
            out[int(rank)] = child
    return out


def _last_train_step(log: Path) -> int:
    steps = [r["step"] for r in progress_records(log.read_text()) if r.get("event") == "train"]
    return max(steps, default=0)


def _interrupt(
    tmp_path: Path, env: dict[str, str], argv: list[str], name: str, popen_group, signal_target
) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """Runs `argv` until rank 0 has reported 3 training steps, signals `signal_target(proc)`, waits for the end;
    returns the step rank 0 had reported when the signal went out, and the output."""
    log = tmp_path / f"{name}.log"
    with log.open("w") as out:
        proc = popen_group(argv, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        poll(lambda: _last_train_step(log) >= 3 or proc.poll() is not None, 300, "3 training steps")
        assert proc.poll() is None, log.read_text()[-4000:]
        at = _last_train_step(log)
        os.kill(signal_target(proc), signal.SIGTERM)
        rc = proc.wait(timeout=240)
    text = log.read_text()
    assert rc != 0, "an interrupted run must never exit 0 (its pod would read as a finished job)"
    return at, text


def test_sigterm_to_one_rank_saves_the_current_step_on_every_rank_and_torchrun_passes_its_own_on(
    tmp_path: Path,
    popen_group,  # type: ignore[no-untyped-def]
) -> None:
    cfg = job_config(DEMO_CONFIG).training(
        maxSteps=2000, epochs=100, checkpointEverySteps=NO_PERIODIC, logEverySteps=1, batchSizePerDevice=8
    )
    cfg.write(tmp_path / "config.json")
    env = runtime_env(tmp_path, tmp_path / "config.json", FTJOB_TERMINATION_GRACE_SECONDS="120")
    ckpts = tmp_path / "output" / location.checkpoint_dir(location.LOCAL_UID)

    # Only rank 1 is signalled, as when only its node is drained: both ranks save one step and stop.
    at, out = _interrupt(tmp_path, env, runtime_argv("launch"), "first", popen_group, lambda p: _workers(p.pid)[1])
    saved = checkpoints.newest_complete(ckpts)
    assert saved is not None, out[-4000:]
    step = checkpoints.checkpoint_step(saved)
    assert step is not None and step >= at, (step, at)
    assert f"signal {int(signal.SIGTERM)}: saving checkpoint-{step} and stopping" in out  # rank 1
    assert f"another rank's signal: saving checkpoint-{step} and stopping" in out  # rank 0, never signalled
    assert [p.name for p in ckpts.iterdir()] == [f"checkpoint-{step}"]  # the signal's, and only it

    # The pod's own SIGTERM goes to torchrun, which passes it on to both workers: again one step saved by both.
    env2 = {**env, "FTJOB_MASTER_PORT": str(free_port())}
    at2, out2 = _interrupt(tmp_path, env2, runtime_argv("launch"), "second", popen_group, lambda p: p.pid)
    assert f"resuming from {saved}" in out2
    first = next(r["step"] for r in progress_records(out2) if r.get("event") == "train")
    assert first == step + 1, "the second run continues from the saved step"
    again = checkpoints.newest_complete(ckpts)
    assert again is not None and (checkpoints.checkpoint_step(again) or 0) >= at2 > step

    # The next run resumes from there and finishes.
    job_config(DEMO_CONFIG).training(
        maxSteps=(checkpoints.checkpoint_step(again) or 0) + 2,
        epochs=100,
        checkpointEverySteps=NO_PERIODIC,
        logEverySteps=1,
        batchSizePerDevice=8,
    ).write(tmp_path / "config.json")
    run = run_runtime(["launch"], {**env, "FTJOB_MASTER_PORT": str(free_port())}, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    assert run.events("train")[0]["step"] == (checkpoints.checkpoint_step(again) or 0) + 1


@pytest.mark.parametrize("impl", MPI_IMPLEMENTATIONS)
def test_sigterm_to_one_mpi_rank_saves_the_same_step_on_every_rank(
    tmp_path: Path,
    impl: str,
    request: pytest.FixtureRequest,
    popen_group,  # type: ignore[no-untyped-def]
) -> None:
    """Under mpirun the flag travels the same way: rank 1 alone is signalled (as the sshd of its drained worker
    pod passes the kubelet's SIGTERM to the ranks in its pod, runtime sshd.py), both ranks save, mpirun exits
    non-zero."""
    cfg = job_config(DEMO_CONFIG).training(
        maxSteps=2000, epochs=100, checkpointEverySteps=NO_PERIODIC, logEverySteps=1, batchSizePerDevice=8
    )
    cfg.write(tmp_path / "config.json")
    env = _mpi_env(tmp_path, tmp_path / "config.json", impl, request)
    ckpts = tmp_path / "output" / location.checkpoint_dir(location.LOCAL_UID)
    at, out = _interrupt(tmp_path, env, runtime_argv("mpirun"), "mpi", popen_group, lambda p: _workers(p.pid)[1])
    saved = checkpoints.newest_complete(ckpts)
    assert saved is not None, out[-4000:]
    step = checkpoints.checkpoint_step(saved)
    assert step is not None and step >= at, (step, at)
    assert f"another rank's signal: saving checkpoint-{step} and stopping" in out, out[-4000:]
