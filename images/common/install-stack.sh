#!/bin/sh
# Creates /opt/venv on the distribution's python3 and installs an image's pinned stack into it with the builder's
# uv (bind-mounted at /opt/tools; uv itself stays out of the image):
#   install-stack.sh REQUIREMENTS [more uv pip install arguments: --extra-index-url URL, extra pins, ...]
# REQUIREMENTS: a requirements.txt, or a pyproject.toml (its dependencies).
#
# unsafe-best-match: every pin is looked up on every index and the highest match wins, so `torch==2.15.0`
# resolves to 2.15.0+cpu from the PyTorch CPU index rather than PyPI's CUDA build (and oneccl_bind_pt to Intel's
# +cpu wheel), while packages a vendor index also mirrors (numpy, jinja2, ...) still get PyPI's newer versions.
# The indexes the Dockerfiles name are all vendor indexes we trust, which is what "unsafe" is about.
set -eu
requirements=${1:?usage: install-stack.sh REQUIREMENTS [uv pip install arguments...]}
shift
# /ftjob is images/common bind-mounted by the Dockerfile.
# shellcheck source=images/common/ca-env.sh
. /ftjob/ca-env.sh
# copy: the uv cache is a BuildKit cache mount that the image must not link into; never download a Python.
export UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
# uv's cache is the Dockerfiles' BuildKit cache mount; HOME is the image user's, whose ~/.cache would otherwise
# end up in the layer.
export UV_CACHE_DIR=/root/.cache/uv
/opt/tools/bin/uv venv --python /usr/bin/python3 /opt/venv
/opt/tools/bin/uv pip install --python /opt/venv/bin/python --index-strategy unsafe-best-match \
  -r "$requirements" "$@"
