"""Fixtures of the registry tier: a real CNCF distribution registry (ftjob_cluster.registry) on loopback, with TLS
from a cluster CA and htpasswd auth, and the real clients that talk to it: Docker (Debian's, started by
images/scripts/dockerd-up.sh) and the pinned helm.

`make test-registry` builds the registry (registry-bin) and starts Docker (images-docker). Without them the tests
fail naming the target, instead of skipping: a skipped registry test would read as a passing one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from registry_clients import DOCKER, Client, helm_client

from ftjob_cluster import bins, pki
from ftjob_cluster.registry import Registry


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


@pytest.fixture
def helm(tmp_path: Path) -> Client:
    return helm_client(tmp_path / "helm")
