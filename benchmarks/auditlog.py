"""Counting one user's API requests from a kube-apiserver audit log (JSON lines, one event per request).

The audit log is the API server's own record, so the counts include everything a client library hides
(retries, watch restarts, discovery) and nothing from other clients."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


def policy_for_user(user: str) -> dict[str, Any]:
    """Metadata-level events for `user` only, one per request (at ResponseComplete; a watch is counted when it
    ends), nothing for anyone else."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [{"level": "Metadata", "users": [user]}, {"level": "None"}],
    }


def request_key(event: dict[str, Any]) -> str:
    """`verb resource[/subresource]`, e.g. `list pods`, `patch finetunejobs/status`, `get /apis` (discovery)."""
    ref = event.get("objectRef") or {}
    resource = ref.get("resource")
    if not resource:
        return f"{event.get('verb', '?')} {event.get('requestURI', '?').split('?')[0]}"
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event.get('verb', '?')} {resource}"


def count_requests(log: Path, user: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    if not log.exists():
        return counts
    with log.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            event = json.loads(line)
            if (event.get("user") or {}).get("username") == user and event.get("stage") == "ResponseComplete":
                counts[request_key(event)] += 1
    return counts
