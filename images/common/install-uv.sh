#!/bin/sh
# Installs uv into /opt/tools (a build-only venv that no final image keeps): it resolves and downloads the large
# wheel sets (torch + CUDA libs, Neuron, IPEX) in parallel and caches them in a BuildKit cache mount.
set -eu
# /ftjob is images/common bind-mounted by the Dockerfile.
# shellcheck source=images/common/ca-env.sh
. /ftjob/ca-env.sh
UV_VERSION=${UV_VERSION:?UV_VERSION must be set}
python3 -m venv /opt/tools
/opt/tools/bin/pip install --no-cache-dir --disable-pip-version-check "uv==${UV_VERSION}"
/opt/tools/bin/uv --version
