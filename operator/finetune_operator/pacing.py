"""When a job's loop runs: its next full pass, the wake-up flag, the error backoff and the progress clock.

One `Pacing` per `controller.JobLoop`, on the loop's monotonic clock (a fake one in tests/unit/test_pacing.py).
It decides nothing about the job: the loop tells it how a pass went (`passed`, `failed`) and when it read
progress, and asks it whether a pass or a progress read is due and how long to sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

# A full pass runs when a watch event on the job or one of its children wakes the loop, and at least this often
# as a safety net for a watch event lost (every child kind the operator makes is watched, but for Secrets).
# jobcache.JobCache reads the job fresh for such a timer pass unless its copy came from the API within this time.
IDLE_REQUEUE_S = 60.0
# While training, rank 0's log is read this often; between full passes that is the only request, plus a
# status patch when the progress changed, which wakes no pass (its echo: jobcache.JobCache.event).
PROGRESS_EVERY_S = 30.0
# Seconds before the next pass after 1, 2, ... failed passes in a row (the last one repeats). Read by the
# control-plane backoff test too.
ERROR_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class Pause:
    """How long the loop sleeps after a step."""

    seconds: float
    wakeable: bool  # False while backing off (see Pacing.pass_due): a plain sleep, not a wait for a wake-up


class Pacing:
    """- `next_pass`: clock time of the next full pass; a wake-up brings it forward (except while backing off);
    - `failures`: failed passes in a row, which pick the backoff from ERROR_BACKOFF_S;
    - `progress_read_at`: clock time of the last read of rank 0's log (at most one per PROGRESS_EVERY_S)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.next_pass = clock()  # the first pass is due at once
        self.failures = 0
        self.progress_read_at: float | None = None
        self._woken = asyncio.Event()  # set by watch events (on the event loop); binds to no loop until awaited

    def wake(self) -> None:
        """A watch event on the job or one of its children: a full pass as soon as the loop may."""
        self._woken.set()

    @property
    def woken(self) -> bool:
        return self._woken.is_set()

    def pass_due(self) -> bool:
        """A wake-up makes the pass due at once, except while backing off after failed passes: the failure's
        own status patch sends a watch event, which must not cut the backoff short."""
        if self.woken and not self.failures:
            return True
        return self.clock() >= self.next_pass

    def start_pass(self) -> bool:
        """A due pass starts: the wake-up is used up (one during the pass makes another due). Returns whether a
        wake-up, not the timer, made it due."""
        woken = self.woken
        self._woken.clear()
        return woken

    def passed(self, wait: float) -> None:
        """A pass succeeded: the next one in `wait` seconds, unless a wake-up comes first."""
        self.failures = 0
        self.next_pass = self.clock() + wait

    def failed(self) -> None:
        """A pass raised: the next one after the backoff for this many failures in a row."""
        wait = ERROR_BACKOFF_S[min(self.failures, len(ERROR_BACKOFF_S) - 1)]
        self.failures += 1
        self.next_pass = self.clock() + wait

    def progress_due(self) -> bool:
        return self._progress_due_in() <= 0

    def progress_read(self) -> None:
        """Rank 0's log is read now (the clock starts before the read: a failing read is not retried at once)."""
        self.progress_read_at = self.clock()

    def _progress_due_in(self) -> float:
        if self.progress_read_at is None:
            return 0.0
        return PROGRESS_EVERY_S - (self.clock() - self.progress_read_at)

    def pause(self, following: bool) -> Pause:
        """After a step: until the next pass, or the next progress read of a followed job, whichever is first."""
        until_pass = self.next_pass - self.clock()
        if math.isinf(until_pass):
            return Pause(math.inf, wakeable=True)
        if self.failures:
            return Pause(max(0.0, until_pass), wakeable=False)
        if following:
            until_pass = min(until_pass, self._progress_due_in())
        return Pause(max(0.0, until_pass), wakeable=True)

    async def sleep(self, pause: Pause) -> None:
        """Sleeps `pause`, woken early by `wake()` when it is wakeable; at most IDLE_REQUEUE_S at a time, so
        the caller sees its daemon stopping (an early look does no work)."""
        if not pause.wakeable:
            await asyncio.sleep(pause.seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), timeout=min(pause.seconds, IDLE_REQUEUE_S))
