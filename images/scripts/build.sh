#!/usr/bin/env bash
# Builds one image: images/scripts/build.sh FLAVOR [extra docker build args...]
#   FLAVOR: cpu | nvidia | xeon | xeon-upstream | neuron | neuron-native | operator, or `base` (only the shared
#   base images)
# Every flavor is a thin FROM of the shared base (images/base/Dockerfile): its targets are built and tagged first,
# as finetune-operator/{base,runtime-base,builder}:SUITE (SUITE: bookworm; noble for neuron, resolute for
# neuron-native), and the flavor
# names them through its RUNTIME_BASE/BASE and BUILDER build args. Unchanged, they rebuild from cache in seconds.
# Docker: the first CLI that builds with BuildKit (images/scripts/docker.sh; DOCKER= picks one).
# Environment:
#   PLATFORM         linux/amd64 (default) or linux/arm64, passed to every build as --platform, so the image's
#                    architecture never depends on the host's. The shared base images of linux/arm64 are tagged
#                    SUITE-arm64 (finetune-operator/base:bookworm-arm64), those of linux/amd64 SUITE. A platform
#                    that is not the daemon's own needs emulation (images/scripts/platform-check.sh says why
#                    and refuses it otherwise)
#   IMAGE_TAG        tag; the image is finetune-operator/FLAVOR:IMAGE_TAG. Default: the repository's VERSION,
#                    the operator's default runtime image tag and the chart's appVersion
#   BASE_IMAGE       what the shared base starts from (default debian:bookworm-slim, ubuntu:24.04 for neuron,
#                    ubuntu:26.04 for neuron-native);
#                    when unset and no registry is reachable, a debootstrap'ed Debian base is built once
#                    (base-image.sh) and used (Debian-based flavors only)
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
# shellcheck source=images/scripts/docker.sh
source "$here/docker.sh"
platform=${PLATFORM:-linux/amd64}
arch_suffix=$(ftjob_docker_platform "$platform")
"$here/platform-check.sh" "$platform"
flavor=${1:?usage: build.sh cpu|nvidia|xeon|xeon-upstream|neuron|neuron-native|operator|base [docker build args...]}
shift
tag=${IMAGE_TAG:-$(cat "$root/VERSION")}

dockerfile=images/$flavor/Dockerfile
stack=()
suite=bookworm
# What the flavor starts from: the operator needs no runtime packages, only the plain base.
from_arg=RUNTIME_BASE
case "$flavor" in
  base|cpu|nvidia) ;;
  operator) from_arg=BASE ;;
  neuron) suite=noble ;;
  neuron-native) suite=resolute ;;
  xeon) stack=(--build-arg XEON_STACK=ipex) ;;
  xeon-upstream)
    dockerfile=images/xeon/Dockerfile
    stack=(--build-arg XEON_STACK=upstream --build-arg XEON_BACKEND=xeon-upstream) ;;
  *) echo "unknown flavor $flavor" >&2; exit 2 ;;
esac

base_args=()
if [ -z "${BASE_IMAGE:-}" ]; then
  offline=${OFFLINE:-}
  if [ -z "$offline" ]; then
    # A registry answers 401 to an anonymous /v2/ probe; no answer at all means offline.
    if curl -s -o /dev/null --max-time 5 https://registry-1.docker.io/v2/; then offline=0; else offline=1; fi
  fi
  if [ "$offline" = 1 ]; then
    case "$flavor" in
      neuron|neuron-native) echo "$flavor needs an Ubuntu base: set BASE_IMAGE (no registry reachable)" >&2; exit 2 ;;
      *)
        # base-image.sh debootstraps the host's architecture: another one's second stage would run its binaries
        # under emulation, and that script's hash labels the image, so a change to it rebuilds every image.
        if [ "$platform" != linux/amd64 ]; then
          echo "$platform with no registry reachable: set BASE_IMAGE to a Debian bookworm image of $platform" \
            "(the offline base, images/scripts/base-image.sh, is built for linux/amd64 only)" >&2
          exit 2
        fi
        "$here/base-image.sh" finetune-operator/debian-base:bookworm
        BASE_IMAGE=finetune-operator/debian-base:bookworm
        ;;
    esac
  fi
