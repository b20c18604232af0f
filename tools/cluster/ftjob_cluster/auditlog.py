"""Counting one user's API requests from a kube-apiserver audit log (JSON lines, one event per request).

The audit log is the API server's own record, so the counts include everything a client library hides
(retries, watch restarts, discovery) and nothing from other clients."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


def policy_for_user(*users: str) -> dict[str, Any]:
    """Metadata-level events for `users` only (one per system under test), nothing for anyone else. Every
    request ends with a ResponseComplete event; a watch also has a ResponseStarted one when its stream opens."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": list(users)}, {"level": "None"}],
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


def _events(log: Path, user: str) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    with log.open(encoding="utf-8") as f:
        events = [json.loads(line) for line in f if line.strip()]
    return [e for e in events if (e.get("user") or {}).get("username") == user]


def _counted(event: dict[str, Any]) -> bool:
    # A watch is counted when it opens (it may outlive the measurement); anything else when it completes.
    return event.get("stage") == ("ResponseStarted" if event.get("verb") == "watch" else "ResponseComplete")


def count_requests(log: Path, user: str, namespace: str | None = None) -> Counter[str]:
    """`verb resource` -> number of requests by `user` (in `namespace` only, when given: cluster-wide watches
    and other namespaces' requests left out)."""
    return Counter(
        request_key(e)
        for e in _events(log, user)
        if _counted(e) and (namespace is None or (e.get("objectRef") or {}).get("namespace") == namespace)
    )


def watch_uris(log: Path, user: str) -> list[str]:
    """The distinct request URIs of `user`'s watches (shows whether they carry label selectors)."""
    return sorted({e.get("requestURI", "") for e in _events(log, user) if _counted(e) and e.get("verb") == "watch"})


Permission = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb), as an RBAC rule names them


def permissions_used(log: Path, user: str) -> set[Permission]:
    """What `user` asked the API server to do, in RBAC's terms: the API group ("" for core), the resource with
    its subresource, and the verb. Requests to non-resource URLs (discovery, /version) are left out: no role of
    ours grants them (every authenticated user may read them)."""
    out: set[Permission] = set()
    for e in _events(log, user):
        ref = e.get("objectRef") or {}
        if not ref.get("resource") or e.get("stage") not in ("ResponseStarted", "ResponseComplete"):
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        out.add((ref.get("apiGroup") or "", resource, str(e.get("verb"))))
    return out
