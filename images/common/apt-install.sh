#!/bin/sh
# Installs Debian/Ubuntu packages in one image layer and leaves nothing of apt's behind (package lists, .debs,
# caches): the debootstrap'ed offline base and Ubuntu's image do not clean up after apt by themselves.
#   apt-install.sh PACKAGE...
set -eu
# /ftjob is images/common bind-mounted by the Dockerfile.
# shellcheck source=images/common/ca-env.sh
. /ftjob/ca-env.sh
apt-get update -o "Acquire::https::CAInfo=${APT_CA_FILE}"
apt-get install -y --no-install-recommends -o "Acquire::https::CAInfo=${APT_CA_FILE}" "$@"
apt-get clean
rm -rf /var/lib/apt/lists/*
