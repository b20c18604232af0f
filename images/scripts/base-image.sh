#!/usr/bin/env bash
# Builds a Debian bookworm base image from a debootstrap rootfs, for machines that reach Debian mirrors but no
# container registry (this VM, CI). Runs once: an existing image of that name is kept.
#   usage: base-image.sh [IMAGE]   (default finetune-operator/debian-base:bookworm)
set -euo pipefail
IMAGE=${1:-finetune-operator/debian-base:bookworm}
SUITE=${DEBIAN_SUITE:-bookworm}
DOCKER=${DOCKER:-/usr/bin/docker}

if "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base image $IMAGE exists"
  exit 0
fi

# The mirror this machine already trusts (deb822 `URIs:` or one-line `deb URL`), so the rootfs comes from the
# same place apt does here; deb.debian.org otherwise.
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/* \
    | grep -oE 'https?://[^ ]+/debian/?$|https?://[^ ]+/debian ' | head -n1 | tr -d ' ' || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-${mirror%/debian*}/debian-security}

rootfs=$(mktemp -d /var/tmp/ftjob-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap $SUITE from $mirror into $rootfs"
debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror"

# Same sources a debian:bookworm image carries, so images built on top get point-release and security fixes.
cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb $security $SUITE-security main
SOURCES
# Nothing from the bootstrap is needed at run time; keep the imported layer small.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log

tar --numeric-owner -C "$rootfs" -c . | "$DOCKER" import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase $SUITE $mirror" \
  - "$IMAGE"
echo "imported $IMAGE"
