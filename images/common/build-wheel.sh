#!/bin/sh
# Builds the wheel of one of the repository's packages (runtime or operator, bind-mounted at /src/PACKAGE) into
# /wheels/PACKAGE, in the builder image (images/base/Dockerfile). Every runtime image installs the same runtime
# wheel (install-runtime.sh): one runtime layer for all hardware; the operator image installs the other.
set -eu
# /ftjob is images/common bind-mounted by the Dockerfile.
# shellcheck source=images/common/ca-env.sh
. /ftjob/ca-env.sh
package=${1:?usage: build-wheel.sh runtime|operator}
# uv's cache is the Dockerfiles' BuildKit cache mount; HOME is the image user's, whose ~/.cache would otherwise
# end up in the layer.
export UV_CACHE_DIR=/root/.cache/uv
rm -rf "/wheels/$package" && mkdir -p "/wheels/$package"
# Build from a copy: the bind mount may be read-only and setuptools writes build/ and *.egg-info next to the sources.
# -L: the package's VERSION is a link to the repository's (/src/VERSION, bind-mounted too); the copy holds the file.
rm -rf "/tmp/$package-src" && cp -rL "/src/$package" "/tmp/$package-src"
rm -rf "/tmp/$package-src/build" "/tmp/$package-src"/*.egg-info
/opt/tools/bin/uv build --wheel --out-dir "/wheels/$package" "/tmp/$package-src"
rm -rf "/tmp/$package-src"
ls -l "/wheels/$package"
