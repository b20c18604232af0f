"""pacing.Pacing alone, on a fake clock: when a job loop's next pass is due, its error backoff, its progress clock
and how long it sleeps. tests/unit/test_controller.py drives the same rules through a whole JobLoop."""

from __future__ import annotations

import asyncio
import math
import time

from finetune_operator.pacing import ERROR_BACKOFF_S, IDLE_REQUEUE_S, PROGRESS_EVERY_S, Pacing, Pause


class FakeClock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


def test_the_first_pass_is_due_at_once_then_after_the_wait_it_returned() -> None:
    clock = FakeClock()
    pace = Pacing(clock)
    assert pace.pass_due() and not pace.start_pass()  # due by the timer, not a wake-up
    pace.passed(IDLE_REQUEUE_S)
    clock.t += IDLE_REQUEUE_S - 1
    assert not pace.pass_due()
    assert pace.pause(following=False) == Pause(1.0, wakeable=True)
    clock.t += 1
    assert pace.pass_due()


def test_a_wake_up_makes_the_pass_due_and_is_used_up_by_it() -> None:
    pace = Pacing(FakeClock())
    pace.start_pass()
    pace.passed(IDLE_REQUEUE_S)
    pace.wake()
    assert pace.woken and pace.pass_due()
    assert pace.start_pass()  # a wake-up made it due
    assert not pace.woken and not pace.pass_due()


def test_failures_back_off_longer_each_time_and_ignore_wake_ups() -> None:
    clock = FakeClock()
    pace = Pacing(clock)
    waits = []
    for _ in range(len(ERROR_BACKOFF_S) + 1):
        pace.failed()
        pause = pace.pause(following=True)
        assert not pause.wakeable
        waits.append(pause.seconds)
        pace.wake()  # the failure's own status patch comes back as a watch event
        clock.t += pause.seconds - 0.1
        assert not pace.pass_due()
        clock.t += 0.1
        assert pace.pass_due()
    assert waits == [*ERROR_BACKOFF_S, ERROR_BACKOFF_S[-1]]
    pace.passed(IDLE_REQUEUE_S)
    assert pace.failures == 0 and pace.pause(following=False) == Pause(IDLE_REQUEUE_S, wakeable=True)
    assert pace.pass_due()  # the wake-up left from the backoff counts again


def test_the_progress_clock_shortens_the_pause_of_a_followed_job() -> None:
    clock = FakeClock()
    pace = Pacing(clock)
    pace.passed(IDLE_REQUEUE_S)
    assert pace.progress_due()  # never read yet
    pace.progress_read()
    assert not pace.progress_due()
    assert pace.pause(following=True) == Pause(PROGRESS_EVERY_S, wakeable=True)
    assert pace.pause(following=False) == Pause(IDLE_REQUEUE_S, wakeable=True)
    clock.t += PROGRESS_EVERY_S
    assert pace.progress_due() and pace.pause(following=True) == Pause(0.0, wakeable=True)


def test_no_timer_at_all_for_a_pass_that_waits_forever() -> None:
    pace = Pacing(FakeClock())
    pace.passed(math.inf)
    assert pace.pause(following=True) == Pause(math.inf, wakeable=True)


def test_a_wakeable_sleep_ends_at_a_wake_up_and_a_backoff_sleep_does_not() -> None:
    async def slept(pause: Pause) -> float:
        pace = Pacing(time.monotonic)
        asyncio.get_running_loop().call_soon(pace.wake)  # a watch event while it sleeps
        start = time.monotonic()
        await pace.sleep(pause)
        return time.monotonic() - start

    assert asyncio.run(slept(Pause(IDLE_REQUEUE_S, wakeable=True))) < IDLE_REQUEUE_S / 2
    assert asyncio.run(slept(Pause(0.2, wakeable=False))) >= 0.2
