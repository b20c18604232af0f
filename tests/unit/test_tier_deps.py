"""Every make target installs what its own tests run (issue 10: `make test-local` ran OpenMPI without installing
it). The tiers that launch MPI or ssh get those tools through tests/support/tierdeps.py, which reads the make
files and hack/tier-packages.txt; these checks keep that path the only one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tierdeps import MPI_IMPLEMENTATIONS, ROOT, impi_versions, installs, missing_from_targets, targets_running

# Test directories whose tests launch MPI implementations or ssh.
MPI_TIERS = ("local", "runtime")
# What starts an MPI launcher or ssh in these tiers: `ftjob-runtime mpirun|sshd`, ssh itself, `ftjob run` of
# an MPI sample.
LAUNCHES = re.compile(r'run_runtime\(\["mpirun"|"mpirun", "--"|runtime_argv\("sshd"\)|\["ssh",|-mpi\.yaml')


@pytest.mark.parametrize("tier", MPI_TIERS)
@pytest.mark.parametrize("impl", MPI_IMPLEMENTATIONS)
def test_every_target_running_an_mpi_tier_installs_every_implementation(tier: str, impl: str) -> None:
    assert targets_running(tier), f"no make target runs tests/{tier}"
    assert missing_from_targets(tier, impl) == []


@pytest.mark.parametrize("tool", ["ssh", "sshd"])
def test_runtime_targets_install_ssh(tool: str) -> None:
    assert missing_from_targets("runtime", tool) == []


@pytest.mark.parametrize(
    "path",
    sorted(p for t in MPI_TIERS for p in (ROOT / "tests" / t).glob("test_*.py")),
    ids=lambda p: str(Path(p).relative_to(ROOT)),
)
def test_mpi_and_ssh_tests_get_their_tools_through_tierdeps(path: Path) -> None:
    text = path.read_text()
    if LAUNCHES.search(text):
        assert re.search(r"^from tierdeps import .*\b(mpi_env|require)\b", text, re.M), (
            f"{path.name} runs MPI or ssh: take them from tierdeps.mpi_env/require so its make target must install them"
        )


def test_the_checker_sees_a_missing_package() -> None:
    """The shape of issue 10, on the real make files: without openmpi-bin in its line, test-local lacks it."""
    pkgs, targets = installs("test-local")
    assert {"mpich", "openmpi-bin"} <= pkgs and "impi" in targets
    assert "openssh-server" not in pkgs  # local runs start every rank on this host: no sshd


def test_impi_versions_are_the_xeon_images() -> None:
    versions = impi_versions()
    assert set(versions) == {"ipex", "upstream"}
    mk = (ROOT / "mk" / "runtime.mk").read_text()
    assert "images/xeon/requirements-*.txt" in mk  # `make impi` installs exactly these
