#!/bin/sh
# Creates /opt/venv on the distribution's python3 and installs an image's pinned stack into it with the builder's
# uv (bind-mounted at /opt/tools; uv itself stays out of the image):
#   install-stack.sh [uv pip install arguments: -r requirements.txt, --extra-index-url ..., ...]
set -eu
# /ftjob is images/common bind-mounted by the Dockerfile.
# shellcheck source=images/common/ca-env.sh
. /ftjob/ca-env.sh
# copy: the uv cache is a BuildKit cache mount that the image must not link into; never download a Python.
export UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
# uv's cache is the Dockerfiles' BuildKit cache mount; HOME is the image user's, whose ~/.cache would otherwise
# end up in the layer.
export UV_CACHE_DIR=/root/.cache/uv
/opt/tools/bin/uv venv --python /usr/bin/python3 /opt/venv
/opt/tools/bin/uv pip install --python /opt/venv/bin/python "$@"
