"""spec.command with the MPI launcher: the launcher pod runs `ftjob-runtime mpirun -- CMD`, and every rank runs
the job's own command with the MPI rank environment (real MPICH, OpenMPI and Intel MPI, two local ranks). A rank
that fails takes the run down. HOME is a stand-in for a user's home that must stay as it was: the runtime's ssh
files go to FTJOB_SSH_DIR, as under `ftjob run`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from homes import SentinelHome
from tierdeps import MPI_IMPLEMENTATIONS, impi_versions, mpi_env

RUNTIME = str(Path(sys.executable).with_name("ftjob-runtime"))
# Intel MPI: every xeon image's version (the default, bare "intel", is the IPEX image's).
IMPLS = [*MPI_IMPLEMENTATIONS, *(f"intel-{v}" for v in sorted(set(impi_versions().values())))]
RANK = 'int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))'


def _run(
    request: pytest.FixtureRequest, tmp_path: Path, impl: str, prog: str | list[str], timeout: float = 120, **extra: str
) -> tuple[subprocess.CompletedProcess[str], SentinelHome]:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n" if impl == "openmpi" else "localhost:2\n")
    home = SentinelHome(tmp_path / "home")
    env = {
        **os.environ,
        **mpi_env(request, impl),
        "HOME": str(home.path),
        "FTJOB_HOSTFILE": str(hostfile),
        "FTJOB_WORLD_SIZE": "2",
        "FTJOB_MPI_SLOTS_PER_NODE": "2",
        "FTJOB_SSH_DIR": str(tmp_path / "ssh"),
        "FTJOB_SSH_SECRET_DIR": str(tmp_path / "none"),
        **extra,
    }
    argv = [sys.executable, "-c", prog] if isinstance(prog, str) else prog
    r = subprocess.run(
        [RUNTIME, "mpirun", "--", *argv], env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )
    return r, home


@pytest.mark.parametrize("impl", IMPLS)
def test_own_command_runs_on_every_rank(tmp_path: Path, impl: str, request: pytest.FixtureRequest) -> None:
    # One write per line: MPI launchers forward each rank's writes as they come, so a print() of several
    # parts (two writes each under PYTHONUNBUFFERED=1) interleaves with the other rank's ("rankrank 0").
    prog = f"import os; r = {RANK}; os.write(1, f'rank {{r}}\\n'.encode())"
    r, home = _run(request, tmp_path, impl, prog)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = sorted(x for x in r.stdout.splitlines() if x.startswith("rank "))
    assert ranks == ["rank 0", "rank 1"], r.stdout + r.stderr
    if impl.startswith("intel"):  # Intel's Hydra, not Debian MPICH's mpiexec.hydra found on PATH
        assert f"mpirun: I_MPI_ROOT={mpi_env(request, impl)['I_MPI_ROOT']}" in r.stdout, r.stdout
    assert (tmp_path / "ssh" / "config").exists() and (tmp_path / "ssh" / "ftjob-ssh").exists()
    home.assert_unchanged()


@pytest.mark.parametrize("impl", IMPLS)
def test_failed_rank_ends_the_run(tmp_path: Path, impl: str, request: pytest.FixtureRequest) -> None:
    """Rank 1 exits 7 while rank 0 waits on it over a socket, as a DDP rank waits in a collective: the run
    fails and no rank is left. (OpenMPI kills the other ranks itself; Hydra, MPICH's and Intel's, kills them only
    for MPI programs and otherwise waits until they notice the dead peer, as gloo/oneCCL do.)"""
    port = tmp_path / "rank0.port"
    prog = (
        f"import os, socket, sys, time\nr = {RANK}\n"
        f"if r == 0:\n"
        f"    s = socket.create_server(('127.0.0.1', 0)); open({str(port)!r} + '.tmp', 'w').write("
        f"f'{{os.getpid()}} {{s.getsockname()[1]}}'); os.rename({str(port)!r} + '.tmp', {str(port)!r})\n"
        f"    c, _ = s.accept(); c.recv(1) or sys.exit('rank 0: peer gone')\n"
        f"end = time.monotonic() + 60\n"
        f"while not os.path.exists({str(port)!r}) and time.monotonic() < end:\n    time.sleep(0.1)\n"
        f"socket.create_connection(('127.0.0.1', int(open({str(port)!r}).read().split()[1])))\n"
        f"os.write(2, b'rank 1 fails\\n'); os._exit(7)\n"
    )
    started = time.monotonic()
    r, home = _run(request, tmp_path, impl, prog)
    assert r.returncode != 0, r.stdout + r.stderr
    assert time.monotonic() - started < 100, "mpirun waited for the surviving rank"
    assert "rank 1 fails" in r.stdout + r.stderr
    rank0 = int(port.read_text().split()[0])
    end = time.monotonic() + 30
    while Path(f"/proc/{rank0}").exists() and time.monotonic() < end:
        time.sleep(0.2)  # poll until the deadline
    assert not Path(f"/proc/{rank0}").exists(), f"rank 0 (pid {rank0}) outlived the failed run"
    home.assert_unchanged()


@pytest.mark.parametrize("impl", [i for i in IMPLS if i.startswith("intel-")])
def test_intel_mpi_program_runs_with_the_wheels_library(
    tmp_path: Path, impl: str, request: pytest.FixtureRequest
) -> None:
    """An MPI program (the wheel's own IMB-MPI1 benchmark: MPI_Init, messages, MPI_Finalize) as a spec.command:
    with LD_LIBRARY_PATH=$I_MPI_ROOT/lib from the job's env, and no FI_PROVIDER, over loopback."""
    root = mpi_env(request, impl)["I_MPI_ROOT"]
    r, home = _run(
        request,
        tmp_path,
        impl,
        [f"{root}/bin/IMB-MPI1", "PingPong", "-msglog", "2:3"],
        LD_LIBRARY_PATH=f"{root}/lib",
        I_MPI_DEBUG="5",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    major_minor = ".".join(impl.partition("-")[2].split(".")[:2])  # Intel prints "Version 2021.15  Build ..."
    assert f"Intel(R) MPI Library, Version {major_minor}" in r.stdout, r.stdout[-3000:]
    assert "#processes = 2" in r.stdout and "All processes entering MPI_Finalize" in r.stdout
    home.assert_unchanged()
