#!/usr/bin/env bash
# Builds one image: images/scripts/build.sh FLAVOR [extra docker build args...]
#   FLAVOR: cpu | nvidia | xeon | xeon-upstream | neuron | operator
# Environment:
#   IMAGE_TAG        tag; the image is finetune-operator/FLAVOR:IMAGE_TAG. Default: the runtime package's
#                    version (runtime/pyproject.toml), the tag the operator's hardware profiles name; for
#                    `operator` the operator package's version (operator/pyproject.toml), the chart's appVersion
#   BASE_IMAGE       base image; when unset and no registry is reachable, a debootstrap'ed Debian base is built
#                    once (base-image.sh) and used (Debian-based flavors only)
#   TORCH_INDEX_URL  passed through to flavors that take it
#   CA_BUNDLE        extra CA bundle for TLS-intercepting proxies, passed as a BuildKit secret (default: the
#                    host's bundle when it exists); it is never stored in the image
#   OFFLINE          1 = never try a registry (default: probe registry-1.docker.io)
#   BUILD_CACHE_KEEP BuildKit cache kept after a build (default 15GB; least recently used goes first). Every
#                    flavor's venv is several GB and the uv download cache as much again: without a budget
#                    a few rebuilds fill a CI disk.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
DOCKER=${DOCKER:-/usr/bin/docker}
flavor=${1:?usage: build.sh cpu|nvidia|xeon|xeon-upstream|neuron|operator [docker build args...]}
shift
package=runtime
if [ "$flavor" = operator ]; then package=operator; fi
package_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/$package/pyproject.toml")
tag=${IMAGE_TAG:-$package_version}

dockerfile=images/$flavor/Dockerfile
stack=()
case "$flavor" in
  cpu|nvidia|neuron|operator) ;;
  xeon) stack=(--build-arg XEON_STACK=ipex) ;;
  xeon-upstream) dockerfile=images/xeon/Dockerfile; stack=(--build-arg XEON_STACK=upstream) ;;
  *) echo "unknown flavor $flavor" >&2; exit 2 ;;
esac

args=()
if [ -z "${BASE_IMAGE:-}" ]; then
  offline=${OFFLINE:-}
  if [ -z "$offline" ]; then
    # A registry answers 401 to an anonymous /v2/ probe; no answer at all means offline.
    if curl -s -o /dev/null --max-time 5 https://registry-1.docker.io/v2/; then offline=0; else offline=1; fi
  fi
  if [ "$offline" = 1 ]; then
    case "$flavor" in
      neuron) echo "neuron needs an Ubuntu 24.04 base: set BASE_IMAGE (no registry reachable)" >&2; exit 2 ;;
      *) "$here/base-image.sh" finetune-operator/debian-base:bookworm; BASE_IMAGE=finetune-operator/debian-base:bookworm ;;
    esac
  fi
fi
if [ -n "${BASE_IMAGE:-}" ]; then args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE"); fi
# Flavors whose default torch index is the PyTorch CPU index fall back to PyPI when that index is unreachable
# (machines that reach only PyPI): PyPI's torch is the CUDA build, larger but it runs on CPU.
# The operator image has no torch.
if [ -z "${TORCH_INDEX_URL:-}" ] && [ "$flavor" != nvidia ] && [ "$flavor" != operator ]; then
  if ! curl -fs -o /dev/null --max-time 10 https://download.pytorch.org/whl/cpu/torch/; then
    echo "download.pytorch.org unreachable: torch from PyPI (TORCH_INDEX_URL=https://pypi.org/simple)" >&2
    TORCH_INDEX_URL=https://pypi.org/simple
  fi
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"); fi
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
if [ -s "$ca" ]; then args+=(--secret "id=ca,src=$ca"); fi
rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
args+=(--build-arg "FTJOB_VERSION=$tag" --build-arg "VCS_REF=$rev")

cd "$root"
start=$SECONDS
DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain -f "$dockerfile" "${stack[@]}" "${args[@]}" \
  -t "finetune-operator/$flavor:$tag" "$@" .
echo "built finetune-operator/$flavor:$tag in $((SECONDS - start))s"
"$DOCKER" builder prune -f --keep-storage "${BUILD_CACHE_KEEP:-15GB}" >/dev/null
