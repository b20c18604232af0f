"""`ftjob run` of `spec.command` jobs: the command runs as in its pods, with the pods' environment (the PET_*
variables torchrun takes its defaults from; `ftjob-runtime mpirun -- COMMAND` for MPI), and the progress
display: a tqdm bar on a terminal (a real pty), plain lines on a pipe."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import accelerate
import pytest
import yaml
from tierdeps import MPI_IMPLEMENTATIONS, mpi_env

FTJOB = str(Path(sys.executable).with_name("ftjob"))
# A distributed script we did not write: accelerate's own check that gradients are (not) synchronised across
# ranks inside and outside `no_sync`/`accumulate`. It takes the MULTI_CPU path only when it sees a world > 1.
ACCELERATE_TEST_SYNC = Path(accelerate.__file__).parent / "test_utils" / "scripts" / "test_sync.py"

# A plain torch.distributed script: no launcher code of ours; torchrun (reading PET_*) sets RANK, WORLD_SIZE...
ALL_REDUCE = """\
import json, os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(), "group": os.environ["GROUP_RANK"]}
open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w").write(json.dumps(out))
dist.destroy_process_group()
"""

# Prints the runtime's progress lines, as a user's script may (docs/architecture.md, "Progress lines").
PROGRESS = """\
import json, os, time
for step in range(1, 21):
    rec = {"event": "train", "step": step, "totalSteps": 20, "loss": 1.0 / step, "samplesPerSecond": 12.5}
    os.write(1, ("FTJOB_PROGRESS " + json.dumps(rec) + "\\n").encode())
    time.sleep(0.05)
rec = {"event": "done", "step": 20, "totalSteps": 20, "metrics": {"accuracy": 0.75}}
os.write(1, ("FTJOB_PROGRESS " + json.dumps(rec) + "\\n").encode())
"""


def _job(tmp_path: Path, command: list[str], env: dict[str, str] | None = None, **hardware: Any) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "own"},
        "spec": {"hardware": {"profile": "cpu", **hardware}, "command": command},
    }
    if env:
        doc["spec"]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _ftjob_run(
    tmp_path: Path, job: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FTJOB, "run", "-f", str(job), "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _log(tmp_path: Path, node: int = 0) -> str:
    return (tmp_path / "w" / "logs" / f"train-node{node}.log").read_text()


def test_bare_torchrun_forms_one_world_across_two_nodes(tmp_path: Path) -> None:
    """Two local "pods", each running `torchrun all_reduce.py` with no flags: without PET_* each would start a
    world of its own (rank 0 of 1, sum 1); with them, one world of 2 ranks across both."""
    (tmp_path / "all_reduce.py").write_text(ALL_REDUCE)
    out = tmp_path / "ranks"
    out.mkdir()
    r = _ftjob_run(tmp_path, _job(tmp_path, ["torchrun", "all_reduce.py", str(out)], nodes=2, procsPerNode=1))
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda x: x["rank"])
    assert [(x["rank"], x["world"], x["sum"]) for x in ranks] == [(0, 2, 3.0), (1, 2, 3.0)], ranks
    assert {x["group"] for x in ranks} == {"0", "1"}  # each node's torchrun took its node rank from PET_NODE_RANK
    assert "`torchrun all_reduce.py" in r.stderr and "torchrun, 2 node(s) x 1 process(es)" in r.stderr


# Runs accelerate's script, then leaves without the interpreter's finalisation. After the script has passed and
# destroyed its process group, rank 0 now and then still aborts while Python tears down ("terminate called without
# an active exception", SIGABRT, no Python frame left: the c10d/gloo teardown-at-exit class of pytorch/pytorch#190489
# and #179291), which failed the run (and CI once) after every check had passed. A failing check still raises
# before os._exit, and the rank exits non-zero.
RUN_THEN_EXIT = """\
import os, runpy, sys
runpy.run_path(sys.argv[1], run_name="__main__")
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def test_accelerate_sync_check_runs_on_two_ranks(tmp_path: Path) -> None:
    (tmp_path / "run_then_exit.py").write_text(RUN_THEN_EXIT)
    # ACCELERATE_USE_CPU: what `accelerate launch --cpu` sets; without it accelerate looks for a GPU backend.
    job = _job(
        tmp_path,
        ["torchrun", "run_then_exit.py", str(ACCELERATE_TEST_SYNC)],
        {"ACCELERATE_USE_CPU": "true"},
        nodes=1,
        procsPerNode=2,
    )
    r = _ftjob_run(tmp_path, job)
    log = _log(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:] + log[-3000:]
    # Printed only on the distributed path (DistributedType.MULTI_CPU): both ranks formed one gloo world.
    assert "**Test Distributed `no_sync` context manager**" in log, log[-3000:]
    assert "**Test Distributed `no_sync` context manager with multiple forwards**" in log


