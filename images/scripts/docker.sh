# shellcheck shell=bash
# Sourced by the image scripts: finds a Docker CLI that builds with BuildKit and sets
#   DOCKER        that CLI (DOCKER= in the environment picks one; it must pass the same check)
#   DOCKER_BUILD  an array: the command that builds into the daemon's image store with BuildKit
# A CLI qualifies when it has buildx whose current builder uses the `docker` driver (it builds into the
# daemon's image store, where the flavors find the shared base images: images/README.md, "Layout"), then
# `docker buildx build --load`; or when it is older than 23.0, whose legacy `docker build` still runs the
# daemon's BuildKit with DOCKER_BUILDKIT=1 (Debian's docker.io 20.10). A 23+ CLI without buildx refuses
# BuildKit builds altogether. Candidates, in order: every `docker` on PATH, then /usr/bin/docker.
# ftjob_docker_platform PLATFORM: the suffix the shared base images' tags carry for PLATFORM ("" for
# linux/amd64, the platform every image is released for first; "-arm64" for linux/arm64).

ftjob_docker_builds() {  # CLI -> prints "buildx" or "legacy" when it can build with BuildKit
  local cli=$1 version major driver
  [ -x "$cli" ] || return 1
  if "$cli" buildx version >/dev/null 2>&1; then
    driver=$("$cli" buildx inspect 2>/dev/null | sed -n 's/^Driver: *//p' | head -n1)
    if [ "$driver" = docker ]; then echo buildx; return 0; fi
  fi
  version=$("$cli" --version 2>/dev/null | sed -n 's/^Docker version \([0-9][0-9]*\)\..*/\1/p')
  major=${version:-0}
  if [ "$major" -gt 0 ] && [ "$major" -lt 23 ]; then echo legacy; return 0; fi
  return 1
}

ftjob_find_docker() {
  local cli kind candidates=()
  if [ -n "${DOCKER:-}" ]; then
    candidates=("$DOCKER")
  else
    mapfile -t candidates < <(type -ap docker)
    candidates+=(/usr/bin/docker)
  fi
  for cli in "${candidates[@]}"; do
    if kind=$(ftjob_docker_builds "$cli"); then
      DOCKER=$cli
      # shellcheck disable=SC2034  # the array the sourcing script builds with
      if [ "$kind" = buildx ]; then
        DOCKER_BUILD=(env "$cli" buildx build --load)
      else
        DOCKER_BUILD=(env DOCKER_BUILDKIT=1 "$cli" build)
      fi
      return 0
    fi
  done
  echo "no Docker CLI here builds with BuildKit (tried: ${candidates[*]}). Install buildx (and use a builder" \
    "with the docker driver: docker buildx use default), or a CLI older than 23.0 such as Debian's docker.io" \
    "(make images-docker), or name one with DOCKER=" >&2
  return 1
}

ftjob_docker_platform() {
  case "$1" in
    linux/amd64) echo "" ;;
    linux/arm64) echo "-arm64" ;;
    *) echo "unsupported platform $1 (linux/amd64 or linux/arm64)" >&2; return 1 ;;
  esac
}

ftjob_find_docker || exit 1
export DOCKER
