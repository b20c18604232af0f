"""`sshd`, `wait-for --ssh` and the ssh client config written by `mpirun`: a real sshd on a free local port."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import DEMO_CONFIG, ROOT, free_port, job_config, run_runtime, runtime_argv, runtime_env
from ftjobs import make_job
from homes import SentinelHome
from tierdeps import MPI_IMPLEMENTATIONS, mpi_env, require

from finetune_operator import constants as c
from finetune_operator.admission import validate
from finetune_operator.builders import desired
from finetune_operator.sshkeys import generate_keys
from finetune_runtime.launcher import write_ssh_config
from finetune_runtime.sshd import LAUNCHER_KEYS, install_keys


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


@dataclass(frozen=True)
class Secret:
    """The operator's {job}-ssh Secret as the two MPI roles mount it (only their own keys)."""

    launcher: Path
    worker: Path


def _secret(tmp_path: Path, port: int, hosts: tuple[str, ...] = ("127.0.0.1", "127.0.0.2")) -> Secret:
    """The Secret the operator makes for a one-worker MPI job (its key generator and builder), split per role as
    the pods' Secret volume items do. In the launcher's known_hosts, the worker's cluster name and port
    ([{job}-worker-0...svc]:2222) become the addresses and the port the test's sshd has here."""
    job = validate(make_job("sshjob").launcher("mpi", "mpich").classification().build())
    secret = next(o for o in desired(job, ssh_keys=generate_keys("sshjob")).objects if o["kind"] == "Secret")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    lines = data["known_hosts"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("[sshjob-worker-0.sshjob.default.svc]:2222,"), lines
    data["known_hosts"] = ",".join(f"[{h}]:{port}" for h in hosts) + " " + lines[0].split(" ", 1)[1] + "\n"
    dirs = Secret(tmp_path / "secret-launcher", tmp_path / "secret-worker")
    for d, keys in ((dirs.launcher, c.SSH_LAUNCHER_KEYS), (dirs.worker, c.SSH_WORKER_KEYS)):
        d.mkdir()
        for k in keys:
            (d / k).write_text(data[k])
            (d / k).chmod(0o400)  # the Secret volume's defaultMode
    return dirs


def test_sshd_accepts_the_job_key_and_wait_for_sees_it(
    tmp_path: Path,
    popen_group,  # type: ignore[no-untyped-def]
    request: pytest.FixtureRequest,
) -> None:
    port = free_port()
    secret = _secret(tmp_path, port)
    # sshd's StrictModes rejects keys below a world-writable directory such as /tmp; pods have
    # HOME=/home/ftjob. A home under the repository's _out/ (0755 parents) stands in for it.
    home = Path(tempfile.mkdtemp(prefix="ssh-home-", dir=_out_dir()))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    env = {
        "PATH": "/usr/sbin:/usr/bin:/bin",
        "HOME": str(home),
        "FTJOB_SSH_PORT": str(port),
        "FTJOB_SSH_SECRET_DIR": str(secret.worker),
    }
    env = {**os.environ, **env}
    closed = subprocess.run(
        runtime_argv("wait-for", "--ssh", f"127.0.0.1:{port}", "--timeout", "1"),
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert closed.returncode == 1 and "TIMEOUT" in closed.stdout and f"127.0.0.1:{port}" in closed.stdout

    with (tmp_path / "sshd.log").open("w") as log:
        sshd = popen_group(runtime_argv("sshd"), env=env, stdout=log, stderr=subprocess.STDOUT)
        ready = subprocess.run(
            runtime_argv("wait-for", "--dns", "localhost", "--ssh", f"127.0.0.1:{port}", "--timeout", "60"),
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert ready.returncode == 0, ready.stdout + (tmp_path / "sshd.log").read_text()
        assert sshd.poll() is None

        # The launcher side: keys + ssh config as `ftjob-runtime mpirun` writes them.
        launcher_ssh = tmp_path / "launcher-home" / ".ssh"
        install_keys(secret.launcher, launcher_ssh, required=LAUNCHER_KEYS)
        cfg = write_ssh_config({"FTJOB_SSH_PORT": str(port)}, ["127.0.0.1"], launcher_ssh)
        r = _ssh(cfg, "127.0.0.1")
        assert r.returncode == 0, r.stderr + (tmp_path / "sshd.log").read_text()
        assert r.stdout.strip() == "hello-from-ssh"
        # Nothing was learnt on first use: known_hosts is the Secret's, byte for byte.
        assert (launcher_ssh / "known_hosts").read_bytes() == (secret.launcher / "known_hosts").read_bytes()
    modes = {p.name: p.stat().st_mode & 0o777 for p in (home / ".ssh").iterdir()}
    assert modes["ssh_host_ed25519_key"] == 0o600 and modes["authorized_keys"] == 0o600
    assert "id_ed25519" not in modes, "a worker holds no client private key"


def _ssh(cfg: Path, host: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-F", str(cfg), "-o", "BatchMode=yes", host, "echo", "hello-from-ssh"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_launcher_refuses_a_wrong_or_unknown_host_key(tmp_path: Path, sshd_on_free_port: tuple[int, Secret]) -> None:
    """The worker's sshd runs with the job's host key. A launcher whose known_hosts holds another key for that
    name (a different server answering there) or no entry for the name it dials refuses to connect."""
    port, secret = sshd_on_free_port
    launcher_ssh = tmp_path / "launcher-ssh"
    install_keys(secret.launcher, launcher_ssh, required=LAUNCHER_KEYS)
    cfg = write_ssh_config({"FTJOB_SSH_PORT": str(port)}, ["127.0.0.2"], launcher_ssh)
    assert _ssh(cfg, "127.0.0.2").returncode == 0, "the job's own host key is accepted"

    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = launcher_ssh / "known_hosts"
    genuine = known.read_text()
    names = genuine.split(" ", 1)[0]
    known.write_text(names + " " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    wrong = _ssh(cfg, "127.0.0.2")
    assert wrong.returncode == 255 and wrong.stdout == "", wrong
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in wrong.stderr or "Host key verification failed" in wrong.stderr

    known.write_text(genuine)
    unknown = _ssh(cfg, "127.0.0.3")  # the same sshd, under a name the Secret does not list
    assert unknown.returncode == 255 and unknown.stdout == "", unknown
    assert "Host key verification failed" in unknown.stderr or "No ED25519 host key is known" in unknown.stderr
    assert known.read_text() == genuine, "nothing learnt on first use"


@pytest.fixture
def sshd_on_free_port(tmp_path: Path, popen_group, request: pytest.FixtureRequest) -> tuple[int, Secret]:  # type: ignore[no-untyped-def]
    """A running `ftjob-runtime sshd` (the MPI worker side, with the worker's keys only): (port, Secret)."""
    port = free_port()
    secret = _secret(tmp_path, port)
    home = Path(tempfile.mkdtemp(prefix="ssh-home-", dir=_out_dir()))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    env = {**os.environ, "HOME": str(home), "FTJOB_SSH_PORT": str(port), "FTJOB_SSH_SECRET_DIR": str(secret.worker)}
    log = (tmp_path / "sshd.log").open("w")
    request.addfinalizer(log.close)
    popen_group(runtime_argv("sshd"), env=env, stdout=log, stderr=subprocess.STDOUT)
    ready = subprocess.run(
        runtime_argv("wait-for", "--ssh", f"127.0.0.1:{port}", "--timeout", "60"),
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert ready.returncode == 0, ready.stdout
    return port, secret


@pytest.mark.slow
@pytest.mark.parametrize("impl", MPI_IMPLEMENTATIONS)
def test_mpirun_reaches_workers_over_ssh(
    tmp_path: Path, impl: str, sshd_on_free_port: tuple[int, Secret], request: pytest.FixtureRequest
) -> None:
    """127.0.0.2 is not "this host" to Hydra or OpenMPI: they start the ranks through the ssh launcher
    (`ftjob-ssh` in FTJOB_SSH_DIR -> ssh -F the generated config -> our sshd on FTJOB_SSH_PORT), as in a
    cluster, with strict host key checking against the operator's known_hosts and each side holding only its
    role's keys. HOME is a user's home that must stay as it was (what `ftjob run` guarantees)."""
    port, secret = sshd_on_free_port
    cfg = (
        job_config(DEMO_CONFIG)
        .training(maxSteps=2, checkpointEverySteps=2, logEverySteps=1)
        .write(tmp_path / "config.json")
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.2 slots=2\n" if impl == "openmpi" else "127.0.0.2:2\n")
    home = SentinelHome(tmp_path / "launcher-home")
    ssh_dir = tmp_path / "ssh"
    env = runtime_env(
        tmp_path,
        cfg,
        FTJOB_LAUNCHER="mpi",
        **mpi_env(request, impl),
        FTJOB_HOSTFILE=str(hostfile),
        FTJOB_WORLD_SIZE="2",
        FTJOB_MPI_SLOTS_PER_NODE="2",
        FTJOB_SSH_PORT=str(port),
        FTJOB_SSH_SECRET_DIR=str(secret.launcher),
        HOME=str(home.path),
        FTJOB_SSH_DIR=str(ssh_dir),
    )
    if impl != "openmpi":
        # As in pods: the proxies dial mpiexec back by FTJOB_LAUNCHER_HOST (Hydra's -localhost), not by the
        # hostname, which in a pod does not resolve from other pods.
        env["FTJOB_LAUNCHER_HOST"] = "127.0.0.1"
    run = run_runtime(["mpirun"], env, tmp_path)
    assert run.rc == 0, run.out[-4000:]
    assert str(ssh_dir / "ftjob-ssh") in run.out.splitlines()[0]
    assert "rank 0 of 2" in run.out and run.done["step"] == 2
    assert "Accepted publickey" in (tmp_path / "sshd.log").read_text(), "the ranks were not started over ssh"
    home.assert_unchanged()
