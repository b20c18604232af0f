"""Fixtures for the chart tier (helpers live in chartlib.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chartlib import Renderer, pinned_binary, pinned_k8s_version


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
