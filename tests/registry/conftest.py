"""Fixtures of the registry tier: a real CNCF distribution registry (ftjob_cluster.registry) on loopback, with TLS
from a cluster CA and htpasswd auth, and the real clients that talk to it: Docker (Debian's, started by
images/scripts/dockerd-up.sh) and the pinned helm.

`make test-registry` builds the registry (registry-bin) and starts Docker (images-docker). Without them the tests
fail naming the target, instead of skipping: a skipped registry test would read as a passing one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "cluster"))

from ftjob_cluster import bins, pki  # noqa: E402
from ftjob_cluster.registry import Registry  # noqa: E402

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


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One registry per module, trusting the CA a LocalCluster makes in its pki/ folder (the same class)."""
    assert bins._tool_current(bins.MODULE_TOOLS["registry"]), "the registry is not built; run `make registry-bin`"
    base = tmp_path_factory.mktemp("registry")
    pki.CertificateAuthority(base / "pki")
    with Registry(base / "registry", base / "pki") as reg:
        yield reg


@pytest.fixture
def docker(tmp_path: Path) -> Client:
    """Docker with a config folder of its own: logins made here never reach the machine's ~/.docker."""
    client = Client(DOCKER, {**os.environ, "DOCKER_CONFIG": str(tmp_path / "docker-config")})
    info = client.run("info", "--format", "{{.ServerVersion}}", check=False, timeout=30)
    assert info.returncode == 0, f"no Docker daemon ({info.stderr.strip()}); run `make images-docker` first"
    return client


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


@pytest.fixture
def helm(tmp_path: Path) -> Client:
    return helm_client(tmp_path / "helm")
