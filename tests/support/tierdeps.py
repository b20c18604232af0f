"""What a test tier installs, read from the make files themselves, and the MPI/ssh tools its tests run.

A test gets an MPI implementation or ssh through `require(request, tool)`. It fails, never skips and never falls
back to another MPI, when no make target that runs the test's directory installs the tool (through
`hack/apt-install.sh --tier T` and hack/tier-packages.txt, or a prerequisite target such as `impi`), even on a
machine that happens to have it; and when the tool is not installed here, naming the target that installs it.
So a tier's list cannot drift from what its tests run (issue 10: `make test-local` ran OpenMPI without
installing it).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPI_DIR = ROOT / ".venv-impi"
# The S3 server the runtime tests start (tests/support/s3server.py); `make versitygw` (mk/runtime.mk) reads this
# line for the version it builds from the Go module proxy into the cache below.
VERSITYGW_VERSION = "v1.8.0"
CACHE = Path(os.environ.get("FTJOB_CACHE") or Path.home() / ".cache" / "finetune-operator")


@dataclass(frozen=True)
class Tool:
    exe: str  # a name on PATH, or a path below the repository root (or an absolute one: a cache)
    apt: str | None = None  # the Debian package that installs it
    make: str | None = None  # or the make target that does


TOOLS = {
    "mpich": Tool("mpirun.mpich", apt="mpich"),
    "openmpi": Tool("mpirun.openmpi", apt="openmpi-bin"),
    "ssh": Tool("ssh", apt="openssh-client"),
    "sshd": Tool("sshd", apt="openssh-server"),
    "versitygw": Tool(str(CACHE / "versitygw" / VERSITYGW_VERSION / "bin" / "versitygw"), make="versitygw"),
}
MPI_IMPLEMENTATIONS = ("mpich", "openmpi", "intel")


def impi_versions() -> dict[str, str]:
    """The Intel MPI (impi-rt) version of each xeon image flavour: what `make impi` installs."""
    out = {}
    for req in sorted((ROOT / "images" / "xeon").glob("requirements-*.txt")):
        m = re.search(r"^impi-rt==(\S+)", req.read_text(), re.M)
        if m:
            out[req.stem.removeprefix("requirements-")] = m.group(1)
    return out


def impi_root(version: str | None = None) -> Path:
    """Where `make impi` put Intel MPI `version` (default: the default xeon image's, the IPEX flavour)."""
    return IMPI_DIR / (version or impi_versions()["ipex"])


def tool(name: str) -> Tool:
    if name.startswith("intel"):  # "intel" or "intel-2021.18.1"
        version = name.partition("-")[2] or None
        return Tool(str(impi_root(version).relative_to(ROOT) / "bin" / "mpirun"), make="impi")
    return TOOLS[name]


@dataclass
class Rule:
    prereqs: list[str]
    recipe: list[str]


@cache
def make_rules() -> dict[str, Rule]:
    """Explicit rules of Makefile and mk/*.mk (targets without variables; what the tiers are made of)."""
    rules: dict[str, Rule] = {}
    current: Rule | None = None
    for f in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))]:
        for line in f.read_text().splitlines():
            if line.startswith("\t") and current is not None:
                current.recipe.append(line.strip())
                continue
            m = re.match(r"^([A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)*):(?![=:])(.*)$", line)
            current = None
            if m and not m.group(1).startswith("."):
                prereqs = m.group(2).split("##", 1)[0].split("|")[0].split()
                current = Rule(prereqs, [])
                for target in m.group(1).split():
                    rules[target] = current
    return rules


def tier_packages() -> dict[str, set[str]]:
    out = {}
    for line in (ROOT / "hack" / "tier-packages.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            target, _, pkgs = line.partition(":")
            out[target.strip()] = set(pkgs.split())
    return out


def targets_running(test_dir: str) -> list[str]:
    """The make targets whose recipe runs pytest on tests/<test_dir>."""
    pat = re.compile(rf"pytest\b.*\btests/{re.escape(test_dir)}\b")
    return sorted(t for t, r in make_rules().items() if any(pat.search(line) for line in r.recipe))


def installs(target: str) -> tuple[set[str], set[str]]:
    """(Debian packages, make targets) that `make target` installs or runs, prerequisites included."""
    rules, tiers = make_rules(), tier_packages()
    pkgs: set[str] = set()
    seen: set[str] = set()
    todo = [target]
    while todo:
        t = todo.pop()
        if t in seen or t not in rules:
            continue
        seen.add(t)
        todo += rules[t].prereqs
        for line in rules[t].recipe:
            m = re.search(r"apt-install\.sh\s+(.*)$", line)
            if not m:
                continue
            words = m.group(1).split()
            if words[:1] == ["--tier"]:
                pkgs |= tiers.get(words[1], set())
            else:
                pkgs |= {w for w in words if not w.startswith(("$", "-"))}
    return pkgs, seen


def missing_from_targets(test_dir: str, name: str) -> list[str]:
    """The targets running tests/<test_dir> that do not install tool `name` (empty: all do)."""
    t = tool(name)
    out = []
    for target in targets_running(test_dir):
        pkgs, targets = installs(target)
        if not ((t.apt and t.apt in pkgs) or (t.make and t.make in targets)):
            out.append(target)
    return out


def require(request: pytest.FixtureRequest, name: str) -> str:
    """Fail unless every make target that runs this test installs tool `name` and it is installed here;
    return the tool's path."""
    test_dir = Path(str(request.path)).resolve().relative_to(ROOT / "tests").parts[0]
    t = tool(name)
    provider = f"Debian package {t.apt}" if t.apt else f"`make {t.make}`"
    targets = targets_running(test_dir)
    if not targets:
        pytest.fail(f"no make target runs tests/{test_dir}: add one that installs what its tests run")
    lacking = missing_from_targets(test_dir, name)
    if lacking:
        pytest.fail(
            f"tests/{test_dir} runs {name} ({provider}) but `make {' / '.join(lacking)}` does not "
            f"install it: add it to hack/tier-packages.txt or the target's prerequisites"
        )
    path = ROOT / t.exe if "/" in t.exe else None
    found = str(path) if path and path.exists() else (shutil.which(t.exe) or shutil.which(t.exe, path="/usr/sbin"))
    if not found:
        pytest.fail(f"{t.exe} ({name}, {provider}) is not installed: run `make {targets[0]}`, which installs it")
    return found


def mpi_env(request: pytest.FixtureRequest, impl: str) -> dict[str, str]:
    """Env for `ftjob-runtime mpirun` / `ftjob run` to use MPI implementation `impl` ("intel" or
    "intel-VERSION" for Intel MPI): checks the tier installs it (require) and points Intel MPI's discovery
    (I_MPI_ROOT, as oneAPI's setvars.sh would) at `make impi`'s copy."""
    found = require(request, impl)
    if impl.startswith("intel"):
        return {"FTJOB_MPI_IMPLEMENTATION": "intel", "I_MPI_ROOT": str(Path(found).parent.parent)}
    return {"FTJOB_MPI_IMPLEMENTATION": impl}
