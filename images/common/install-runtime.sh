#!/bin/sh
# Installs the shared runtime wheel (/wheels/runtime of the builder image, from build-wheel.sh) into the image's
# venv without touching its dependencies: each image pins its own torch/transformers stack, so pulling the
# runtime's open-ended requirements here could silently swap a vendor build (torch-neuronx's torch, IPEX's torch)
# for a PyPI one.
# Instead we fail the build when the pinned stack does not satisfy what the runtime declares.
set -eu
VENV=${VENV:-/opt/venv}
# No uv cache at all here: it would land in the image user's HOME (~/.cache/uv), i.e. in this layer.
export UV_NO_CACHE=1
# The runtime's own bytecode (install-stack.sh compiled the stack's; uv leaves valid .pyc as they are).
export UV_COMPILE_BYTECODE=1
/opt/tools/bin/uv pip install --python "$VENV/bin/python" --no-deps /wheels/runtime/finetune_runtime-*.whl
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

problems = []
for spec in md.requires("finetune-runtime") or []:
    req = Requirement(spec)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        problems.append(f"{req.name}: missing (runtime wants {req})")
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        problems.append(f"{req.name}: {have} does not satisfy {req}")
if problems:
    sys.exit("the image's pinned stack does not satisfy finetune-runtime:\n  " + "\n  ".join(problems))
print("finetune-runtime", md.version("finetune-runtime"), "installed; requirements satisfied")
PY
test -x "$VENV/bin/ftjob-runtime"
# The exact set this image ended up with (the flavor's lock where it has one, then the runtime's wheel): kept in the
# image so a job's environment can be reproduced or diffed later (`cat /opt/venv/ftjob-freeze.txt`).
/opt/tools/bin/uv pip freeze --python "$VENV/bin/python" > "$VENV/ftjob-freeze.txt"
