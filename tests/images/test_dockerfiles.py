"""Static checks of every Dockerfile and image script: hadolint, shellcheck, and the rules the images share
(one runtime layer, non-root fixed UID, replaceable base, CA bundle only as a build secret)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
SCRIPTS = sorted([*IMAGES.glob("scripts/*.sh"), *IMAGES.glob("common/*.sh")])
FLAVORS = {"cpu", "nvidia", "xeon", "neuron"}


def _tool(name: str) -> str:
    # The venv's copy (requirements/images.txt) first: it is the pinned version.
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    assert found, f"{name} not installed; `make setup` installs it from requirements/images.txt"
    return found


def test_every_flavor_has_a_dockerfile() -> None:
    assert {p.parent.name for p in DOCKERFILES} == FLAVORS


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    proc = subprocess.run(
        [_tool("hadolint"), "--config", str(IMAGES / ".hadolint.yaml"), str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_clean() -> None:
    proc = subprocess.run([_tool("shellcheck"), *map(str, SCRIPTS)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _final_stage(text: str) -> str:
    return text[text.rindex("\nFROM ") :]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_shared_rules(dockerfile: Path) -> None:
    text = dockerfile.read_text(encoding="utf-8")
    before_first_from = text[: text.index("\nFROM ")]
    # An offline build swaps the base for a locally built one.
    assert re.search(r"^ARG BASE_IMAGE=\S+", before_first_from, re.M)
    assert "FROM ${BASE_IMAGE} AS os" in text
    final = _final_stage(text)
    # Numeric USER: Kubernetes can only verify runAsNonRoot against a numeric user.
    assert re.search(r"^USER 1000:1000$", final, re.M)
    # One runtime layer: the same wheel build and install script in every image.
    assert "/ftjob/build-runtime-wheel.sh" in text
    assert "/ftjob/install-runtime.sh" in final
    assert re.search(r"^CMD \[\"ftjob-runtime\", \"selfcheck\"\]$", final, re.M)
    for label in (
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.source",
    ):
        assert label in final
    # The proxy CA only ever arrives as a BuildKit secret, never through COPY/ADD.
    assert not re.search(r"^(COPY|ADD)\b.*(\.crt|\.pem|ca-cert)", text, re.M | re.I)
    for run in re.findall(r"^RUN (?:.*\\\n)*.*$", text, re.M):
        if re.search(r"apt-get update|uv pip install|curl |install-uv\.sh|build-runtime-wheel", run):
            assert "--mount=type=secret,id=ca,target=/run/secrets/ca" in run, run.splitlines()[0]
    # The context is the repository root: each Dockerfile sends only what it needs.
    ignore = [
        line.strip()
        for line in dockerfile.with_name("Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*"
    assert {f"!images/{dockerfile.parent.name}/", "!images/common/", "!runtime/"} <= set(ignore)


def test_neuron_versions_come_from_one_release() -> None:
    """SDK 2.31.0 is the last Neuron release with torch-neuronx; every Neuron pin comes from its manifest."""
    dockerfile = (IMAGES / "neuron" / "Dockerfile").read_text(encoding="utf-8")
    reqs = (IMAGES / "neuron" / "requirements.txt").read_text(encoding="utf-8")
    release_2_31 = {
        "NEURON_RUNTIME_LIB_VERSION": "2.33.10.0",
        "NEURON_COLLECTIVES_VERSION": "2.33.10.0",
        "NEURON_TOOLS_VERSION": "2.31.13.0",
    }
    for arg, version in release_2_31.items():
        assert f"ARG {arg}={version}\n" in dockerfile
        assert f"${{{arg}}}*" in dockerfile  # the pin is used with apt's version glob (Debian revision suffix)
    for pin in (
        "torch-neuronx==2.9.0.2.15.32035",
        "neuronx-cc==2.26.6360.0",
        "libneuronxla==2.2.17544.0",
        "transformers==4.57.",
    ):
        assert pin in reqs
    assert 'dev.finetune.versions.neuron-sdk="2.31.0"' in dockerfile


def test_xeon_ipex_stack_matches() -> None:
    """IPEX and oneccl_bind_pt must equal torch's major.minor (hardware.md section 5)."""
    from .conftest import requirement_pins

    pins = requirement_pins(IMAGES / "xeon" / "requirements-ipex.txt")
    major_minor = {
        k: ".".join(pins[k].split(".")[:2]) for k in ("torch", "intel-extension-for-pytorch", "oneccl-bind-pt")
    }
    assert len(set(major_minor.values())) == 1, major_minor
    assert "intel-extension-for-pytorch" not in requirement_pins(IMAGES / "xeon" / "requirements-upstream.txt")