fi
if [ -z "${BASE_IMAGE:-}" ] && [ "$suite" = noble ]; then BASE_IMAGE=ubuntu:24.04; fi
if [ -z "${BASE_IMAGE:-}" ] && [ "$suite" = resolute ]; then BASE_IMAGE=ubuntu:26.04; fi
if [ -n "${BASE_IMAGE:-}" ]; then base_args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE"); fi
args=()
# Flavors whose default torch index is the PyTorch CPU index fall back to PyPI when that index is unreachable
# (machines that reach only PyPI): PyPI's torch is the CUDA build, larger but it runs on CPU.
# The operator image has no torch.
if [ -z "${TORCH_INDEX_URL:-}" ] && [ "$flavor" != nvidia ] && [ "$flavor" != operator ] && [ "$flavor" != base ]; then
  if ! curl -fs -o /dev/null --max-time 10 https://download.pytorch.org/whl/cpu/torch/; then
    echo "download.pytorch.org unreachable: torch from PyPI (TORCH_INDEX_URL=https://pypi.org/simple)" >&2
    TORCH_INDEX_URL=https://pypi.org/simple
  fi
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"); fi
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
secret=()
if [ -s "$ca" ]; then secret=(--secret "id=ca,src=$ca"); fi
# The revision is the last commit that changed the image's inputs, not HEAD: a label is part of the image ID,
# and a new ID for every unrelated commit made the e2e node re-import the multi-GB cpu image each time.
inputs=(runtime images requirements VERSION)
if [ "$flavor" = operator ]; then inputs=(operator images VERSION); fi
rev=$(git -C "$root" log -1 --format=%h -- "${inputs[@]}" 2>/dev/null || true)
rev=${rev:-unknown}
# Labels, not build args: metadata of the final image only, so a new commit leaves every layer's cache alone.
args+=(--label "org.opencontainers.image.version=$tag" --label "org.opencontainers.image.revision=$rev")
# dev.finetune.versions.*: the stack's versions, from the flavor's lock or, unlocked, its pins (one source each).
if [ "$flavor" != base ]; then
  stack_labels=$(python3 "$root/hack/lock.py" labels "$flavor")
  while IFS= read -r label; do args+=(--label "$label"); done <<<"$stack_labels"
fi

cd "$root"
start=$SECONDS
# The shared base first: each target an image of its own, so a flavor's FROM finds it in the local image store.
for target in base runtime-base builder; do
  if [ "$flavor" = operator ] && [ "$target" = runtime-base ]; then continue; fi
  "${DOCKER_BUILD[@]}" --progress=plain --platform "$platform" -f images/base/Dockerfile --target "$target" \
    "${base_args[@]}" "${secret[@]}" -t "finetune-operator/$target:$suite$arch_suffix" .
done
echo "built the shared base (finetune-operator/{base,runtime-base,builder}:$suite$arch_suffix, $platform) in $((SECONDS - start))s"
if [ "$flavor" = base ]; then exit 0; fi
base_tag=finetune-operator/base:$suite$arch_suffix
if [ "$from_arg" = RUNTIME_BASE ]; then base_tag=finetune-operator/runtime-base:$suite$arch_suffix; fi
"${DOCKER_BUILD[@]}" --progress=plain --platform "$platform" -f "$dockerfile" "${stack[@]}" "${args[@]}" "${secret[@]}" \
  --build-arg "$from_arg=$base_tag" --build-arg "BUILDER=finetune-operator/builder:$suite$arch_suffix" \
  -t "finetune-operator/$flavor:$tag" "$@" .
echo "built finetune-operator/$flavor:$tag ($platform) in $((SECONDS - start))s"
"$DOCKER" builder prune -f --keep-storage "${BUILD_CACHE_KEEP:-15GB}" >/dev/null
