"""Per-job SSH identity for MPI jobs. Random, so it lives outside the pure builders: the operator makes it
once per job (the Secret is immutable), `ftjob render` makes a fresh one for display."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .builders.objects import SshKeys


def _pair(comment: str) -> tuple[str, str]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, f"{public.decode()} {comment}\n"


def generate_keys(job_name: str) -> SshKeys:
    user_priv, user_pub = _pair(f"ftjob@{job_name}")
    host_priv, host_pub = _pair(f"host@{job_name}")
    return SshKeys(user_priv, user_pub, host_priv, host_pub)
