#!/bin/sh
# Creates the image user every rank pod runs as. The UID is fixed (1000) because the operator's pod security
# context (runAsUser/fsGroup) and the sshd the runtime starts on port 2222 rely on it; HOME=/home/ftjob is the
# path the operator mounts an emptyDir on (docs/architecture.md).
set -eu
FTJOB_UID=${FTJOB_UID:-1000}
# Ubuntu 24.04 images ship a user `ubuntu` with UID 1000; it would shadow ours.
existing=$(getent passwd "$FTJOB_UID" | cut -d: -f1 || true)
if [ -n "$existing" ] && [ "$existing" != ftjob ]; then
  userdel --remove "$existing" 2>/dev/null || userdel "$existing"
fi
if getent group "$FTJOB_UID" >/dev/null && [ "$(getent group "$FTJOB_UID" | cut -d: -f1)" != ftjob ]; then
  groupdel "$(getent group "$FTJOB_UID" | cut -d: -f1)"
fi
groupadd --gid "$FTJOB_UID" ftjob
useradd --uid "$FTJOB_UID" --gid "$FTJOB_UID" --create-home --home-dir /home/ftjob --shell /bin/bash ftjob
# Mount points the operator uses; owned by the user so a local `docker run` without volumes still works.
mkdir -p /output /cache /etc/ftjob
chown ftjob:ftjob /output /cache
# sshd refuses to start without its privilege-separation directory, even when it runs unprivileged.
mkdir -p /run/sshd && chmod 0755 /run/sshd
