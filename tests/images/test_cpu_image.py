"""Smoke test of the built cpu image (FTJOB_TEST_IMAGE, default: conftest.DEFAULT_IMAGE): what a rank pod relies on."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from .conftest import FTJOB_UID, REPO, Docker, lock_tool

LOCK = lock_tool()
# What the image installs: images/cpu/requirements.lock (hack/lock.py, `make lock`).
LOCKED = {name: e.version for name, e in LOCK.entries((REPO / LOCK.FLAVORS["cpu"].lock).read_text()).items()}


def _sh(docker: Docker, image: str, script: str, *extra: str, timeout: float = 120) -> str:
    return docker.run(["run", "--rm", *extra, image, "bash", "-c", script], timeout=timeout).stdout


def test_runs_as_fixed_non_root_user(docker: Docker, image: str) -> None:
    out = _sh(docker, image, 'id -u; id -g; id -un; echo "$HOME"; touch "$HOME/x" /output/x /cache/x && echo w')
    assert out.split() == [str(FTJOB_UID), str(FTJOB_UID), "ftjob", "/home/ftjob", "w"]
    config = json.loads(docker.run(["image", "inspect", "--format", "{{json .Config}}", image]).stdout)
    # Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
    assert config["User"] == f"{FTJOB_UID}:{FTJOB_UID}"
    assert config["Cmd"] == ["ftjob-runtime", "selfcheck"]
    # A plain `docker run` checks the image's own backend; the operator overrides it per pod.
    assert "FTJOB_BACKEND=cpu" in config["Env"]


def test_default_command_selfcheck_passes(docker: Docker, image: str) -> None:
    """The image's CMD (`ftjob-runtime selfcheck`): versions, backend, tokenizer; offline, as UID 1000."""
    proc = docker.run(["run", "--rm", "--network", "none", image], timeout=300)
    # selfcheck reports the installed versions; the locked torch must be among them.
    assert LOCKED["torch"] in proc.stdout, proc.stdout


def test_locked_stack_and_labels(docker: Docker, image: str) -> None:
    """Everything installed is in the lock at its locked version (the runtime's own wheel aside), and the version
    labels are the lock's (build.sh: hack/lock.py labels)."""
    out = _sh(
        docker,
        image,
        "python - <<'PY'\n"
        "import importlib.metadata as m, json\n"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))\n"
        "PY",
    )
    installed = {LOCK.normalize(name): version for name, version in json.loads(out).items()}
    assert installed.pop("finetune-runtime")
    for name, version in installed.items():
        # The CPU index adds a local label (2.15.0+cpu); PyPI's build has none.
        assert version.split("+")[0] == LOCKED.get(name), (name, version)
    assert {"torch", "transformers", "peft", "boto3"} <= set(installed)
    freeze = _sh(docker, image, "cat /opt/venv/ftjob-freeze.txt").splitlines()
    assert any(line.startswith(f"torch=={LOCKED['torch']}") for line in freeze), freeze
    assert any(line.startswith("finetune-runtime") for line in freeze), freeze
    labels = json.loads(docker.run(["image", "inspect", "--format", "{{json .Config.Labels}}", image]).stdout)
    for label in LOCK.labels("cpu"):
        key, value = label.split("=", 1)
        assert labels[key] == value
    assert labels["dev.finetune.versions.torch"] == LOCKED["torch"]
    assert labels["org.opencontainers.image.version"]
    assert labels["org.opencontainers.image.revision"]
    # From the shared base (images/base/Dockerfile).
    assert labels["org.opencontainers.image.source"].startswith("https://")


def test_no_build_leftovers(docker: Docker, image: str) -> None:
    """Build-only things stay in the builder or in BuildKit's cache mounts: no uv, no uv cache in the user's
    HOME, no apt package lists or .debs (the debootstrap'ed base does not clean up after apt by itself)."""
    out = _sh(
        docker,
        image,
        "ls -d /home/ftjob/.cache 2>/dev/null; command -v uv; "
        "find /opt/tools /wheels /var/lib/apt/lists /var/cache/apt -type f ! -name lock 2>/dev/null; true",
    )
    assert out.split() == [], out


