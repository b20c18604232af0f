#!/bin/sh
# Removes kubernetes/aio from the operator's venv: the kubernetes client (37.x) ships a second, asyncio copy of
# the whole generated API there, ~68 MB of the image with its .pyc files. The operator talks to the API through
# the synchronous client (finetune_operator/k8s.py) and kopf's own aiohttp session; nothing else imports it.
# That is checked here, not assumed: the build fails if any other installed module mentions kubernetes.aio, so a
# new dependency that needs it shows up at once instead of as an ImportError in a cluster.
set -eu
site=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
aio="$site/kubernetes/aio"
test -d "$aio" || { echo "no $aio: nothing to prune (kubernetes client layout changed?)" >&2; exit 1; }
users=$(grep -rlE --include='*.py' 'kubernetes[.]aio|from kubernetes import aio' "$site" | grep -v "^$aio/" || true)
if [ -n "$users" ]; then
  printf 'kubernetes.aio is imported by:\n%s\nkeep it (drop this prune step)\n' "$users" >&2
  exit 1
fi
rm -rf "$aio"
echo "removed $aio"
