"""expectations.Expectations alone, on a fake clock: what a loop created counts as existing until the indexes show
it. tests/unit/test_controller.py and test_ownership.py drive the same rules through a whole JobLoop."""

from __future__ import annotations

from typing import Any

from finetune_operator.expectations import CREATED_MEMORY_S, Expectations

UID = "uid-1"


class FakeClock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


def child(kind: str, name: str) -> dict[str, Any]:
    owner = {"kind": "FineTuneJob", "name": "j", "uid": UID, "controller": True}
    return {"kind": kind, "metadata": {"name": name, "labels": {}, "ownerReferences": [owner]}, "spec": {"big": 1}}


def shown(exp: Expectations, pods: list[dict[str, Any]] | None = None) -> tuple[list[str], dict[str, Any], list[str]]:
    """What a pass sees: the indexes' children (`pods`, nothing else) plus what the loop expects."""
    got_pods, objects, workloads = list(pods or []), {}, []
    exp.add_to(got_pods, objects, workloads)
    return [p["metadata"]["name"] for p in got_pods], objects, [w["metadata"]["name"] for w in workloads]


def test_a_create_counts_until_its_watch_event_or_the_index_shows_it() -> None:
    exp = Expectations(FakeClock())
    made = [child("Service", "j"), child("Pod", "j-rank-0"), child("Pod", "j-rank-1"), child("Workload", "j")]
    exp.expect(UID, made, made)
    assert shown(exp) == (["j-rank-0", "j-rank-1"], {"Service/j": UID}, ["j"])
    exp.seen("Pod/j-rank-0")  # its watch event: the index is the truth for it from now on
    assert shown(exp)[0] == ["j-rank-1"]
    index_pod = child("Pod", "j-rank-1") | {"status": {"phase": "Running"}}
    assert shown(exp, [index_pod])[0] == ["j-rank-1"]  # the index's copy, not the expectation as well
    assert "Pod/j-rank-1" not in exp.created


def test_an_expectation_lapses_after_its_memory() -> None:
    clock = FakeClock()
    exp = Expectations(clock)
    pod = child("Pod", "j-rank-0")
    exp.expect(UID, [pod], [pod])
    clock.t += CREATED_MEMORY_S
    assert shown(exp)[0] == ["j-rank-0"]
    clock.t += 0.1
    assert shown(exp)[0] == [] and exp.created == {}  # a create again meets a 409 and reads it back


def test_expected_children_are_held_slim() -> None:
    exp = Expectations(FakeClock())
    pod = child("Pod", "j-rank-0")
    exp.expect(UID, [pod], [pod])
    pods: list[dict[str, Any]] = []
    exp.add_to(pods, {}, [])
    assert "spec" not in pods[0] and pods[0]["metadata"]["ownerReferences"] == [{"uid": UID, "controller": True}]


def test_only_what_was_made_now_is_expected_and_unwatched_kinds_are_remembered() -> None:
    exp = Expectations(FakeClock())
    secret, config = child("Secret", "j-ssh"), child("ConfigMap", "j-config")
    exp.expect(UID, [secret, config], [])  # both existed already (409s read back as the job's own)
    assert exp.created == {} and exp.made == {"Secret/j-ssh": UID}
    exp.expect(UID, [], [])
    assert shown(exp)[1] == {"Secret/j-ssh": UID}  # never watched: remembered for as long as the loop runs