# What a rank of the demo job imports before its first step (the launcher's torchrun, the runtime, its task, the stack).
RANK_IMPORTS = (
    "import torch.distributed.run, datasets, finetune_runtime.cli, finetune_runtime.train, "
    "finetune_runtime.tasks.text_classification; from transformers import Trainer"
)


def test_a_rank_loads_the_bytecode_of_the_build(docker: Docker, image: str) -> None:
    """Every module a rank imports comes from the .pyc the build wrote (install-stack.sh, install-runtime.sh). As
    UID 1000 the venv is read-only, so a module without its .pyc, or with a stale one (a layer that did not keep
    the sources' mtimes), would be compiled again by every process of every pod: `python -v` says which."""
    out = _sh(docker, image, f'python -v -c "{RANK_IMPORTS}" 2>&1 >/dev/null', timeout=300)
    from_source = re.findall(r"^# code object from (/opt/venv/\S+\.py)$", out, re.M)
    from_bytecode = re.findall(r"^# code object from '(/opt/venv/\S+\.pyc)'$", out, re.M)
    assert from_source == [], f"{len(from_source)} modules compiled from source at start, e.g. {from_source[:5]}"
    for package in ("torch", "transformers", "datasets", "finetune_runtime"):
        assert any(f"/site-packages/{package}/__pycache__/" in p for p in from_bytecode), package


def test_system_tools_present(docker: Docker, image: str) -> None:
    out = _sh(
        docker,
        image,
        'set -e; test -r "$FTJOB_TCMALLOC"; '
        'mpirun.mpich -n 2 -launcher fork python -c \'import os; print("rank", os.environ["PMI_RANK"])\'; '
        "/usr/sbin/sshd -V 2>&1 | head -n1; test -d /run/sshd && echo sshd-dir",
    )
    assert sorted(re.findall(r"rank \d", out)) == ["rank 0", "rank 1"]
    assert "OpenSSH" in out and "sshd-dir" in out


def test_build_ca_not_left_in_image(docker: Docker, image: str) -> None:
    """The build trusts the host's bundle (proxy CA included) only through a BuildKit secret."""
    out = _sh(
        docker,
        image,
        'test ! -e /run/secrets/ca && echo no-secret; env | grep -E "^(SSL_CERT_FILE|PIP_CERT|'
        'REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE)=" || true; ls /usr/local/share/ca-certificates | wc -l; '
        "cat /etc/ssl/certs/ca-certificates.crt; "
        # certifi is only there when some dependency pulls it in.
        'python -c "import certifi; print(open(certifi.where()).read())" 2>/dev/null || true',
    )
    lines = out.splitlines()
    assert lines[0] == "no-secret"
    assert lines[1] == "0", "site-local CAs were installed into the image"
    # Site-local CAs of the build host (an intercepting proxy's CA lives there) must be in no bundle.
    local_cas = sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
    for ca in local_cas:
        body = "".join(ca.read_text(encoding="utf-8").split("-----")[2].split())
        assert body[:200] not in "".join(out.split()), f"{ca} ended up in the image"


EXAMPLE_JOB = REPO / "examples" / "jobs" / "demo-ja-config.json"


def _rank_options(tmp_path: Path, out_dir: Path, cache_dir: Path, env: dict[str, str], *mounts: str) -> list[str]:
    """`docker run` options of a rank container as the operator lays out its pod: the working directory, the
    examples, tmp_path/config.json, `mounts`, the output and cache volumes, and `env`."""
    options = [
        # Relative paths in the example config (examples/...) resolve against the working directory.
        "-w",
        "/srv",
        "-v",
        f"{REPO / 'examples'}:/srv/examples:ro",
        "-v",
        f"{tmp_path / 'config.json'}:/etc/ftjob/config.json:ro",
    ]
    for mount in mounts:
        options += ["-v", mount]
    options += ["-v", f"{out_dir}:/output", "-v", f"{cache_dir}:/cache"]
    for key, value in env.items():
        options += ["-e", f"{key}={value}"]
    return options


