#!/usr/bin/env bash
# Builds a Debian bookworm base image from a debootstrap rootfs, for machines that reach Debian mirrors but no
# container registry (this VM, CI). Runs once: an existing image of that name is kept
# while this script is unchanged (its hash is a label of the image).
#   usage: base-image.sh [IMAGE]   (default finetune-operator/debian-base:bookworm)
set -euo pipefail
IMAGE=${1:-finetune-operator/debian-base:bookworm}
SUITE=${DEBIAN_SUITE:-bookworm}
DOCKER=${DOCKER:-/usr/bin/docker}

# The image records a hash of this script: a change here (e.g. what is trimmed) rebuilds it, anything else keeps it.
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
if [ "$("$DOCKER" image inspect --format '{{index .Config.Labels "dev.finetune.base-recipe"}}' "$IMAGE" 2>/dev/null)" = "$recipe" ]; then
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
# Slim it the way Docker's debian:*-slim images are: this layer is under every image we build (the operator's
# included), and a later layer cannot take back what a lower one holds. dpkg skips docs, man pages and
# translations from now on (copyright files stay), apt keeps no .debs and no package caches.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/ftjob-slim" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
DPKG
cat >"$rootfs/etc/apt/apt.conf.d/ftjob-slim" <<'APT'
APT::Keep-Downloaded-Packages "false";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/lintian/* \
  "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* "$rootfs"/var/cache/debconf/*-old

tar --numeric-owner -C "$rootfs" -c . | "$DOCKER" import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --change "LABEL dev.finetune.base-recipe=$recipe" \
  --message "debootstrap --variant=minbase $SUITE $mirror" \
  - "$IMAGE"
echo "imported $IMAGE"
