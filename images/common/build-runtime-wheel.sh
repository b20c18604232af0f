#!/bin/sh
# Builds the finetune-runtime wheel from the repository's runtime/ (bind-mounted at /src/runtime) into /wheels.
# Every image installs this same wheel (install-runtime.sh): one runtime layer for all hardware.
set -eu
# /ftjob is images/common bind-mounted by the Dockerfile.
# shellcheck source=images/common/ca-env.sh
. /ftjob/ca-env.sh
rm -rf /wheels && mkdir -p /wheels
# Build from a copy: the bind mount may be read-only and setuptools writes build/ and *.egg-info next to the sources.
cp -r /src/runtime /tmp/runtime-src
rm -rf /tmp/runtime-src/build /tmp/runtime-src/*.egg-info
/opt/tools/bin/uv build --wheel --out-dir /wheels /tmp/runtime-src
ls -l /wheels