def test_two_rank_training(docker: Docker, image: str, tmp_path: Path) -> None:
    """torchrun --nproc-per-node 2 of the runtime's worker, with the env the operator sets (docs/architecture.md),
    on the repository's own tiny model and data, offline (--network none), as UID 1000."""
    config = json.loads(EXAMPLE_JOB.read_text(encoding="utf-8"))
    # A few steps are enough to prove the image trains and writes its outputs; 2 cores are shared in CI.
    config["jobName"] = "image-smoke"
    config["training"].update({"maxSteps": 6, "batchSizePerDevice": 8, "logEverySteps": 2, "checkpointEverySteps": 3})
    config["task"]["dataset"].update({"trainSamples": 96, "evalSamples": 32})
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    out_dir, cache_dir = tmp_path / "output", tmp_path / "cache"
    for d in (out_dir, cache_dir):
        d.mkdir()
        d.chmod(0o777)  # written by UID 1000 in the container
    env = {
        "FTJOB_JOB_NAME": "image-smoke",
        "FTJOB_NAMESPACE": "default",
        "FTJOB_CONFIG": "/etc/ftjob/config.json",
        "FTJOB_PROFILE": "cpu",
        "FTJOB_BACKEND": "cpu",
        "FTJOB_LAUNCHER": "torchrun",
        "FTJOB_NNODES": "1",
        "FTJOB_NPROC_PER_NODE": "2",
        "FTJOB_NODE_RANK": "0",
        "FTJOB_MASTER_ADDR": "127.0.0.1",
        "FTJOB_MASTER_PORT": "29500",
        "FTJOB_OUTPUT_DIR": "/output/image-smoke",
        "FTJOB_CACHE_DIR": "/cache",
        "FTJOB_MODE": "train",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    args = [
        "run",
        "--rm",
        "--network",
        "none",
        "--shm-size",
        "256m",
        *_rank_options(tmp_path, out_dir, cache_dir, env),
    ]
    args += [
        image,
        "torchrun",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29500",
        "-m",
        "finetune_runtime",
        "worker",
    ]
    proc = docker.run(args, timeout=900)

    progress = [
        json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("FTJOB_PROGRESS ")
    ]
    assert progress, proc.stdout[-3000:]
    assert progress[-1]["event"] == "done"
    assert progress[-1]["step"] == 6
    # Only global rank 0 reports: one "done", not one per rank.
    assert [p["event"] for p in progress].count("done") == 1
    job_out = out_dir / "image-smoke"
    model = job_out / "model"
    assert (model / "config.json").is_file()
    assert list(model.glob("*.safetensors")) or list(model.glob("*.bin"))
    assert (model / "vocab.txt").is_file()  # the tokenizer travels with the model
    # Both ranks took part: HF Trainer checkpoints carry one RNG state per process.
    checkpoint = job_out / "checkpoints" / "local" / "checkpoint-6"  # no FTJOB_JOB_UID: the runtime's local uid
    assert sorted(p.name for p in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    metrics = (job_out / "metrics.json").read_text(encoding="utf-8")
    assert '"accuracy"' in metrics, metrics  # eval metrics of the text-classification task


def test_mpi_launcher_and_two_ssh_workers(docker: Docker, image: str, tmp_path: Path) -> None:
    """The MPI path of the image, as the operator lays it out: two worker containers run `ftjob-runtime sshd`
    (non-root sshd on 2222 with keys from /etc/ftjob/ssh), a launcher runs `ftjob-runtime wait-for --ssh` and
    `ftjob-runtime mpirun` (MPICH's Hydra over ssh), one rank per worker."""
    run_id = uuid.uuid4().hex[:8]
    net, workers = f"ftjob-img-{run_id}", [f"w{i}-{run_id}" for i in range(2)]
    ssh_dir, out_dir, cache_dir = tmp_path / "ssh", tmp_path / "output", tmp_path / "cache"
    for d in (ssh_dir, out_dir, cache_dir):
        d.mkdir()
        d.chmod(0o777)
    # The job's key pair, the host key and the launcher's known_hosts of the workers' names, made with the image's
    # own ssh-keygen (what the operator's Secret holds), split per role as the pods mount it: the launcher gets the
    # client key and known_hosts, the workers the host key and authorized_keys.
    known = " && ".join(
        f"echo \"[{w}]:2222 $(cut -d' ' -f1,2 ssh_host_ed25519_key.pub)\" >> known_hosts" for w in workers
    )
    _sh(
        docker,
        image,
        "cd /k && ssh-keygen -q -t ed25519 -N '' -f id_ed25519 -C job && "
        "ssh-keygen -q -t ed25519 -N '' -f ssh_host_ed25519_key -C host && cp id_ed25519.pub authorized_keys && "
        f"{known} && mkdir launcher worker && cp id_ed25519 id_ed25519.pub known_hosts launcher/ && "
        "cp ssh_host_ed25519_key ssh_host_ed25519_key.pub authorized_keys worker/",
        "-v",
        f"{ssh_dir}:/k",
    )
    config = json.loads(EXAMPLE_JOB.read_text(encoding="utf-8"))
    config["jobName"] = "mpi-smoke"
    config["training"].update({"maxSteps": 4, "batchSizePerDevice": 8, "logEverySteps": 2, "checkpointEverySteps": 100})
    config["task"]["dataset"].update({"trainSamples": 64, "evalSamples": 16})
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "hostfile").write_text("".join(f"{w}:1\n" for w in workers), encoding="utf-8")  # MPICH format
    env = {
        "FTJOB_JOB_NAME": "mpi-smoke",
        "FTJOB_NAMESPACE": "default",
        "FTJOB_CONFIG": "/etc/ftjob/config.json",
        "FTJOB_PROFILE": "cpu",
        "FTJOB_BACKEND": "cpu",
        "FTJOB_LAUNCHER": "mpi",
        "FTJOB_NNODES": "2",
        "FTJOB_NPROC_PER_NODE": "1",
        "FTJOB_MASTER_ADDR": workers[0],
        "FTJOB_MASTER_PORT": "29500",
        "FTJOB_OUTPUT_DIR": "/output/mpi-smoke",
        "FTJOB_CACHE_DIR": "/cache",
        "FTJOB_MPI_IMPLEMENTATION": "mpich",
        "FTJOB_HOSTFILE": "/etc/ftjob/hostfile",
        "FTJOB_MPI_SLOTS_PER_NODE": "1",
        "FTJOB_WORLD_SIZE": "2",
        "FTJOB_SSH_PORT": "2222",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    hostfile = f"{tmp_path / 'hostfile'}:/etc/ftjob/hostfile:ro"
    common = ["--network", net, *_rank_options(tmp_path, out_dir, cache_dir, env, hostfile)]
    docker.run(["network", "create", net])
    try:
        for w in workers:
            worker_keys = f"{ssh_dir / 'worker'}:/etc/ftjob/ssh:ro"
            docker.run(
                ["run", "-d", "--name", w, "--hostname", w, *common, "-v", worker_keys, image, "ftjob-runtime", "sshd"]
            )
        proc = docker.run(
            [
                "run",
                "--rm",
                "--name",
                f"launcher-{run_id}",
                *common,
                "-v",
                f"{ssh_dir / 'launcher'}:/etc/ftjob/ssh:ro",
                image,
                "bash",
                "-c",
                f"ftjob-runtime wait-for --ssh {' '.join(workers)} --timeout 120 && ftjob-runtime mpirun",
            ],
            timeout=900,
        )
    except AssertionError as e:
        # The workers' sshd logs say why a login or a rank failed; they vanish with the containers.
        logs = "".join(f"\n--- {w} logs\n" + docker.run(["logs", w], check=False).stderr[-3000:] for w in workers)
        raise AssertionError(f"{e}{logs}") from e
    finally:
        docker.run(["rm", "-f", *workers], check=False)
        docker.run(["network", "rm", net], check=False)

    assert "mpirun.mpich -f /etc/ftjob/hostfile -n 2 -ppn 1" in proc.stdout
    progress = [
        json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("FTJOB_PROGRESS ")
    ]
    assert progress and progress[-1]["event"] == "done" and progress[-1]["step"] == 4, proc.stdout[-3000:]
    checkpoint = out_dir / "mpi-smoke" / "checkpoints" / "local" / "checkpoint-4"  # no FTJOB_JOB_UID set
    assert sorted(p.name for p in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert (out_dir / "mpi-smoke" / "model" / "config.json").is_file()
