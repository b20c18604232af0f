"""A child the API server refuses as invalid (400 BadRequest, 422 Invalid) ends the job Failed/InvalidSpec with
the server's message: retrying the same object cannot succeed, and a job left retrying never saves a phase or a
startTime, so neither its deadline nor its backoffLimit would ever apply.

Admission (the CRD's schema and CEL rules, api/podrules.py) rejects what it can up front; this is the net for
the rest (e.g. a malformed spec.hardware.affinity, which is passed through unchecked).
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

from .conditions import iso, set_condition

# Statuses of a create refused for what the object says. 403 is not one: a quota refusal clears when other
# pods finish, and a terminating namespace is handled by k8s.py.
REFUSED_STATUSES = (400, 422)
REASON = "InvalidSpec"


class Refused(RuntimeError):
    """The API server refused to create a child as invalid; `message` is the server's own."""

    def __init__(self, kind: str, name: str, status: int, message: str) -> None:
        self.kind, self.name, self.status, self.message = kind, name, status, message
        super().__init__(f"the API server refused {kind} {name} ({status}): {message}")


def failed_status(status: dict[str, Any], err: Refused, now: datetime) -> tuple[dict[str, Any], str]:
    """The job's status after the refusal (from the status it had), and the message for its Event."""
    new = copy.deepcopy(status)
    msg = f"invalid spec: {err}"[:2000]
    new.update(phase="Failed", reason=REASON, message=msg, completionTime=iso(now))
    set_condition(new, "Running", False, REASON, msg, now)
    set_condition(new, "Failed", True, REASON, msg, now)
    return new, msg
