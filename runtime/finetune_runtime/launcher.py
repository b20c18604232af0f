"""`launch` (torchrun rank pods) and `mpirun` (MPI launcher pod): command construction from the env contract.

The builders are pure functions of an env mapping (unit-tested); the commands exec the result.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from finetune_runtime import backends
from finetune_runtime.backends import MissingStackError

# Variables mpirun must carry to the ranks on other hosts (OpenMPI forwards only what `-x` names; Hydra's
# -genvall forwards everything), and the ones the workers' sshd accepts (sshd.py). Prefixes cover the variables
# the operator derives from the profile: these, common to every backend, and each backend's own (backends.py).
COMMON_FORWARD_PREFIXES = (
    "FTJOB_",
    "FI_",
    "OMP_",
    "KMP_",
    "MALLOC_",
    "HF_",
    "TORCH",
    "TRANSFORMERS_",
    "PYTORCH_",
    "ONEDNN_",
    "DNNL_",
)
FORWARD_PREFIXES = tuple(
    dict.fromkeys(COMMON_FORWARD_PREFIXES + tuple(p for b in backends.BACKENDS.values() for p in b.env_prefixes))
)
FORWARD_NAMES = (
    "PATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "HOME",
    "LANG",
    "LC_ALL",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class LaunchError(RuntimeError):
    """The environment lacks something the launcher needs; the message names the variable."""


def _need(env: Mapping[str, str], name: str) -> str:
    v = env.get(name)
    if not v:
        raise LaunchError(f"{name} is not set (see docs/architecture.md, environment contract)")
    return v


def torchrun_command(env: Mapping[str, str], python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        env.get("FTJOB_NNODES") or "1",
        "--nproc-per-node",
        env.get("FTJOB_NPROC_PER_NODE") or "1",
        "--node-rank",
        env.get("FTJOB_NODE_RANK") or "0",
        "--master-addr",
        env.get("FTJOB_MASTER_ADDR") or "127.0.0.1",
        # The operator chooses the port (its constants.MASTER_PORT; `ftjob run` a free one); by hand, torchrun's own
        # default applies.
        *(["--master-port", env["FTJOB_MASTER_PORT"]] if env.get("FTJOB_MASTER_PORT") else []),
        "-m",
        "finetune_runtime",
        "worker",
    ]


def launch_plan(
    env: Mapping[str, str], precompile: bool, python: str = sys.executable, which: object = shutil.which
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra env) for `launch`. --precompile runs a short trial with FTJOB_MODE=precompile that warms the
    compile cache; where the backend has a precompile wrapper (Neuron: neuron_parallel_compile, which extracts the
    trial's graphs and compiles them into NEURON_COMPILE_CACHE_URL) torchrun runs under it."""
    cmd = torchrun_command(env, python)
    extra: dict[str, str] = {}
    grace = env.get("FTJOB_TERMINATION_GRACE_SECONDS")
    if grace and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in env:
        # torchrun passes the kubelet's SIGTERM on to its workers and SIGKILLs them after this many seconds (30 by
        # default): the pod's whole grace period, in which they save the current step (preemption.py).
        extra["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = grace
    if precompile:
        extra["FTJOB_MODE"] = "precompile"  # the steps: FTJOB_PRECOMPILE_STEPS, else the config's (train.py)
        backend = backends.get(backends.backend_from_env(env))
        if backend.precompile_wrapper:
            wrapper = which(backend.precompile_wrapper)  # type: ignore[operator]
            if not wrapper:
                raise MissingStackError(
                    f"{backend.precompile_wrapper} is not on PATH; precompiling for {backend.name} needs the "
                    f"{backend.image} image"
                )
            cmd = [str(wrapper), *cmd]
    return cmd, extra


# --- MPI --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int


def parse_hostfile(text: str) -> list[HostSlots]:
    """Both hostfile dialects: `host:N` (Hydra: MPICH, Intel MPI) and `host slots=N` (OpenMPI)."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "slots=" in line:
            host, _, rest = line.partition(" ")
            slots = int(rest.split("slots=", 1)[1].split()[0])
        elif ":" in line:
            host, _, n = line.rpartition(":")
            slots = int(n)
        else:
            host, slots = line, 1
        out.append(HostSlots(host.strip(), slots))
    return out


def is_intel_mpi(binary: str) -> bool:
    """An Intel MPI mpirun/mpiexec.hydra: `impi_info` lies beside it (oneAPI and the impi-rt wheel alike).
    Debian's MPICH also installs an `mpiexec.hydra`, so the name alone says nothing."""
    return (Path(binary).resolve().parent / "impi_info").is_file()


def default_mpirun(impl: str, which: object = shutil.which, env: Mapping[str, str] | None = None) -> str:
    """Debian installs mpirun.mpich and mpirun.openmpi side by side; plain `mpirun` is whichever the
    alternatives system picked (OpenMPI when both are present), so prefer the implementation's own name.
    Intel MPI: `$I_MPI_ROOT/bin/mpirun` (oneAPI's setvars.sh sets I_MPI_ROOT; the images with Intel MPI set it to
    their venv, where the impi-rt wheel puts Intel MPI), else an Intel `mpirun` on PATH; never another MPI's."""
    if impl == "intel":
        root = (env or {}).get("I_MPI_ROOT")
        tried = []
        if root:
            cand = str(Path(root) / "bin" / "mpirun")
            tried.append(cand)
            if is_intel_mpi(cand):
                return cand
        for n in ("mpirun", "mpiexec.hydra"):
            found = which(n)  # type: ignore[operator]
            tried.append(f"{n} on PATH" + (f" ({found}: not Intel MPI)" if found else ""))
            if found and is_intel_mpi(str(found)):
                return str(found)
        raise MissingStackError(
            f"no Intel MPI mpirun (tried {', '.join(tried)}); use {_images(impl)}, "
            "or set I_MPI_ROOT to an Intel MPI installation (oneAPI's setvars.sh, or the "
            "prefix the impi-rt wheel was installed into) or FTJOB_MPIRUN to its mpirun"
        )
    names = {"mpich": ["mpirun.mpich", "mpiexec.mpich", "mpirun"], "openmpi": ["mpirun.openmpi", "mpirun"]}[impl]
    for n in names:
        if which(n):  # type: ignore[operator]
            return n
    raise MissingStackError(
        f"no mpirun for {impl} on PATH (tried {', '.join(names)}); use {_images(impl)} or install the MPI "
        "implementation"
    )


def _images(implementation: str) -> str:
    images = backends.images_with_mpi(implementation)
    return f"the {' or '.join(images)} image" if images else "an image that has it"


def intel_mpi_env(binary: str, env: Mapping[str, str], which: object = shutil.which) -> dict[str, str]:
    """The part of Intel MPI's env/vars.sh that its launcher needs, for the installation `binary` belongs to.
    Its `mpirun` is a script that runs `mpiexec.hydra` from PATH (Debian's MPICH has one too), so its bin dir
    goes first; Hydra starts its proxies (also remotely, over ssh) by absolute path from its own directory, and
    -genvall carries this env to every rank. LD_LIBRARY_PATH is left alone: the built-in worker only reads
    Hydra's PMI_* variables, and oneCCL's bindings bring their own libmpi; a spec.command that calls MPI_Init
    with the impi-rt wheel sets `LD_LIBRARY_PATH=$I_MPI_ROOT/lib` itself (docs/runtime.md). Loopback needs no
    FI_PROVIDER: libfabric picks tcp, shared memory within a node."""
    resolved = which(binary) if "/" not in binary else binary  # type: ignore[operator]
    if not resolved or not is_intel_mpi(str(resolved)):
        return {}
    bin_dir = Path(str(resolved)).resolve().parent
    rest = [p for p in (env.get("PATH") or "").split(":") if p and p != str(bin_dir)]
    # Flat launch at every size: from 128 hosts Hydra's default is a proxy tree in which proxies ssh onward from
    # worker to worker, and workers hold no client key (each role gets only its own keys).
    return {
        "PATH": ":".join([str(bin_dir), *rest]),
        "I_MPI_ROOT": env.get("I_MPI_ROOT") or str(bin_dir.parent),
        "I_MPI_HYDRA_BRANCH_COUNT": "-1",
    }


def forwarded_vars(env: Mapping[str, str]) -> list[str]:
    return sorted(k for k in env if k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES)


def mpirun_command(
    env: Mapping[str, str],
    python: str = sys.executable,
    is_root: bool | None = None,
    which: object = shutil.which,
    ssh_exec: str | None = None,
    program: list[str] | None = None,
) -> list[str]:
    """The mpirun argv. `ssh_exec`: the program mpirun uses to reach other hosts (`ftjob-ssh`, which runs
    `ssh -F <our config>`: without -F ssh would read ~/.ssh/config from the passwd home, which need not be
    $HOME, and a user's own config must stay untouched under `ftjob run`).
    `program`: what every rank runs; default the runtime's worker, else a job's own command (spec.command)."""
    impl = env.get("FTJOB_MPI_IMPLEMENTATION") or "openmpi"
    if impl not in ("intel", "mpich", "openmpi"):
        raise LaunchError(f"FTJOB_MPI_IMPLEMENTATION must be intel, mpich or openmpi, got {impl!r}")
    hostfile = _need(env, "FTJOB_HOSTFILE")
    world = _need(env, "FTJOB_WORLD_SIZE")
    slots = _need(env, "FTJOB_MPI_SLOTS_PER_NODE")
    binary = env.get("FTJOB_MPIRUN") or default_mpirun(impl, which, env)
    worker = list(program) if program else [python, "-m", "finetune_runtime", "worker"]
    if impl in ("intel", "mpich"):
        # Hydra: -genvall exports the launcher's whole environment to every rank. MPICH names its remote
        # launcher option -launcher(-exec), Intel MPI -bootstrap(-exec).
        agent: list[str] = []
        if ssh_exec:
            flag = "-launcher" if impl == "mpich" else "-bootstrap"
            agent = [flag, "ssh", f"{flag}-exec", ssh_exec]
        # The proxies connect back to mpiexec by the name -localhost gives; without it Hydra sends its short
        # hostname, which other pods cannot resolve (a pod's DNS name is <hostname>.<subdomain>.<ns>.svc).
        here = ["-localhost", env["FTJOB_LAUNCHER_HOST"]] if env.get("FTJOB_LAUNCHER_HOST") else []
        return [binary, "-f", hostfile, "-n", world, "-ppn", slots, *here, *agent, "-genvall", *worker]
    root = (os.geteuid() == 0) if is_root is None else is_root
    cmd = [
        binary,
        "--hostfile",
        hostfile,
        "-np",
        world,
        "--map-by",
        f"ppr:{slots}:node",
        # Pinning every rank to one core starves the OpenMP threads torch starts; thread placement is left
        # to OMP_*/KMP_* from the profile.
        "--bind-to",
        "none",
    ]
    if root:
        cmd.append("--allow-run-as-root")
    if ssh_exec:
        # No tree spawn: OpenMPI's daemons would otherwise ssh onward from worker to worker, and workers hold
        # no client key (each role gets only its own keys); the launcher reaches every worker itself.
        cmd += ["--mca", "plm_rsh_agent", ssh_exec, "--mca", "plm_rsh_no_tree_spawn", "1"]
    for var in forwarded_vars(env):
        cmd += ["-x", var]
    return cmd + worker


def mpirun_plan(
    env: Mapping[str, str],
    python: str = sys.executable,
    which: object = shutil.which,
    ssh_exec: str | None = None,
    program: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra env) for `mpirun`: the command, plus Intel MPI's own environment when it is Intel MPI."""
    argv = mpirun_command(env, python, which=which, ssh_exec=ssh_exec, program=program)
    intel = (env.get("FTJOB_MPI_IMPLEMENTATION") or "openmpi") == "intel"
    return argv, (intel_mpi_env(argv[0], env, which) if intel else {})


def ssh_config(env: Mapping[str, str], hosts: list[str], ssh_dir: Path) -> str:
    """The ssh client config for mpirun's remote launcher (Hydra and OpenMPI both run plain `ssh HOST`; the
    wrapper adds `-F` this file). It lives in the runtime's ssh dir (sshd.runtime_ssh_dir), never in a user's
    ~/.ssh unless that is the runtime's dir (pods).

    Host keys are checked: the workers' names and host key come from the job's Secret (`known_hosts`, written by
    the operator), nothing is learnt on first use, and a host missing from it or with another key is refused.
    Without a Secret (`ftjob run`: one local node, no ssh) the file is absent and any ssh attempt fails."""
    # The workers' sshd port (the operator's constants.SSH_PORT). A run by hand on one host reaches no worker over
    # ssh: without the variable ssh keeps its own default port.
    port = env.get("FTJOB_SSH_PORT")
    lines = [
        f"# written by ftjob-runtime mpirun for: {' '.join(hosts) or 'no hosts'}",
        "Host *",
        *([f"  Port {port}"] if port else []),
        f"  IdentityFile {ssh_dir / 'id_ed25519'}",
        "  IdentitiesOnly yes",
        "  StrictHostKeyChecking yes",
        f"  UserKnownHostsFile {ssh_dir / 'known_hosts'}",
        "  GlobalKnownHostsFile /dev/null",
        "  UpdateHostKeys no",
        # Pods get new IPs on restart: keys are pinned to the workers' stable names, not addresses.
        "  CheckHostIP no",
        "  LogLevel ERROR",
        "  ConnectTimeout 10",
        "  ServerAliveInterval 30",
    ]
    return "\n".join(lines) + "\n"


def write_ssh_config(env: Mapping[str, str], hosts: list[str], ssh_dir: Path) -> Path:
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    cfg = ssh_dir / "config"
    cfg.write_text(ssh_config(env, hosts, ssh_dir), encoding="utf-8")
    os.chmod(cfg, 0o600)
    return cfg


def write_ssh_wrapper(cfg: Path) -> Path:
    """`ftjob-ssh` beside the config: ssh with our client config, for mpirun's remote launcher."""
    w = cfg.parent / "ftjob-ssh"
    w.write_text(f'#!/bin/sh\nexec ssh -F {shlex.quote(str(cfg))} "$@"\n', encoding="utf-8")
    os.chmod(w, 0o700)
    return w
