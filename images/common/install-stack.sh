#!/bin/sh
# Creates /opt/venv on the distribution's python3 and installs an image's pinned stack into it with the builder's
# uv (bind-mounted at /opt/tools; uv itself stays out of the image):
#   install-stack.sh [--lock LOCK] REQUIREMENTS [more uv pip install arguments: -r FILE, --extra-index-url URL, ...]
# REQUIREMENTS: a requirements.txt, or a pyproject.toml (its dependencies).
# LOCK: the flavor's lock (hack/lock.py, `make lock`): every package the image may hold, its version and hashes.
# uv takes it as constraints, so each download is checked against the locked hashes and nothing unlocked can be
# resolved; afterwards every installed package must be in the lock at its version (torch, locked by version only
# because its wheel depends on the index, may carry that index's local label: 2.15.0+cpu). Constraints rather
# than the lock itself as requirements: the lock also holds the CUDA wheels that only PyPI's torch needs, and with
# the CPU index's torch they are not installed. Flavors whose vendor index cannot be locked pass no LOCK.
#
# unsafe-best-match: every pin is looked up on every index and the highest match wins, so `torch==2.15.0`
# resolves to 2.15.0+cpu from the PyTorch CPU index rather than PyPI's CUDA build (and oneccl_bind_pt to Intel's
# +cpu wheel), while packages a vendor index also mirrors (numpy, jinja2, ...) still get PyPI's newer versions.
# The indexes the Dockerfiles name are all vendor indexes we trust, which is what "unsafe" is about.
set -eu
lock=
if [ "${1:-}" = --lock ]; then
  lock=${2:?--lock needs a file}
  shift 2
fi
requirements=${1:?usage: install-stack.sh [--lock LOCK] REQUIREMENTS [uv pip install arguments...]}
shift
# /ftjob is images/common bind-mounted by the Dockerfile.
# shellcheck source=images/common/ca-env.sh
. /ftjob/ca-env.sh
# copy: the uv cache is a BuildKit cache mount that the image must not link into; never download a Python.
export UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
# Bytecode now, in the layer: the image user cannot write /opt/venv, so without it every process of every pod
# compiled torch and transformers from source again (seconds per rank; benchmarks/README.md, time to the first
# step). Timestamp .pyc: the layer keeps the sources' mtimes (tests/images checks that Python uses them).
export UV_COMPILE_BYTECODE=1
# uv's cache is the Dockerfiles' BuildKit cache mount; HOME is the image user's, whose ~/.cache would otherwise
# end up in the layer.
export UV_CACHE_DIR=/root/.cache/uv
/opt/tools/bin/uv venv --python /usr/bin/python3 /opt/venv
if [ -z "$lock" ]; then
  /opt/tools/bin/uv pip install --python /opt/venv/bin/python --index-strategy unsafe-best-match \
    -r "$requirements" "$@"
  exit 0
fi
/opt/tools/bin/uv pip install --python /opt/venv/bin/python --index-strategy unsafe-best-match \
  -r "$requirements" -c "$lock" "$@"
/opt/venv/bin/python - "$lock" <<'PY'
import importlib.metadata as md
import re
import sys


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


locked = {}
with open(sys.argv[1], encoding="utf-8") as lock:
    for line in lock:
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)", line)
        if m:
            locked[normalize(m[1])] = m[2]
problems = []
for dist in md.distributions():
    name, have = normalize(dist.metadata["Name"]), dist.version
    want = locked.get(name)
    if want is None:
        problems.append(f"{name}=={have} is not in the lock")
    elif have.split("+")[0] != want:
        problems.append(f"{name}=={have}, the lock says {want}")
if problems:
    sys.exit(f"the installed stack is not {sys.argv[1]} (run `make lock`):\n  " + "\n  ".join(problems))
print(f"{len(locked)} locked packages; the {sum(1 for _ in md.distributions())} installed ones are locked ones")
PY
