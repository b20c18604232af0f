"""spec.command with the MPI launcher: the launcher pod runs `ftjob-runtime mpirun -- CMD`, and every rank runs
the job's own command with the MPI rank environment (real MPICH and OpenMPI, two local ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNTIME = str(Path(sys.executable).with_name("ftjob-runtime"))


@pytest.mark.parametrize(("impl", "line"), [("mpich", "localhost:2\n"), ("openmpi", "localhost slots=2\n")])
def test_own_command_runs_on_every_rank(tmp_path: Path, impl: str, line: str) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(line)
    env = {**os.environ, "HOME": str(tmp_path), "FTJOB_MPI_IMPLEMENTATION": impl, "FTJOB_HOSTFILE": str(hostfile),
           "FTJOB_WORLD_SIZE": "2", "FTJOB_MPI_SLOTS_PER_NODE": "2", "FTJOB_SSH_SECRET_DIR": str(tmp_path / "none")}
    # One write per line: MPI launchers forward each rank's writes as they come, so a print() of several
    # parts (two writes each under PYTHONUNBUFFERED=1) interleaves with the other rank's ("rankrank 0").
    prog = ("import os; r = os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')); "
            "os.write(1, f'rank {r}\\n'.encode())")
    r = subprocess.run([RUNTIME, "mpirun", "--", sys.executable, "-c", prog], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = sorted(x for x in r.stdout.splitlines() if x.startswith("rank "))
    assert ranks == ["rank 0", "rank 1"], r.stdout + r.stderr
