"""Static checks of every Dockerfile and image script: hadolint, shellcheck, and the rules the images share
(one shared base that every flavor is a thin FROM of, one runtime layer, non-root fixed UID, replaceable base,
CA bundle only as a build secret)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, lock_tool, requirement_pins

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
SCRIPTS = sorted(IMAGES.glob("*/*.sh"))
FLAVORS = {"cpu", "nvidia", "xeon", "neuron", "neuron-native", "operator"}
BASE_DOCKERFILE = IMAGES / "base" / "Dockerfile"
# The architectures the images are built for (build.sh --platform linux/ARCH) and Debian's multiarch triplet of each.
ARCHES = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
# The OS suite of each flavor's shared base (images/scripts/build.sh); the rest are bookworm.
SUITES = {"neuron": "noble", "neuron-native": "resolute"}
# Flavors whose vendor index cannot be locked here: they install their top-level pins, the Neuron release's from
# their Dockerfile's ARG block.
NEURON_FLAVORS = ("neuron", "neuron-native")
# The runtime images share one layout; the operator's own image has its rules in test_operator_image.py.
RUNTIME_DOCKERFILES = [p for p in DOCKERFILES if p.parent.name not in ("operator", "base")]
# A RUN that downloads something (apt, PyPI, curl, uv) must mount the build's CA bundle secret.
DOWNLOADS = re.compile(
    r"apt-get update|apt-install\.sh|install-stack\.sh|uv pip install|curl |install-uv\.sh|build-wheel"
)


def _tool(name: str) -> str:
    # The venv's copy (requirements/images.txt) first: it is the pinned version.
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    assert found, f"{name} not installed; `make setup` installs it from requirements/images.txt"
    return found


def test_every_flavor_has_a_dockerfile() -> None:
    assert {p.parent.name for p in DOCKERFILES} == FLAVORS | {"base"}


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


def _stages(text: str) -> list[tuple[str, str | None]]:
    """(image, stage name) of each FROM, in order."""
    return [(m[1], m[2]) for m in re.finditer(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)]


def _runs(text: str) -> list[str]:
    return re.findall(r"^RUN (?:.*\\\n)*.*$", text, re.M)


def _whitelist(dockerfile: Path) -> list[str]:
    lines = dockerfile.with_name("Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _assert_ca_only_as_secret(text: str) -> None:
    assert not re.search(r"^(COPY|ADD)\b.*(\.crt|\.pem|ca-cert)", text, re.M | re.I)
    for run in _runs(text):
        if DOWNLOADS.search(run):
            assert "--mount=type=secret,id=ca,target=/run/secrets/ca" in run, run.splitlines()[0]


def test_shared_base() -> None:
    """images/base/Dockerfile: the one place for the OS, python3, the user, uv and the wheel builds."""
    text = BASE_DOCKERFILE.read_text(encoding="utf-8")
    # An offline build swaps the OS image for a locally built one.
    assert re.search(r"^ARG BASE_IMAGE=\S+", text[: text.index("\nFROM ")], re.M)
    assert _stages(text) == [
        ("${BASE_IMAGE}", "base"),
        ("base", "runtime-packages"),
        *[("runtime-packages", f"tcmalloc-{arch}") for arch in ARCHES],
        ("tcmalloc-${TARGETARCH}", "runtime-base"),
        ("base", "builder"),
    ]
    base, packages, *tcmalloc, runtime_base, builder = re.split(r"^FROM .*$", text, flags=re.M)[1:]
    assert "libgoogle-perftools4" in packages
    # tcmalloc's path is the target architecture's: no stage names another's multiarch triplet.
    for arch, stage in zip(ARCHES, tcmalloc, strict=True):
        assert re.search(rf"^ENV FTJOB_TCMALLOC=/usr/lib/{ARCHES[arch]}/libtcmalloc\.so\.4$", stage, re.M), arch
    assert "x86_64" not in text.replace(tcmalloc[0], "")
    assert "/ftjob/add-user.sh" in base
    assert "org.opencontainers.image.source" in base
    assert re.search(r"^CMD \[\"ftjob-runtime\", \"selfcheck\"\]$", runtime_base, re.M)
    # One runtime layer: every runtime image installs the wheel built here, the operator image its own.
    assert "/ftjob/build-wheel.sh runtime" in builder
    assert "/ftjob/build-wheel.sh operator" in builder
    assert "/ftjob/install-uv.sh" in builder
    _assert_ca_only_as_secret(text)
    assert _whitelist(BASE_DOCKERFILE)[0] == "*"
    assert {"!images/common/", "!runtime/", "!operator/"} <= set(_whitelist(BASE_DOCKERFILE))


@pytest.mark.parametrize("dockerfile", RUNTIME_DOCKERFILES, ids=lambda p: p.parent.name)
def test_flavor_is_a_thin_from_of_the_base(dockerfile: Path) -> None:
    text = dockerfile.read_text(encoding="utf-8")
    before_first_from = text[: text.index("\nFROM ")]
    suite = SUITES.get(dockerfile.parent.name, "bookworm")
    # The shared base's tags, which build.sh builds first (and passes again, explicitly).
    assert re.search(rf"^ARG RUNTIME_BASE=finetune-operator/runtime-base:{suite}$", before_first_from, re.M)
    assert re.search(rf"^ARG BUILDER=finetune-operator/builder:{suite}$", before_first_from, re.M)
    # No stages of its own: the builder only as a mount source, one final stage on the runtime base.
    assert _stages(text) == [("${BUILDER}", "builder"), ("${RUNTIME_BASE}", None)]
    # Numeric USER: Kubernetes can only verify runAsNonRoot against a numeric user.
    assert re.search(r"^USER 1000:1000$", text, re.M)
    # One runtime layer, installed last: the builder's wheel through the shared script.
    runs = _runs(text)
    assert "/ftjob/install-stack.sh" in runs[-2]
    assert "/ftjob/install-runtime.sh" in runs[-1]
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in runs[-1]
    # The default command comes from the runtime base; a flavor that set another would not be selfchecked.
    assert not re.search(r"^(CMD|ENTRYPOINT)\b", text, re.M)
    assert "org.opencontainers.image.title" in text
    _assert_ca_only_as_secret(text)
    # The context is the repository root: each Dockerfile sends only what it needs; the runtime's sources go to
    # the builder, never to a flavor.
    ignore = _whitelist(dockerfile)
    assert ignore[0] == "*"
    # Besides its own directory and the shared scripts: the stack pins its requirements include, and the runtime's
    # requirements for the locked flavors, which install them from their lock.
    stack = (
        {"!requirements/stack/"}
        if dockerfile.parent.name in NEURON_FLAVORS
        else {
            "!requirements/stack.txt",
            "!requirements/stack/",
            "!runtime/pyproject.toml",
        }
    )
    assert {i for i in ignore if i.startswith("!")} == {f"!images/{dockerfile.parent.name}/", "!images/common/"} | stack


def test_build_script_builds_the_base_first_and_labels_the_version() -> None:
    script = (IMAGES / "scripts" / "build.sh").read_text(encoding="utf-8")
    assert "for target in base runtime-base builder; do" in script
    assert script.index("-f images/base/Dockerfile") < script.index('-f "$dockerfile"')
    assert '--label "org.opencontainers.image.version=$tag"' in script
    assert '--label "org.opencontainers.image.revision=$rev"' in script
    # The stack's version labels come from the locks (hack/lock.py labels), not from the Dockerfiles.
    assert '$(python3 "$root/hack/lock.py" labels "$flavor")' in script
    assert 'args+=(--label "$label")' in script


LOCK = lock_tool()
# build.sh's flavors and the Dockerfile each builds from.
FLAVOR_DOCKERFILES = {f: IMAGES / ("xeon" if f.startswith("xeon") else f) / "Dockerfile" for f in LOCK.FLAVORS}


@pytest.mark.parametrize("flavor", sorted(LOCK.FLAVORS))
def test_version_labels_come_from_the_lock_or_the_pins(flavor: str) -> None:
    """Every flavor's dev.finetune.versions.* labels (what build.sh passes) are its locked or pinned versions, and no
    Dockerfile writes one itself (the neuron release's ARGs aside: they are the pins)."""
    spec = LOCK.FLAVORS[flavor]
    labels = dict(line.split("=", 1) for line in LOCK.labels(flavor))
    assert labels, flavor
    versions = (
        {n: e.version for n, e in LOCK.entries((REPO / spec.lock).read_text()).items()}
        if spec.lock
        else requirement_pins(REPO / spec.requirements)
    )
    for package in spec.labels:
        assert labels[f"dev.finetune.versions.{package}"] == versions[LOCK.normalize(package)]
    text = FLAVOR_DOCKERFILES[flavor].read_text(encoding="utf-8")
    written = re.findall(r'dev\.finetune\.versions\.([\w.-]+)="([^"$]*\d[^"$]*)"', text)
    assert all(not re.search(r"\d+\.\d+", value) for _, value in written), written


@pytest.mark.parametrize("flavor", sorted(f for f, spec in LOCK.FLAVORS.items() if spec.lock))
def test_locked_flavors_install_their_lock(flavor: str) -> None:
    """The stack step hands the lock to install-stack.sh (uv checks every hash, nothing unlocked is installed)."""
    lock = LOCK.FLAVORS[flavor].lock
    text = FLAVOR_DOCKERFILES[flavor].read_text(encoding="utf-8")
    target = "/tmp/image/requirements.lock" if flavor == "operator" else f"/src/{lock}"
    assert f"--lock {target}" in text
    installed = {lock.path for lock in LOCK.LOCKS}
    assert lock in installed, f"{lock} is not one of hack/lock.py's LOCKS"


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


def test_native_neuron_versions_come_from_one_release() -> None:
    """The native stack's image pins TorchNeuron's first public release, SDK 2.33.0 (docs/hardware.md section 3):
    all in one ARG block, each used where it installs something, nothing Neuron pinned anywhere else."""
    dockerfile = (IMAGES / "neuron-native" / "Dockerfile").read_text(encoding="utf-8")
    release_2_33 = {
        "NEURON_SDK_VERSION": "2.33.0",
        "NEURON_RUNTIME_LIB_VERSION": "2.35.30.0",
        "NEURON_COLLECTIVES_VERSION": "2.35.43.0",
        "NEURON_TOOLS_VERSION": "2.33.38.0",
        "TORCH_NEURONX_VERSION": "2.14.3.0.*",
        "NEURONX_CC_VERSION": "2.28.7631.0",
        "NKI_VERSION": "0.7.0",
        "TORCH_VERSION": "2.14.0",
    }
    first_from = dockerfile.index("\nFROM ")
    for arg, version in release_2_33.items():
        assert dockerfile.count(f"ARG {arg}=") == 1
        assert dockerfile.index(f"ARG {arg}={version}\n") < first_from
    # The family's PyTorch is the pinned torch (torch-neuronx 2.14.3.0.* pairs with PyTorch 2.14.0).
    assert release_2_33["TORCH_NEURONX_VERSION"].startswith(release_2_33["TORCH_VERSION"].rsplit(".", 1)[0] + ".")
    for pkg, arg in (("torch-neuronx", "TORCH_NEURONX_VERSION"), ("neuronx-cc", "NEURONX_CC_VERSION")):
        assert f'"{pkg}==${{{arg}}}"' in dockerfile
    assert '"nki==${NKI_VERSION}"' in dockerfile and '"torch==${TORCH_VERSION}"' in dockerfile
    # The apt packages and the EFA installer go through the image's install script, with the ARGs in order.
    assert (
        '/ftjob/install-neuron.sh "${NEURON_RUNTIME_LIB_VERSION}" "${NEURON_COLLECTIVES_VERSION}" \\\n'
        '      "${NEURON_TOOLS_VERSION}" "${EFA_INSTALLER_VERSION}"'
    ) in dockerfile
    script = (IMAGES / "neuron-native" / "install-neuron.sh").read_text(encoding="utf-8")
    for pkg, var in (
        ("aws-neuronx-runtime-lib", "runtime_lib"),
        ("aws-neuronx-collectives", "collectives"),
        ("aws-neuronx-tools", "tools"),
    ):
        assert f'"{pkg}=${{{var}}}*"' in script  # apt's version glob covers the Debian revision suffix
    hf_pins = requirement_pins(IMAGES / "neuron-native" / "requirements.txt")
    assert not [name for name in hf_pins if "neuron" in name or name.startswith("torch")], hf_pins
    # the current Hugging Face stack (transformers 5 knows the neuron device), not the XLA image's 4.57
    assert hf_pins["transformers"] == requirement_pins(REPO / "requirements" / "stack" / "hf.txt")["transformers"]


def test_xeon_ipex_stack_matches() -> None:
    """IPEX and oneccl_bind_pt must equal torch's major.minor (docs/hardware.md section 5)."""
    pins = requirement_pins(IMAGES / "xeon" / "requirements-ipex.txt")
    major_minor = {
        k: ".".join(pins[k].split(".")[:2]) for k in ("torch", "intel-extension-for-pytorch", "oneccl-bind-pt")
    }
    assert len(set(major_minor.values())) == 1, major_minor
    assert "intel-extension-for-pytorch" not in requirement_pins(IMAGES / "xeon" / "requirements-upstream.txt")


def test_uv_version_is_the_makefiles() -> None:
    """uv's version lives in the Makefile (UV_VERSION); the builder's ARG default must be that same version."""
    makefile = re.search(r"^UV_VERSION := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    arg = re.search(r"^ARG UV_VERSION=(\S+)$", BASE_DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert makefile and arg and arg[1] == makefile[1]
