#!/usr/bin/env bash
# Makes sure a Docker daemon answers. CI machines and this VM have no init system running dockerd, so we start
# Debian's dockerd in the background when `docker info` fails, and poll (with a deadline) until it answers.
# Idempotent: does nothing when a daemon already runs (another area may have started it).
set -euo pipefail
# A CLI that builds with BuildKit (docker.sh), the one the builds will use.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=images/scripts/docker.sh
source "$here/docker.sh"
LOG=${DOCKERD_LOG:-/var/log/ftjob-dockerd.log}
DEADLINE_S=${DOCKERD_DEADLINE_S:-60}

if "$DOCKER" info >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "dockerd not installed: run hack/apt-install.sh docker.io" >&2
  exit 1
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
# setsid + nohup: the daemon must outlive the make invocation that started it.
$SUDO setsid nohup dockerd >"$LOG" 2>&1 </dev/null &
end=$((SECONDS + DEADLINE_S))
until "$DOCKER" info >/dev/null 2>&1; do
  if [ "$SECONDS" -ge "$end" ]; then
    echo "dockerd did not answer within ${DEADLINE_S}s; last log lines:" >&2
    tail -n 30 "$LOG" >&2 || true
    exit 1
  fi
  sleep 0.5
done
echo "dockerd is up"
