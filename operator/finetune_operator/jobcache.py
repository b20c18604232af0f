"""The job as one job loop holds it between passes: what kopf's watch last showed and what the loop last wrote.

A pass plans from the held copy (`JobCache.job`) when the loop may trust it, and reads the job fresh otherwise.
It holds the job as the API server held it after the loop's own last status write or read; the loop is the
only writer of the status, and a spec change bumps the generation. So the copy is dropped (read fresh next):
- after a watch event on the job that is not the echo of one of the loop's own writes (`event`);
- before a timer pass, unless the API answered with the job lately (`expire`);
- whenever the loop cannot know what the API holds (a failed pass, a refused create: `forget`).
Once the echo of the loop's last write arrives, the copy is kopf's body of that same version (`hold`; shallow:
kopf's spec and status objects, which nothing here modifies), so a job is held in memory once, not twice.
Unit-tested alone with a fake clock (tests/unit/test_jobcache.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# Statuses the loop wrote lately, whose watch events are its own echo and wake nothing (JobCache.event).
ECHOES_KEPT = 8


def fingerprint(job: Mapping[str, Any], status: Mapping[str, Any]) -> bytes:
    """A job's uid, generation and the status as one short digest (keys with null values are absent, as the API
    server stores a merge patch)."""
    meta = job.get("metadata") or {}
    live = {k: v for k, v in status.items() if v is not None}
    text = json.dumps([meta.get("uid"), meta.get("generation"), live], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def lean(job: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The job without metadata.managedFields (what a loop keeps of it: reconcile never reads them)."""
    if job is None:
        return None
    out = dict(job)
    out["metadata"] = {k: v for k, v in (job.get("metadata") or {}).items() if k != "managedFields"}
    return out


class JobCache:
    """- `job`: the held copy, or None when the next pass must read the job fresh (at first too, unless the
      daemon gave kopf's body); `at`: clock time it came from the API;
    - `live`: kopf's body of the job, which kopf replaces in place with each watch event's;
    - `echoes`: fingerprints of the statuses the loop wrote lately (ECHOES_KEPT);
    - `busy`: a step runs in a worker thread (`stepping`), and only that thread sets `job` meanwhile."""

    def __init__(self, body: Mapping[str, Any] | None, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.job: dict[str, Any] | None = lean(body)
        self.live = body
        self.at = clock()
        self.busy = False
        self.echoes: deque[bytes] = deque(maxlen=ECHOES_KEPT)

    def read(self, get: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
        """The job to plan from: the held copy, else `get()` (a GET; None: the job is gone), held from now on."""
        if self.job is None:
            self.job = lean(get())
            self.at = self.clock()
        return self.job

    def forget(self) -> None:
        self.job = None

    def expire(self, max_age: float) -> None:
        """Drops the copy unless the API answered with it within `max_age` seconds."""
        if self.clock() - self.at >= max_age:
            self.job = None

    def event(self, body: Mapping[str, Any], deleted: bool = False) -> bool:
        """A watch event on the job (on the event loop). Returns whether it wakes the loop: the loop's own status
        write coming back does not; anything else (a spec change, a deletion, a status another writer set) does,
        and the next pass reads the job fresh."""
        meta = body.get("metadata") or {}
        mine = fingerprint(body, body.get("status") or {}) in self.echoes
        if mine and not deleted and not meta.get("deletionTimestamp"):
            self.hold(body)
            return False
        self.job = None
        return True

    def hold(self, body: Mapping[str, Any] | None) -> None:
        """When `body` (kopf's, from a watch event) is the version of the job the loop holds, keep kopf's objects
        and drop the loop's own copy. Called on the event loop, where kopf replaces its body: on the echo of the
        loop's write, and after each step, for an echo that arrived while the write was still being answered. Not
        while a step runs: its thread may have just dropped `job` to read the job fresh, which must stand."""
        job = self.job
        if self.busy or body is None or job is None:
            return
        meta = body.get("metadata") or {}
        if meta.get("resourceVersion") == job["metadata"].get("resourceVersion") and body.get("spec") is not job.get(
            "spec"
        ):
            self.job = lean(body)

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """Around a step run in a worker thread; after it, kopf's body is held if it is the version written."""
        self.busy = True
        try:
            yield
        finally:
            self.busy = False
        self.hold(self.live)

    def intend(self, job: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """Before a status write: its watch event is an echo (see `event`)."""
        self.echoes.append(fingerprint(job, status))

    def remember(self, patched: dict[str, Any] | None, sent: bool, raw: dict[str, Any] | None) -> None:
        """After a status write: the job as the API server answered it; `raw` (what the pass planned from) when
        nothing was sent. None (gone, or a fake API that answers nothing): read it fresh."""
        self.job = lean(patched) if sent else raw
        if sent:
            self.at = self.clock()
