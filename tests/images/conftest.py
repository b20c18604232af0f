"""Fixtures of the images tier: the image under test and a thin `docker` helper.

The tier needs a running Docker daemon and the built image; `make test-images` provides both (images-docker,
image-cpu). Running the files directly without them fails loudly instead of skipping: a skipped smoke test
would read as a passing one.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
# Debian's client: the preinstalled /usr/local/bin/docker has no BuildKit builder (docs in images/README.md).
DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
# What `make test-images` builds: finetune-operator/cpu tagged with the repository's VERSION (mk/images.mk).
VERSION = (REPO / "VERSION").read_text().strip()
DEFAULT_IMAGE = f"finetune-operator/cpu:{VERSION}"
# The fixed UID every image runs as (images/common/add-user.sh; the operator's securityContext relies on it).
FTJOB_UID = 1000


@dataclass(frozen=True)
class Docker:
    binary: str

    def run(self, args: Sequence[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
                f"\n--- stderr\n{proc.stderr[-6000:]}"
            )
        return proc


@pytest.fixture(scope="session")
def docker() -> Docker:
    d = Docker(DOCKER)
    info = d.run(["info", "--format", "{{.ServerVersion}}"], timeout=30, check=False)
    assert info.returncode == 0, f"no Docker daemon ({info.stderr.strip()}); run `make images-docker` first"
    return d


def built_image(docker: Docker, env_var: str, default: str, make_target: str) -> str:
    """The image under test (`env_var` overrides `default`); fails with the make target that builds it."""
    name = os.environ.get(env_var, default)
    found = docker.run(["image", "inspect", "--format", "{{.Id}}", name], check=False)
    assert found.returncode == 0, f"image {name} is not built; run `make {make_target}` first"
    return name


@pytest.fixture(scope="session")
def image(docker: Docker) -> str:
    return built_image(docker, "FTJOB_TEST_IMAGE", DEFAULT_IMAGE, "image-cpu")


def lock_tool() -> ModuleType:
    """hack/lock.py: the locks, the flavors' pins and the labels build.sh gives each image."""
    spec = importlib.util.spec_from_file_location("hack_lock", REPO / "hack" / "lock.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def requirement_pins(path: Path) -> dict[str, str]:
    """`name==version` pins of a requirements file, its -r includes followed, names normalised the way pip does."""
    pins: dict[str, str] = lock_tool().pins(str(path.relative_to(REPO)))
    return pins
