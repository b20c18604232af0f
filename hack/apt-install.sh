#!/usr/bin/env bash
# Idempotent: installs the named Debian packages only when one of them is missing.
# Used by make targets and .ci/run so a fresh machine needs no manual step.
#   hack/apt-install.sh PKG...          those packages
#   hack/apt-install.sh --tier TARGET   the line for TARGET in hack/tier-packages.txt (what its tests run)
set -euo pipefail
if [ "${1:-}" = "--tier" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 --tier TARGET" >&2; exit 2; }
  list="$(dirname "$0")/tier-packages.txt"
  line=$(grep -E "^$2:" "$list" || true)
  [ -n "$line" ] || { echo "$0: no line for $2 in $list" >&2; exit 2; }
  # shellcheck disable=SC2086 # the package list splits on spaces
  set -- ${line#*:}
fi
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
