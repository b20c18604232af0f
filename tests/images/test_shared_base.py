"""The flavors share the base's layers (images/base/Dockerfile): the operator image starts with every layer of
finetune-operator/base, the cpu image with every layer of finetune-operator/runtime-base, which itself starts
with base's. A flavor that copied the base's steps instead of FROM-ing it would have its own, different layers.

`make test-images` builds the cpu and operator images, and through build.sh the base images first.
"""

from __future__ import annotations

import json
import os

import pytest

from .conftest import Docker, built_image
from .test_operator_image import DEFAULT_OPERATOR_IMAGE

# The tags build.sh gives the shared base's targets for the Debian flavors.
BASE = os.environ.get("FTJOB_TEST_BASE_IMAGE", "finetune-operator/base:bookworm")
RUNTIME_BASE = os.environ.get("FTJOB_TEST_RUNTIME_BASE_IMAGE", "finetune-operator/runtime-base:bookworm")


def _layers(docker: Docker, image: str) -> list[str]:
    out = docker.run(["image", "inspect", "--format", "{{json .RootFS.Layers}}", image]).stdout
    layers: list[str] = json.loads(out)
    return layers


@pytest.fixture(scope="module")
def base_layers(docker: Docker) -> list[str]:
    return _layers(docker, built_image(docker, "FTJOB_TEST_BASE_IMAGE", BASE, "image-base"))


@pytest.fixture(scope="module")
def runtime_base_layers(docker: Docker) -> list[str]:
    return _layers(docker, built_image(docker, "FTJOB_TEST_RUNTIME_BASE_IMAGE", RUNTIME_BASE, "image-base"))


def test_runtime_base_is_the_base_plus_its_own_layers(base_layers: list[str], runtime_base_layers: list[str]) -> None:
    assert runtime_base_layers[: len(base_layers)] == base_layers
    assert len(runtime_base_layers) > len(base_layers)


def test_cpu_image_starts_with_the_runtime_base(docker: Docker, image: str, runtime_base_layers: list[str]) -> None:
    layers = _layers(docker, image)
    assert layers[: len(runtime_base_layers)] == runtime_base_layers
    # The flavor's own layers: its packages, its stack and the runtime wheel, nothing more.
    assert 2 <= len(layers) - len(runtime_base_layers) <= 3, docker.run(["history", image]).stdout


def test_operator_image_starts_with_the_base(docker: Docker, base_layers: list[str]) -> None:
    operator_image = built_image(docker, "FTJOB_TEST_OPERATOR_IMAGE", DEFAULT_OPERATOR_IMAGE, "image-operator")
    layers = _layers(docker, operator_image)
    assert layers[: len(base_layers)] == base_layers
    # Its dependencies and its wheel.
    assert len(layers) - len(base_layers) == 2, docker.run(["history", operator_image]).stdout
