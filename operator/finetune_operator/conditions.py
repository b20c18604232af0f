"""What every phase module of reconcile writes into a job's status (reconcile.py, kueue.py, refusal.py): the
terminal phases, timestamps, conditions, and the fix every message about a foreign object names. Pure."""

from __future__ import annotations

from datetime import datetime
from typing import Any

# Phases a job never leaves (but for its deletion): reconcile's `terminal` phase cleans up after them.
TERMINAL = ("Succeeded", "Failed")

# What a message about objects that carry the job's labels but are not its own tells the user to do.
FOREIGN_FIX = "delete them, or delete this job and re-create it under another name"


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=None)


def set_condition(status: dict[str, Any], ctype: str, value: bool, reason: str, message: str, now: datetime) -> None:
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    new = "True" if value else "False"
    for cond in conds:
        if cond["type"] == ctype:
            if cond["status"] != new:
                cond["lastTransitionTime"] = iso(now)
            cond.update(status=new, reason=reason, message=message)
            return
    if value:  # a condition appears the first time it becomes true
        conds.append(
            {"type": ctype, "status": new, "reason": reason, "message": message, "lastTransitionTime": iso(now)}
        )
