"""Command-line clients of the local OCI registry, run with environments of their own (tests/registry): Docker and
the pinned helm, each with its credentials and caches under the test's folders."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ftjob_cluster import bins

# Debian's client (docker.io); the images tier uses the same one.
DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")


@dataclass(frozen=True)
class Client:
    """A command-line client run with its own environment (credentials and caches in the test's folders)."""

    binary: str
    env: dict[str, str]

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.binary, *args], input=input, capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{Path(self.binary).name} {' '.join(args)} exited {proc.returncode}\n--- stdout\n"
                f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
            )
        return proc

    def fails(self, *args: str, input: str | None = None) -> str:
        """Runs a command that must fail; returns its output (stdout + stderr) for the caller to check why."""
        proc = self.run(*args, input=input, check=False)
        assert proc.returncode != 0, f"{' '.join(args)} succeeded:\n{proc.stdout}"
        return proc.stdout + proc.stderr


def helm_client(home: Path) -> Client:
    """The pinned helm with config, cache (OCI content included) and data under `home`: nothing is read from or
    left in the machine's own."""
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return Client(str(bins.ensure_binary("helm")), env)
