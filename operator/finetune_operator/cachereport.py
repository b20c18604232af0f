"""status.compileCache: what the precompile trial of the current attempt found in the compile cache.

The runtime's launcher writes the trial's report into the termination message of the precompile init
container (`{"compileCache": {...}}`; runtime/finetune_runtime/relay.py). The kubelet copies it into the pod's
status, so it is read from the pod the operator already watches: rank 0's pod (torchrun) or the launcher pod
(MPI, whose mpirun prints every rank's output). The message is written by code in the user's image: only known
fields of the expected types are kept.
"""

from __future__ import annotations

import json
from typing import Any

from . import constants as c

_FIELDS: dict[str, tuple[type, ...]] = {
    "warm": (bool,),
    "entriesBefore": (int,),
    "entriesAfter": (int,),
    "graphHits": (int,),
    "graphMisses": (int,),
    "trialSeconds": (int, float),
    "steps": (int,),
    "time": (str,),
}


def _clean(doc: Any) -> dict[str, Any] | None:
    cache = doc.get("compileCache") if isinstance(doc, dict) else None
    if not isinstance(cache, dict) or not isinstance(cache.get("warm"), bool):
        return None
    out = {}
    for key, types in _FIELDS.items():
        value = cache.get(key)
        # bool is an int to isinstance: a count given as true/false is dropped, not kept as 1/0.
        if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
            out[key] = value[:64] if isinstance(value, str) else value
    return out


def trial_report(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The report in `pod`'s finished precompile init container, or None (none yet, failed, or unreadable)."""
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if cs.get("name") != c.INIT_PRECOMPILE:
            continue
        done = (cs.get("state") or {}).get("terminated") or {}
        if done.get("exitCode") != 0:
            return None
        try:
            return _clean(json.loads(done.get("message") or ""))
        except ValueError:
            return None
    return None


def describe(report: dict[str, Any]) -> str:
    """Event text, e.g. 'compile cache warm: 4 graphs from the cache, 0 compiled; trial 8.6 s'."""
    parts = [f"compile cache {'warm' if report['warm'] else 'cold'}"]
    if "graphHits" in report and "graphMisses" in report:
        parts.append(f": {report['graphHits']} graph(s) from the cache, {report['graphMisses']} compiled")
    elif "entriesBefore" in report and "entriesAfter" in report:
        parts.append(f": {report['entriesBefore']} entries before the trial, {report['entriesAfter']} after")
    if "trialSeconds" in report:
        parts.append(f"; trial {report['trialSeconds']} s")
    return "".join(parts)
