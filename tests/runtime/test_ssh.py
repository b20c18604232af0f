"""`sshd`, `wait-for --ssh` and the ssh client config written by `mpirun`: a real sshd on a free local port."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import DEMO_CONFIG, ROOT, free_port, job_config, run_runtime, runtime_argv, runtime_env
from homes import SentinelHome
from tierdeps import MPI_IMPLEMENTATIONS, mpi_env, require

from finetune_runtime.launcher import write_ssh_config
from finetune_runtime.sshd import install_keys


@pytest.fixture(autouse=True)
def _ssh_installed(request: pytest.FixtureRequest) -> None:
    """sshd and ssh, from the packages `make test-runtime` installs (fails, naming the target, if missing)."""
    require(request, "sshd")
    require(request, "ssh")


def _strict_modes_ok(d: Path) -> bool:
    return all(not (p.stat().st_mode & 0o022) for p in [d, *d.parents])


def _out_dir() -> Path:
    """A parent for the test's HOME whose ancestors no one else can write (what sshd's StrictModes wants)."""
    for d in (ROOT / "_out", Path.home() / ".cache" / "finetune-operator"):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
        if _strict_modes_ok(d):
            return d
    pytest.skip("no directory without group/world-writable ancestors for sshd's StrictModes")


def _secret(tmp_path: Path) -> Path:
    """What the operator's {job}-ssh Secret holds: a client key pair (authorized) and a host key pair."""
    d = tmp_path / "secret"
    d.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id_ed25519")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "ssh_host_ed25519_key")],
                   check=True)
    shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
    for f in d.iterdir():
        f.chmod(0o400)  # the Secret volume's defaultMode
    return d


def test_sshd_accepts_the_job_key_and_wait_for_sees_it(tmp_path: Path, popen_group,  # type: ignore[no-untyped-def]
                                                        request: pytest.FixtureRequest) -> None:
    secret = _secret(tmp_path)
    port = free_port()
    # sshd's StrictModes rejects keys below a world-writable directory such as /tmp; pods have
    # HOME=/home/ftjob. A home under the repository's _out/ (0755 parents) stands in for it.
    home = Path(tempfile.mkdtemp(prefix="ssh-home-", dir=_out_dir()))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    env = {"PATH": "/usr/sbin:/usr/bin:/bin", "HOME": str(home), "FTJOB_SSH_PORT": str(port),
           "FTJOB_SSH_SECRET_DIR": str(secret)}
    env = {**os.environ, **env}
    closed = subprocess.run(runtime_argv("wait-for", "--ssh", f"127.0.0.1:{port}", "--timeout", "1"), env=env,
                            capture_output=True, text=True, check=False, timeout=60)
    assert closed.returncode == 1 and "TIMEOUT" in closed.stdout and f"127.0.0.1:{port}" in closed.stdout

    with (tmp_path / "sshd.log").open("w") as log:
        sshd = popen_group(runtime_argv("sshd"), env=env, stdout=log, stderr=subprocess.STDOUT)
        ready = subprocess.run(runtime_argv("wait-for", "--dns", "localhost", "--ssh", f"127.0.0.1:{port}",
                                            "--timeout", "60"), env=env, capture_output=True, text=True,
                               check=False, timeout=120)
        assert ready.returncode == 0, ready.stdout + (tmp_path / "sshd.log").read_text()
        assert sshd.poll() is None

        # The launcher side: keys + ssh config as `ftjob-runtime mpirun` writes them.
        launcher_ssh = tmp_path / "launcher-home" / ".ssh"
        install_keys(secret, launcher_ssh, required=("id_ed25519",))
        cfg = write_ssh_config({"FTJOB_SSH_PORT": str(port)}, ["127.0.0.1"], launcher_ssh)
        r = subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "127.0.0.1", "echo", "hello-from-ssh"],
                           capture_output=True, text=True, check=False, timeout=60)
        assert r.returncode == 0, r.stderr + (tmp_path / "sshd.log").read_text()
        assert r.stdout.strip() == "hello-from-ssh"
    modes = {p.name: p.stat().st_mode & 0o777 for p in (home / ".ssh").iterdir()}
    assert modes["ssh_host_ed25519_key"] == 0o600 and modes["authorized_keys"] == 0o600


@pytest.fixture
def sshd_on_free_port(tmp_path: Path, popen_group, request: pytest.FixtureRequest) -> tuple[int, Path]:  # type: ignore[no-untyped-def]
    """A running `ftjob-runtime sshd` (the MPI worker side): (port, secret dir)."""
    secret = _secret(tmp_path)
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="ssh-home-", dir=_out_dir()))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    env = {**os.environ, "HOME": str(home), "FTJOB_SSH_PORT": str(port), "FTJOB_SSH_SECRET_DIR": str(secret)}
    log = (tmp_path / "sshd.log").open("w")
    request.addfinalizer(log.close)
    popen_group(runtime_argv("sshd"), env=env, stdout=log, stderr=subprocess.STDOUT)
    ready = subprocess.run(runtime_argv("wait-for", "--ssh", f"127.0.0.1:{port}", "--timeout", "60"), env=env,
                           capture_output=True, text=True, check=False, timeout=120)
    assert ready.returncode == 0, ready.stdout
    return port, secret


@pytest.mark.slow
@pytest.mark.parametrize("impl", MPI_IMPLEMENTATIONS)
def test_mpirun_reaches_workers_over_ssh(tmp_path: Path, impl: str, sshd_on_free_port: tuple[int, Path],
                                         request: pytest.FixtureRequest) -> None:
    """127.0.0.2 is not "this host" to Hydra or OpenMPI: they start the ranks through the ssh launcher
    (`ftjob-ssh` in FTJOB_SSH_DIR -> ssh -F the generated config -> our sshd on FTJOB_SSH_PORT), as in a
    cluster. HOME is a user's home that must stay as it was (what `ftjob run` guarantees)."""
    port, secret = sshd_on_free_port
    cfg = job_config(DEMO_CONFIG).training(maxSteps=2, checkpointEverySteps=2, logEverySteps=1) \
        .write(tmp_path / "config.json")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.2 slots=2\n" if impl == "openmpi" else "127.0.0.2:2\n")
    home = SentinelHome(tmp_path / "launcher-home")
    ssh_dir = tmp_path / "ssh"
    env = runtime_env(tmp_path, cfg, FTJOB_LAUNCHER="mpi", **mpi_env(request, impl),
                      FTJOB_HOSTFILE=str(hostfile), FTJOB_WORLD_SIZE="2", FTJOB_MPI_SLOTS_PER_NODE="2",
                      FTJOB_SSH_PORT=str(port), FTJOB_SSH_SECRET_DIR=str(secret), HOME=str(home.path),
                      FTJOB_SSH_DIR=str(ssh_dir))
    run = run_runtime(["mpirun"], env, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    assert str(ssh_dir / "ftjob-ssh") in run.out.splitlines()[0]
    assert "rank 0 of 2" in run.out and run.done["step"] == 2
    assert "Accepted publickey" in (tmp_path / "sshd.log").read_text(), "the ranks were not started over ssh"
    home.assert_unchanged()
