"""`sshd` for MPI worker pods: install the job's keys with the modes ssh insists on, run sshd as the image user.

The Secret is mounted read-only with mode 0400 and owned by root; sshd (StrictModes) and ssh refuse keys that
others can read or that live in group-writable directories, so the files are copied into the runtime's ssh
directory: `$FTJOB_SSH_DIR`, else `$HOME/.ssh` (the image user's home in pods; `ftjob run` points it into its
workdir so that a user's own ~/.ssh is never written).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from finetune_runtime.launcher import FORWARD_PREFIXES, LaunchError

log = logging.getLogger("finetune_runtime")

DEFAULT_SECRET_DIR = "/etc/ftjob/ssh"
DEFAULT_HOME = "/home/ftjob"  # the image user's home (images/common/add-user.sh)
KEY_MODES = {
    "id_ed25519": 0o600,
    "id_ed25519.pub": 0o644,
    "known_hosts": 0o644,
    "authorized_keys": 0o600,
    "ssh_host_ed25519_key": 0o600,
    "ssh_host_ed25519_key.pub": 0o644,
}
# What each role's part of the Secret must hold (the operator mounts only these: constants.SSH_*_KEYS). The
# launcher checks the workers' host key against known_hosts; workers hold no client private key.
LAUNCHER_KEYS = ("id_ed25519", "known_hosts")
WORKER_KEYS = ("ssh_host_ed25519_key", "authorized_keys")


def runtime_ssh_dir(env: Mapping[str, str]) -> Path:
    """Where the job's keys, ssh/sshd configs and the ssh wrapper live (read by `mpirun` and `sshd`)."""
    if env.get("FTJOB_SSH_DIR"):
        return Path(env["FTJOB_SSH_DIR"])
    return Path(env.get("HOME") or DEFAULT_HOME) / ".ssh"


def install_keys(secret_dir: Path, ssh_dir: Path, required: tuple[str, ...]) -> Path:
    ssh_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    missing = [n for n in required if not (secret_dir / n).is_file()]
    if missing:
        raise FileNotFoundError(f"ssh secret {secret_dir} lacks {', '.join(missing)}")
    for name, mode in KEY_MODES.items():
        src = secret_dir / name
        if not src.is_file():
            continue
        dst = ssh_dir / name
        if dst.exists():
            os.chmod(dst, 0o600)  # a previous copy is 0400/0644: make it writable to replace it
        shutil.copyfile(src, dst)
        os.chmod(dst, mode)
    return ssh_dir


def sshd_config(ssh_dir: Path, port: str, strict_modes: bool = True) -> str:
    return (
        "\n".join(
            [
                f"Port {port}",
                f"HostKey {ssh_dir / 'ssh_host_ed25519_key'}",
                f"AuthorizedKeysFile {ssh_dir / 'authorized_keys'}",
                f"PidFile {ssh_dir / 'sshd.pid'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                # Non-root sshd cannot use PAM or privilege separation; it can only log in as its own user.
                "UsePAM no",
                f"StrictModes {'yes' if strict_modes else 'no'}",
                "PermitUserEnvironment no",
                "PrintMotd no",
                "AcceptEnv " + " ".join(f"{p}*" for p in FORWARD_PREFIXES),
                "LogLevel INFO",
            ]
        )
        + "\n"
    )


def sshd_plan(ssh_dir: Path) -> tuple[list[str], Path]:
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    cfg = ssh_dir / "sshd_config"
    return [sshd, "-D", "-e", "-f", str(cfg)], cfg


def secure_parent(ssh_dir: Path) -> bool:
    """StrictModes also checks the directory above the keys (the home in pods) up to the passwd home: no
    group/other write there. Returns False where that cannot be made so: in a pod the home is an emptyDir, which
    the kubelet creates root-owned and mode 0777 (fsGroup changes only its group), and uid 1000 may not chmod it.
    sshd then runs with StrictModes off; the keys themselves stay 0600 in a 0700 directory this user owns, and
    the pod runs no other user that could write to the home."""
    home = ssh_dir.parent
    mode = os.stat(home).st_mode
    if not mode & 0o022:
        return True
    try:
        os.chmod(home, mode & ~0o022)
        return True
    except PermissionError:
        log.warning(
            "sshd: %s is group/world-writable and not ours to chmod (an emptyDir home): "
            "StrictModes off; the keys stay private in %s",
            home,
            ssh_dir,
        )
        return False


def prepare_sshd(env: Mapping[str, str]) -> list[str]:
    port = env.get("FTJOB_SSH_PORT")  # the operator's constants.SSH_PORT (non-root: above 1024)
    if not port:
        raise LaunchError("FTJOB_SSH_PORT is not set: the port sshd listens on (the operator sets it)")
    secret = Path(env.get("FTJOB_SSH_SECRET_DIR") or DEFAULT_SECRET_DIR)
    d = install_keys(secret, runtime_ssh_dir(env), required=WORKER_KEYS)
    strict = secure_parent(d)
    argv, cfg = sshd_plan(d)
    cfg.write_text(sshd_config(d, port, strict_modes=strict), encoding="utf-8")
    os.chmod(cfg, 0o600)
    ensure_privsep_dir()
    return argv


def ensure_privsep_dir() -> None:
    """A root sshd refuses to start without its privilege-separation directory, /run/sshd (built into OpenSSH).
    The images make it (images/common/add-user.sh); a host's freshly installed openssh-server may not have."""
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
