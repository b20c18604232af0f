"""jobcache.JobCache alone, on a fake clock: which copy of the job a loop plans from, and when it reads the job
fresh. tests/unit/test_controller.py drives the same rules through a whole JobLoop and counts the reads."""

from __future__ import annotations

import copy
from typing import Any

from finetune_operator.jobcache import ECHOES_KEPT, JobCache
from finetune_operator.pacing import IDLE_REQUEUE_S


class FakeClock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


def body(rv: str = "1", generation: int = 1, **status: Any) -> dict[str, Any]:
    """A job as kopf's watch or the API server shows it, with the field tracking the cache drops."""
    return {
        "metadata": {
            "name": "j",
            "uid": "uid-1",
            "generation": generation,
            "resourceVersion": rv,
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"x": 1},
        "status": status,
    }


def test_the_held_copy_saves_the_read_until_it_is_forgotten() -> None:
    clock = FakeClock()
    cache = JobCache(body(), clock)
    reads: list[int] = []

    def get() -> dict[str, Any]:
        reads.append(1)
        return body(rv="2")

    held = cache.read(get)
    assert held is not None and not reads and "managedFields" not in held["metadata"]
    cache.forget()
    clock.t += 5
    fresh = cache.read(get)
    assert fresh is not None and fresh["metadata"]["resourceVersion"] == "2" and len(reads) == 1
    assert cache.at == clock.t and "managedFields" not in fresh["metadata"]
    assert JobCache(None, clock).read(lambda: None) is None  # no body, and the job is gone


def test_a_timer_pass_drops_a_copy_only_once_it_is_old() -> None:
    clock = FakeClock()
    cache = JobCache(body(), clock)
    clock.t += IDLE_REQUEUE_S - 1
    cache.expire(IDLE_REQUEUE_S)
    assert cache.job is not None
    clock.t += 1
    cache.expire(IDLE_REQUEUE_S)
    assert cache.job is None


def test_the_echo_of_its_own_write_wakes_nothing_and_is_held_as_kopfs_body() -> None:
    cache = JobCache(body(), FakeClock())
    cache.intend(body(), {"phase": "Pending"})
    answer = body(rv="2", phase="Pending")
    cache.remember(copy.deepcopy(answer), sent=True, raw=None)
    echo = body(rv="2", phase="Pending")
    assert cache.event(echo) is False
    assert cache.job is not None and cache.job["spec"] is echo["spec"] and cache.job["status"] is echo["status"]
    assert "managedFields" in echo["metadata"] and "managedFields" not in cache.job["metadata"]


def test_any_other_job_event_wakes_and_forces_a_fresh_read() -> None:
    cache = JobCache(body(), FakeClock())
    cache.intend(body(), {"phase": "Pending"})
    for other in (
        body(rv="2", phase="Running"),  # a status someone else wrote
        body(rv="2", generation=2, phase="Pending"),  # a spec change
    ):
        cache.remember(body(rv="2", phase="Pending"), sent=True, raw=None)
        assert cache.event(other) is True and cache.job is None
    cache.remember(body(rv="2", phase="Pending"), sent=True, raw=None)
    assert cache.event(body(rv="2", phase="Pending"), deleted=True) is True and cache.job is None


def test_only_the_last_writes_are_recognised_as_echoes() -> None:
    cache = JobCache(None, FakeClock())
    for step in range(ECHOES_KEPT + 1):
        cache.intend(body(), {"progress": {"step": step}})
    assert cache.event(body(progress={"step": ECHOES_KEPT})) is False
    assert cache.event(body(progress={"step": 0})) is True  # too old to be told from another writer's


def test_while_a_step_runs_kopfs_body_is_not_taken_then_it_is() -> None:
    clock = FakeClock()
    cache = JobCache(None, clock)
    cache.live = body(rv="3")
    with cache.stepping():
        cache.remember(body(rv="3", phase="Pending"), sent=True, raw=None)
        cache.hold(cache.live)  # an echo handled on the event loop meanwhile
        assert cache.job is not None and cache.job["spec"] is not cache.live["spec"]
    assert cache.job is not None and cache.job["spec"] is cache.live["spec"]


def test_nothing_sent_keeps_what_the_pass_planned_from() -> None:
    clock = FakeClock()
    cache = JobCache(body(), clock)
    raw = body(rv="5")
    clock.t += 10
    cache.remember(None, sent=False, raw=raw)
    assert cache.job is raw and cache.at == 500.0  # not an answer of the API: its age stands
    cache.remember(None, sent=True, raw=raw)  # sent, and the job was gone (no answer)
    assert cache.job is None