def test_failing_command_fails_the_run_with_its_last_lines(tmp_path: Path) -> None:
    script = "import os, sys; sys.stderr.write('boom on ' + os.environ['PET_NODE_RANK'] + '\\n'); sys.exit(3)"
    r = _ftjob_run(tmp_path, _job(tmp_path, [sys.executable, "-c", script]), timeout=120)
    assert r.returncode == 3
    assert "exited with 3" in r.stderr and "boom on 0" in r.stderr


def test_missing_command_is_named_before_anything_runs(tmp_path: Path) -> None:
    r = _ftjob_run(tmp_path, _job(tmp_path, ["no-such-launcher-here", "x.py"]), timeout=120)
    assert r.returncode != 0 and "spec.command[0] 'no-such-launcher-here' is not on PATH" in r.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("impl", MPI_IMPLEMENTATIONS)
def test_mpi_command_runs_on_every_rank(tmp_path: Path, impl: str, request: pytest.FixtureRequest) -> None:
    doc = yaml.safe_load(
        _job(
            tmp_path,
            [
                sys.executable,
                "-c",
                (
                    "import os; r = os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')); "
                    "os.write(1, f'rank {r} of {os.environ[\"FTJOB_WORLD_SIZE\"]}\\n'.encode())"
                ),
            ],
            nodes=1,
            procsPerNode=2,
        ).read_text()
    )
    doc["spec"]["launcher"] = "mpi"
    doc["spec"]["mpi"] = {"implementation": impl}
    job = tmp_path / "mpi.yaml"
    job.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in mpi_env(request, impl).items() if k != "FTJOB_MPI_IMPLEMENTATION"}  # the spec's
    r = _ftjob_run(tmp_path, job, env, timeout=180)
    log = _log(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:] + log[-3000:]
    assert sorted(x for x in log.splitlines() if x.startswith("rank ")) == ["rank 0 of 2", "rank 1 of 2"], log


def test_progress_is_plain_lines_on_a_pipe(tmp_path: Path) -> None:
    (tmp_path / "progress.py").write_text(PROGRESS)
    r = _ftjob_run(tmp_path, _job(tmp_path, [sys.executable, "progress.py"]), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "\r" not in r.stderr and "\x1b" not in r.stderr  # nothing a log file or CI would show as noise
    assert "train 20/20 (100%) accuracy 0.75 done\n" in r.stderr, r.stderr


def test_progress_is_a_bar_on_a_terminal(tmp_path: Path) -> None:
    """ftjob's stderr on a real pseudo-terminal (80 columns, as a terminal reports): tqdm redraws one line."""
    (tmp_path / "progress.py").write_text(PROGRESS)
    job = _job(tmp_path, [sys.executable, "progress.py"])
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    p = subprocess.Popen(
        [FTJOB, "run", "-f", str(job), "--workdir", str(tmp_path / "w")],
        stdin=slave,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        cwd=tmp_path,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        elif p.poll() is not None:
            break
    os.close(master)
    assert p.wait(timeout=30) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert "train: 100%|" in screen and "| 20/20 [" in screen, screen  # tqdm's bar, counter and timing
    assert "\r" in screen  # redrawn in place
    assert "loss 0.05, 12.5 samples/s" in screen, screen
    assert "train 20/20 (100%) accuracy 0.75 done" in screen  # the end, written above the bar
