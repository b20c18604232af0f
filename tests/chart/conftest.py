"""Fixtures for the chart tier (helpers live in chartlib.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chartlib import Renderer, pinned_binary, pinned_k8s_version


def pytest_configure(config: pytest.Config) -> None:
    # test_install.py needs a real control plane (tools/cluster builds it); `make test-chart` deselects it
    # and `make test-chart-install` runs only it.
    config.addinivalue_line("markers", "controlplane: needs a real kube-apiserver (tools/cluster)")


@pytest.fixture(scope="session")
def helm() -> str:
    return pinned_binary("helm")


@pytest.fixture(scope="session")
def kubectl() -> str:
    return pinned_binary("kubectl")


@pytest.fixture(scope="session")
def k8s_version() -> str:
    return pinned_k8s_version()


@pytest.fixture
def render(helm: str, tmp_path: Path) -> Renderer:
    return Renderer(helm, tmp_path)
