#!/usr/bin/env bash
# Idempotent: installs the named Debian packages only when one of them is missing.
# Used by make targets and .ci/run so a fresh machine needs no manual step.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
stamp=/var/lib/apt/periodic/finetune-operator-update
if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +360 2>/dev/null)" ]; then
  $SUDO apt-get update -q
  $SUDO mkdir -p "$(dirname "$stamp")" && $SUDO touch "$stamp"
fi
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
