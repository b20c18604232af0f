"""Static checks of every Dockerfile and image script: hadolint, shellcheck, and the rules the images share
(one runtime layer, non-root fixed UID, replaceable base, CA bundle only as a build secret)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, requirement_pins

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
SCRIPTS = sorted([*IMAGES.glob("scripts/*.sh"), *IMAGES.glob("common/*.sh")])
FLAVORS = {"cpu", "nvidia", "xeon", "neuron", "operator"}
# The runtime images share one layout; the operator's own image has its rules in test_operator_image.py.
RUNTIME_DOCKERFILES = [p for p in DOCKERFILES if p.parent.name != "operator"]


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


@pytest.mark.parametrize("dockerfile", RUNTIME_DOCKERFILES, ids=lambda p: p.parent.name)
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
    """SDK 2.31.0 is the last Neuron release with torch-neuronx; all its pins sit in one ARG block, are used
    where they install something, and nothing Neuron is pinned anywhere else."""
    dockerfile = (IMAGES / "neuron" / "Dockerfile").read_text(encoding="utf-8")
    release_2_31 = {
        "NEURON_SDK_VERSION": "2.31.0",
        "NEURON_RUNTIME_LIB_VERSION": "2.33.10.0",
        "NEURON_COLLECTIVES_VERSION": "2.33.10.0",
        "NEURON_TOOLS_VERSION": "2.31.13.0",
        "TORCH_NEURONX_VERSION": "2.9.0.2.15.32035",
        "NEURONX_CC_VERSION": "2.26.6360.0",
        "LIBNEURONXLA_VERSION": "2.2.17544.0",
        "TORCH_VERSION": "2.9.1",
        "TORCH_XLA_VERSION": "2.9.0",
    }
    first_from = dockerfile.index("\nFROM ")
    for arg, version in release_2_31.items():
        # Defined once, before the first stage (global), and only re-declared (no value) inside stages.
        assert dockerfile.count(f"ARG {arg}=") == 1
        assert dockerfile.index(f"ARG {arg}={version}\n") < first_from
    for pkg, arg in (
        ("aws-neuronx-runtime-lib", "NEURON_RUNTIME_LIB_VERSION"),
        ("aws-neuronx-collectives", "NEURON_COLLECTIVES_VERSION"),
        ("aws-neuronx-tools", "NEURON_TOOLS_VERSION"),
    ):
        assert f'"{pkg}=${{{arg}}}*"' in dockerfile  # apt's version glob covers the Debian revision suffix
    for pkg, arg in (
        ("torch-neuronx", "TORCH_NEURONX_VERSION"),
        ("neuronx-cc", "NEURONX_CC_VERSION"),
        ("libneuronxla", "LIBNEURONXLA_VERSION"),
        ("torch", "TORCH_VERSION"),
        ("torch-xla", "TORCH_XLA_VERSION"),
    ):
        assert f'"{pkg}==${{{arg}}}"' in dockerfile
    hf_pins = requirement_pins(IMAGES / "neuron" / "requirements.txt")
    assert not [name for name in hf_pins if "neuron" in name or name.startswith("torch")], hf_pins
    assert hf_pins["transformers"].startswith("4.57.")


def test_xeon_ipex_stack_matches() -> None:
    """IPEX and oneccl_bind_pt must equal torch's major.minor (hardware.md section 5)."""
    pins = requirement_pins(IMAGES / "xeon" / "requirements-ipex.txt")
    major_minor = {
        k: ".".join(pins[k].split(".")[:2]) for k in ("torch", "intel-extension-for-pytorch", "oneccl-bind-pt")
    }
    assert len(set(major_minor.values())) == 1, major_minor
    assert "intel-extension-for-pytorch" not in requirement_pins(IMAGES / "xeon" / "requirements-upstream.txt")
