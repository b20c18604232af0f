"""The per-job loop's rules (wake-ups, idle requeue, error backoff, progress clock) with a fake clock and a fake
API: the real Kubernetes API cannot run in this tier. tests/controlplane runs the same loop against a real
kube-apiserver."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import kopf
import pytest
from ftjobs import make_job
from prometheus_client import REGISTRY

from finetune_operator import controller, handlers, kueue, metrics
from finetune_operator import reconcile as rec
from finetune_operator.controller import Children, JobLoop, Loops, apply
from finetune_operator.pacing import ERROR_BACKOFF_S, IDLE_REQUEUE_S, PROGRESS_EVERY_S, Pause
from finetune_operator.reconcile import Plan, Relabel
from finetune_operator.refusal import Refused

NS, NAME = "ns", "j"
PROGRESS_LINE = 'FTJOB_PROGRESS {"event":"train","step":%d,"totalSteps":10,"loss":0.5}\n'


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeApi:
    """A job held in memory (fake API: no API server in the unit tier). Status patches are merged as the
    server does; `fail_creates` makes creates raise, as an API error would."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.calls: list[str] = []
        self.created: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.patches: list[dict[str, Any]] = []
        self.log = ""
        self.fail_creates = False
        self.workload_patches: list[dict[str, Any]] = []
        self.priority_classes: dict[str, dict[str, Any]] = {}

    def get_job(self, ns: str, name: str) -> dict[str, Any] | None:
        self.calls.append("get_job")
        return copy.deepcopy(self.job)

    def patch_status(self, ns: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
        """Answers with the whole job after the patch, as the server does (None when nothing was sent)."""
        patch = {k: v for k, v in new.items() if old.get(k) != v} | {k: None for k in old if k not in new}
        if not patch:
            return None
        self.patches.append(patch)
        meta = self.job["metadata"]
        meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 1) + 1)  # every write makes a new version
        status = self.job.setdefault("status", {})
        status.update(copy.deepcopy(patch))
        for k in [k for k, v in status.items() if v is None]:
            del status[k]
        return copy.deepcopy(self.job)

    def event(self, job: dict[str, Any], etype: str, reason: str, message: str) -> None:
        self.events.append((etype, reason))

    def create(self, obj: dict[str, Any]) -> bool:
        if self.fail_creates:
            raise RuntimeError("API says no")
        self.created.append(obj)
        return True

    def delete_pod(self, ns: str, name: str, uid: str, grace: int | None = None) -> None:
        self.calls.append(f"delete_pod {name} {uid}" + ("" if grace is None else f" grace {grace}"))

    def delete_job(self, ns: str, name: str, uid: str) -> None:
        self.calls.append(f"delete_job {uid}")

    def relabel(self, ns: str, change: Relabel) -> None:
        self.calls.append(f"relabel {change.kind}/{change.name} {change.uid}")

    def log_tail(self, ns: str, pod: str, container: str, lines: int = 200) -> str | None:
        self.calls.append(f"log_tail {pod}/{container}")
        return self.log

    # Kueue: the Workload is watched, not read; a GET would be recorded here, and is what a queued job must not do
    # where the watch runs. Without it (JobLoop poll_workloads) the loop reads `workload`.
    workload: dict[str, Any] | None = None

    def get_workload(self, ns: str, name: str) -> dict[str, Any] | None:
        self.calls.append("get_workload")
        return copy.deepcopy(self.workload)

    def get_resource_flavor(self, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get_resource_flavor {name}")
        return {"metadata": {"name": name}, "spec": {}}

    def get_priority_class(self, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get_priority_class {name}")
        return self.priority_classes.get(name)

    def patch_workload_status(self, ns: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append("patch_workload_status")
        self.workload_patches.append(patch)

    def delete_workload(self, ns: str, name: str, uid: str) -> None:
        self.calls.append(f"delete_workload {uid}")


def shown(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of a created object as the API server holds it: with a uid of its own."""
    out = copy.deepcopy(obj)
    out["metadata"]["uid"] = f"uid-{obj['kind'].lower()}-{obj['metadata']['name']}"
    return out


def raises(err: Exception) -> Any:
    def call(*_: Any, **__: Any) -> Any:
        raise err

    return call


def young_monotonic() -> Callable[[], float]:
    """Real monotonic seconds, as young as on a machine booted a second ago. A fresh CI machine's
    time.monotonic() can be a few hundred seconds, below FakeClock's start: a test that runs the loop on real
    time gets this clock from the start (World(clock=...)), never one swapped in after the loop was made."""
    origin = time.monotonic() - 1.0
    return lambda: time.monotonic() - origin


class World:
    """A loop over one two-rank job; `pods` are what the indexes hold. `clock` is FakeClock unless a test runs
    the loop on real time (young_monotonic)."""

    def __init__(
        self, clock: Callable[[], float] | None = None, poll_workloads: bool = False, **run_policy: Any
    ) -> None:
        builder = make_job(NAME, NS).nodes(2).classification()
        if run_policy:
            builder.run_policy(**run_policy)
        raw = builder.build()
        raw["metadata"]["uid"] = "uid-1"
        self.api = FakeApi(raw)
        self.clock = clock or FakeClock()
        self.pods: list[dict[str, Any]] = []
        self.workloads: list[dict[str, Any]] = []  # what the Workload index holds
        self.loop = JobLoop(
            NS,
            NAME,
            self.api,
            {},
            clock=self.clock,
            now=lambda: datetime(2026, 12, 2, 10),
            poll_workloads=poll_workloads,
        )

    def children(self) -> Children:
        return Children(
            list(self.pods),
            {
                f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["ownerReferences"][0]["uid"]
                for o in self.api.created
                if o["kind"] not in ("Pod", "Workload")
            },
            copy.deepcopy(self.workloads),
        )

    def step(self) -> Pause:
        return self.loop.step(self.children)

    def passes(self) -> int:
        return self.loop.passes

    def reads(self) -> int:
        return self.api.calls.count("get_job")

    def running(self) -> None:
        """Pods created by the passes so far are all Running (and Ready), as the index shows them: with a uid."""
        self.pods = [
            shown(o) | {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
            for o in self.api.created
            if o["kind"] == "Pod"
        ]

    def start_running(self) -> None:
        """The first pass, then every pod Running and a pass: the job is Running, followed from now on."""
        self.step()
        self.running()
        self.loop.wake()
        self.step()


def test_first_pass_at_once_then_idle_requeue() -> None:
    w = World()
    pause = w.step()
    assert w.passes() == 1 and w.api.job["status"]["phase"] == "Pending"
    assert pause == Pause(IDLE_REQUEUE_S, wakeable=True)
    w.clock.advance(IDLE_REQUEUE_S - 1)
    w.step()
    assert w.passes() == 1  # nothing woke it, not due yet
    w.clock.advance(1)
    w.step()
    assert w.passes() == 2  # the idle safety net


def test_a_wake_up_brings_the_pass_forward_once() -> None:
    w = World()
    w.step()
    w.clock.advance(2)
    w.loop.wake()
    assert w.loop.pace.pass_due()
    w.step()
    assert w.passes() == 2
    w.step()
    assert w.passes() == 2  # the wake-up was used up by that pass


def test_a_wake_up_during_a_pass_triggers_another() -> None:
    w = World()

    def children_then_an_event() -> Children:
        w.loop.wake()  # a watch event arrives while the pass runs
        return w.children()

    w.loop.step(children_then_an_event)
    assert w.loop.pace.pass_due()


def test_error_backoff_grows_ignores_wake_ups_and_shows_in_status() -> None:
    w = World()
    w.api.fail_creates = True
    waits = []
    for _ in range(len(ERROR_BACKOFF_S) + 1):
        pause = w.step()
        assert not pause.wakeable
        waits.append(pause.seconds)
        w.loop.wake()  # the failure's own status patch is a watch event on the job
        w.clock.advance(pause.seconds - 0.1)
        assert not w.loop.pace.pass_due(), "a wake-up cut the backoff short"
        w.clock.advance(0.1)
    assert waits == [*ERROR_BACKOFF_S, ERROR_BACKOFF_S[-1]]
    cond = {c["type"]: c for c in w.api.job["status"]["conditions"]}["ReconcileError"]
    assert cond["status"] == "True" and cond["reason"] == "RuntimeError"
    assert "reconcile error: API says no" in w.api.job["status"]["message"]
    assert ("Warning", "ReconcileError") in w.api.events
    # Recovery: the condition turns False and the loop is wakeable again.
    w.api.fail_creates = False
    pause = w.step()
    assert pause == Pause(IDLE_REQUEUE_S, wakeable=True) and w.loop.pace.failures == 0
    cond = {c["type"]: c for c in w.api.job["status"]["conditions"]}["ReconcileError"]
    assert cond["status"] == "False" and cond["reason"] == "Recovered"


def test_a_pod_refused_as_invalid_fails_the_job_once_without_retry_fake_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake API (no API server in this tier): the create raises what k8s.Kube raises on a 422;
    tests/controlplane/test_validation_cluster.py has the real server refuse a real pod."""
    w = World()
    refused = Refused("Pod", "j-rank-1", 422, 'Pod "j-rank-1" is invalid: spec.affinity: Invalid value')
    creates = 0

    def create(obj: dict[str, Any]) -> bool:
        nonlocal creates
        creates += 1
        if obj["metadata"]["name"] == "j-rank-1":
            raise refused
        return True

    monkeypatch.setattr(w.api, "create", create)
    pause = w.step()
    st = w.api.job["status"]
    assert (st["phase"], st["reason"]) == ("Failed", "InvalidSpec")
    assert "spec.affinity: Invalid value" in st["message"] and "Pod j-rank-1 (422)" in st["message"]
    assert ("Warning", "InvalidSpec") in w.api.events
    assert w.loop.pace.failures == 0 and pause.seconds == IDLE_REQUEUE_S  # no error backoff loop
    tried = creates
    w.clock.advance(IDLE_REQUEUE_S)
    w.step()
    assert creates == tried  # a Failed job creates nothing again


def test_an_error_while_recording_the_error_still_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    w = World()
    w.api.fail_creates = True
    monkeypatch.setattr(w.api, "patch_status", raises(RuntimeError("status too")))
    assert w.step() == Pause(ERROR_BACKOFF_S[0], wakeable=False)


def test_progress_is_read_every_interval_between_passes_and_patched_only_when_changed() -> None:
    w = World()
    w.start_running()  # Pending -> Running: the job is now followed
    assert w.api.job["status"]["phase"] == "Running" and w.loop.followed is not None
    w.api.log = PROGRESS_LINE % 1
    w.loop.wake()
    pause = w.step()  # a pass of a Running job reads rank 0's log
    assert w.api.calls.count("log_tail j-rank-0/trainer") == 1
    assert w.api.job["status"]["progress"]["step"] == 1
    assert pause == Pause(PROGRESS_EVERY_S, wakeable=True)  # the progress clock comes before the pass

    patches = len(w.api.patches)
    w.clock.advance(PROGRESS_EVERY_S / 2)
    w.step()
    assert w.api.calls.count("log_tail j-rank-0/trainer") == 1  # not yet
    w.clock.advance(PROGRESS_EVERY_S / 2)
    w.step()  # a refresh, not a pass: no GET of the job
    assert w.api.calls.count("log_tail j-rank-0/trainer") == 2 and w.passes() == 3
    assert len(w.api.patches) == patches  # same progress: nothing sent
    w.api.log = PROGRESS_LINE % 2
    w.clock.advance(PROGRESS_EVERY_S)
    w.step()
    assert w.api.patches[-1].keys() == {"progress"} and w.api.job["status"]["progress"]["step"] == 2


def test_a_finished_rank_0_is_read_at_once_so_the_final_progress_lands() -> None:
    """Training shorter than the read interval: rank 0 exits between two reads. The pass that sees it done
    reads its last lines whatever the interval, so the Succeeded job shows its final step, not none."""
    w = World()
    w.start_running()  # Running
    w.api.log = PROGRESS_LINE % 1
    w.loop.wake()
    w.step()
    reads = w.api.calls.count("log_tail j-rank-0/trainer")
    w.api.log = PROGRESS_LINE % 10 + 'FTJOB_PROGRESS {"event":"done","step":10,"totalSteps":10}\n'
    for pod in w.pods:
        pod["status"] = {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
        }
    w.loop.wake()
    w.step()  # well inside PROGRESS_EVERY_S of the last read (the acting pass re-reads the job, and the log)
    assert w.api.calls.count("log_tail j-rank-0/trainer") > reads
    st = w.api.job["status"]
    assert st["phase"] == "Succeeded" and st["progress"]["step"] == 10 and st["progress"]["event"] == "done", st


def test_a_silent_rank_0_is_restarted_as_hung_within_its_deadline_and_a_read_interval() -> None:
    """Each progress refresh that sees new lines moves status.lastProgressTime; once rank 0 falls silent, the
    pass at the deadline reads the log once more (a verdict is never made on an older read) and restarts the
    group as Hung, naming the last step."""
    from datetime import timedelta

    w = World(progressDeadlineSeconds=60)
    start = datetime(2026, 12, 2, 10)
    w.loop.now = lambda: start + timedelta(seconds=w.clock.t - 1000.0)
    w.start_running()
    w.api.log = PROGRESS_LINE % 1
    w.loop.wake()
    w.step()
    assert w.api.job["status"]["lastProgressTime"] == "2026-12-02T10:00:00Z"
    w.clock.advance(PROGRESS_EVERY_S)
    w.api.log = PROGRESS_LINE % 2
    w.step()  # a refresh: new progress, and its time
    assert w.api.patches[-1].keys() == {"progress", "lastProgressTime"}
    silent_since = w.clock.t
    reads = w.api.calls.count("log_tail j-rank-0/trainer")
    while True:
        assert w.clock.t - silent_since <= 60 + PROGRESS_EVERY_S, "no Hung verdict within the deadline + a read"
        pause = w.step()
        if w.api.job["status"].get("phase") != "Running":
            break
        w.clock.advance(pause.seconds)
    st = w.api.job["status"]
    assert st["phase"] == "Restarting" and st["reason"] == "Hung" and st["restartCount"] == 1
    assert st["failures"][-1]["reason"] == "Hung" and st["failures"][-1]["step"] == 2
    assert w.api.calls.count("log_tail j-rank-0/trainer") > reads
    assert "lastProgressTime" not in st


def test_a_failing_log_read_is_not_retried_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    w = World()
    w.start_running()
    w.loop.wake()
    w.step()
    monkeypatch.setattr(w.api, "log_tail", raises(RuntimeError("log gone")))
    w.clock.advance(PROGRESS_EVERY_S)
    assert w.step().seconds == PROGRESS_EVERY_S  # logged, and the next read waits a whole interval


def test_finished_jobs_are_not_followed() -> None:
    w = World()
    w.start_running()
    assert w.loop.followed is not None
    for pod in w.pods:
        pod["status"]["phase"] = "Succeeded"
    w.loop.wake()
    pause = w.step()
    assert w.api.job["status"]["phase"] == "Succeeded" and w.loop.followed is None
    assert pause == Pause(math.inf, wakeable=True)  # no timer: only a watch event brings work
    calls = list(w.api.calls)
    w.clock.advance(IDLE_REQUEUE_S * 10)
    w.step()
    assert w.passes() == 3 and w.api.calls == calls  # no work, no request


def test_deadline_requeue_comes_before_the_idle_one() -> None:
    w = World()
    w.api.job["spec"]["runPolicy"] = {"activeDeadlineSeconds": 5}
    assert w.step().seconds == IDLE_REQUEUE_S  # the first pass sets startTime (the fake wall clock stands still)
    w.loop.wake()
    assert w.step().seconds == 5


def test_loops_route_wake_ups_and_forget_finished_loops() -> None:
    loops = Loops()
    a, b = World().loop, JobLoop("other", "k", World().api, {})
    with loops.running(a), loops.running(b):
        a.pace.next_pass = b.pace.next_pass = float("inf")
        loops.wake(NS, NAME)
        assert a.pace.pass_due() and not b.pace.pass_due()
        loops.wake("nowhere", "none")  # a pod of a job without a loop: ignored
    assert loops.get(NS, NAME) is None and loops.get("other", "k") is None


async def until(cond: Any, timeout: float = 10.0) -> None:
    """Polls `cond` on the event loop until it holds, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_run_sleeps_until_woken() -> None:
    """The asyncio side: the loop sleeps IDLE_REQUEUE_S of real time unless woken, and stops when asked."""
    w = World(clock=young_monotonic())
    stop = False

    async def drive() -> None:
        task = asyncio.create_task(w.loop.run(lambda: stop, w.children))

        nonlocal stop
        await until(lambda: w.passes() == 1)
        w.loop.wake()
        await until(lambda: w.passes() == 2)
        stop = True
        w.loop.wake()
        await asyncio.wait_for(task, 10)

    asyncio.run(drive())
    assert w.passes() == 2


def test_an_echo_seen_before_the_writes_answer_is_held_once_after_the_step() -> None:
    """The watch event of a status write can reach kopf before the worker thread has the API's answer; the loop
    then adopts kopf's body on the event loop right after the step."""
    w = World(clock=young_monotonic())
    live = kopf.Body(copy.deepcopy(w.api.job))
    w.loop.cache.live = live
    answer = w.api.patch_status

    def patch_seen_first(*args: Any) -> dict[str, Any] | None:
        out = answer(*args)
        live._replace_with(copy.deepcopy(w.api.job))  # kopf's watch already replaced its body
        return out

    w.api.patch_status = patch_seen_first  # type: ignore[method-assign]

    async def drive() -> None:
        task = asyncio.create_task(w.loop.run(lambda: w.passes() >= 1, w.children))
        await until(lambda: w.passes() >= 1)
        w.loop.wake()  # out of its sleep: stopped() ends the loop
        await asyncio.wait_for(task, 10)

    asyncio.run(drive())
    assert (
        w.loop.cache.job is not None
        and w.loop.cache.job["spec"] is live["spec"]
        and w.loop.cache.job["status"]["phase"] == "Pending"
    )


def test_the_daemon_reads_children_only_from_registered_indexes() -> None:
    """The job daemon has no LIST fallback: every index it reads is registered with kopf, which passes all
    registered indexes to every handler."""
    registry = kopf.get_default_registry()
    indexes = {str(h.id) for h in registry._indexing.get_all_handlers()}
    assert set(handlers._index_ids({}, workloads=False)) <= indexes
    assert "job_daemon" in {str(h.id) for h in registry._spawning.get_all_handlers()}
    # The NetworkPolicy index is added by run_operator() when the config enables policies, and the Workload index
    # when the API serves Workloads, before kopf runs.
    assert handlers._index_ids({"networkPolicy": {"enabled": True}})[-1] == "job_networkpolicies"
    assert handlers._index_ids({})[1] == "job_workloads"


# -- Prometheus gauges: set from the progress the loop reads (the real parser on rank 0's log text), read back
# -- from the real registry that /metrics serves.
GAUGES = ("step", "total_steps", "progress_ratio", "samples_per_second", "tokens_per_second", "mfu_ratio")


def gauges() -> dict[str, float | None]:
    labels = {"namespace": NS, "job_name": NAME}
    return {g: REGISTRY.get_sample_value(f"finetune_operator_job_{g}", labels) for g in GAUGES}


NONE = dict.fromkeys(GAUGES)
# A runtime train line: samples/s, non-padding tokens/s, the mean padded length and the model's numbers.
MODEL = {"layers": 2, "attentionWidth": 64, "trainableMatmulParams": 69760, "frozenMatmulParams": 0}
TRAIN_LINE = (
    'FTJOB_PROGRESS {"event":"train","step":%d,"totalSteps":40,"loss":0.5,"samplesPerSecond":%s,'
    '"tokensPerSecond":%s,"paddedTokensPerSample":64,"model":' + json.dumps(MODEL) + "}\n"
)


def expected_mfu(sps: float, status: dict[str, Any]) -> float:
    """samples/s × S·(6·N + 12·L·H·S) over the peak of the job's devices, as the status states that peak."""
    flops = 64 * (6 * MODEL["trainableMatmulParams"] + 12 * MODEL["layers"] * MODEL["attentionWidth"] * 64)
    return sps * flops / float(status["throughput"]["peakFlopsPerSecond"])


def training_world() -> World:
    """A Running job whose rank 0 has logged step 10 of 40 at 32 samples/s."""
    metrics.clear_job(NS, NAME)
    w = World()
    w.step()
    w.running()
    w.api.log = "ftjob-runtime launch: torchrun ...\n" + TRAIN_LINE % (10, "32.0", "1800.5")
    w.loop.wake()
    w.step()  # Pending -> Running: followed from now on
    assert w.api.job["status"]["phase"] == "Running" and gauges() == NONE
    w.loop.wake()
    w.step()  # a pass of a Running job reads rank 0's log
    return w


def test_progress_and_throughput_gauges_follow_a_training_job_and_clear_when_it_ends() -> None:
    w = training_world()
    got = gauges()
    assert got == {
        "step": 10,
        "total_steps": 40,
        "progress_ratio": 0.25,
        "samples_per_second": 32.0,
        "tokens_per_second": 1800.5,
        "mfu_ratio": got["mfu_ratio"],
    }
    status = w.api.job["status"]
    assert got["mfu_ratio"] == pytest.approx(expected_mfu(32.0, status), rel=1e-3)
    assert status["throughput"]["summary"].startswith("32 samples/s, MFU ")
    w.api.log += TRAIN_LINE % (30, "40.5", "2000")
    w.clock.advance(PROGRESS_EVERY_S)
    w.step()  # a progress refresh between passes
    got = gauges()
    assert got["step"] == 30 and got["progress_ratio"] == 0.75 and got["samples_per_second"] == 40.5
    assert got["tokens_per_second"] == 2000 and w.api.job["status"]["throughput"]["tokensPerSecond"] == 2000
    assert got["mfu_ratio"] == pytest.approx(expected_mfu(40.5, w.api.job["status"]), rel=1e-3)
    for pod in w.pods:
        pod["status"]["phase"] = "Succeeded"
    w.loop.wake()
    w.step()
    assert w.api.job["status"]["phase"] == "Succeeded"
    assert gauges() == NONE  # no stale series of a finished job


def test_gauges_clear_when_the_job_is_deleted_or_its_loop_stops() -> None:
    w = training_world()
    w.api.job["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    w.loop.job_event(w.api.job)  # the watch event of the deletion
    w.step()
    assert gauges() == NONE
    w = training_world()
    loops = Loops()
    with loops.running(w.loop):
        w.clock.advance(PROGRESS_EVERY_S)
        w.step()
        assert gauges()["step"] == 10
    assert gauges() == NONE  # the daemon ended (job gone, operator stopping): its series go too


def test_a_precompile_trial_run_is_not_training_progress() -> None:
    metrics.set_job_progress(NS, NAME, {"event": "train", "step": 3, "totalSteps": 6})
    metrics.set_job_progress(NS, NAME, {"event": "precompile", "step": 4, "totalSteps": 16})
    assert gauges() == NONE


def test_a_figure_the_status_lacks_has_no_series() -> None:
    """A spec.command job's script may print samples/s alone: no tokens/s or MFU series is made up for it, and one
    that was there goes when a newer status lacks it."""
    metrics.set_job_progress(
        NS, NAME, {"event": "train", "step": 1, "samplesPerSecond": 2.0}, {"tokensPerSecond": 9.0, "mfu": 0.3}
    )
    assert gauges()["tokens_per_second"] == 9.0 and gauges()["mfu_ratio"] == 0.3
    metrics.set_job_progress(NS, NAME, {"event": "train", "step": 2, "samplesPerSecond": 2.0}, {"samplesPerSecond": 2})
    assert gauges()["samples_per_second"] == 2.0
    assert gauges()["tokens_per_second"] is None and gauges()["mfu_ratio"] is None
    metrics.clear_job(NS, NAME)


def test_exported_names_are_what_metrics_serves() -> None:
    metrics.set_job_progress(
        NS,
        NAME,
        {"event": "train", "step": 1, "totalSteps": 2, "samplesPerSecond": 1.0},
        {"tokensPerSecond": 60.0, "mfu": 0.1},
    )
    metrics.TRANSITIONS.labels(phase="Running", reason="Started")
    metrics.JOB_FAILURES.labels(namespace=NS, reason="OOMKilled")
    served = {s.name for fam in REGISTRY.collect() for s in fam.samples if s.name.startswith("finetune_operator_")}
    metrics.clear_job(NS, NAME)
    assert served == metrics.exported_names()


def test_apply_saves_the_status_before_deleting_or_creating() -> None:
    """Found by tests/faults/test_operator_kill.py: an operator killed between deleting a failed attempt's pods
    and saving restartCount came back to recreate the same attempt, the restart never counted. The status (the
    job's memory) is written before any delete or create."""
    order: list[str] = []

    class Recording:
        def patch_status(self, *_: Any) -> None:
            order.append("status")

        def delete_pod(self, ns: str, name: str, uid: str, grace: int | None = None) -> None:
            order.append("delete")

        def create(self, obj: dict[str, Any]) -> bool:
            order.append("create")
            return True

        def event(self, *_: Any) -> None:
            order.append("event")

    job = make_job(NAME, NS).build()
    plan = Plan(
        create=[{"kind": "Pod", "metadata": {"name": "p"}}],
        delete_pods=["old"],
        pod_uids={"old": "uid-old"},
        status={"restartCount": 1},
        events=[("Warning", "RankFailed", "m")],
    )
    apply(Recording(), job, {"restartCount": 0}, plan)  # type: ignore[arg-type]
    assert order == ["status", "delete", "create", "event"]


# -- requests: what a pass reads, and which watch events wake one --------------------------------------------------
def test_a_pass_woken_by_its_children_reads_no_job_and_its_own_status_echo_wakes_nothing() -> None:
    w = World()
    w.step()  # the first pass reads the job (no body from kopf here), writes Pending, creates the children
    assert w.reads() == 1 and w.api.job["status"]["phase"] == "Pending"
    w.loop.job_event(copy.deepcopy(w.api.job))  # the watch event of that status write
    assert not w.loop.pace.pass_due(), "the loop's own status write woke a pass"
    for pod in w.api.created:
        if pod["kind"] == "Pod":
            w.loop.child_event(f"Pod/{pod['metadata']['name']}")
    w.pods = [copy.deepcopy(o) | {"status": {"phase": "Pending"}} for o in w.api.created if o["kind"] == "Pod"]
    w.step()
    assert w.passes() == 2 and w.reads() == 1  # the job as the patch answered it: no GET
    w.running()
    w.loop.child_event("Pod/j-rank-0")
    w.step()  # a new phase is decided on a fresh read only (another writer may have moved the job on)
    assert w.passes() == 3 and w.reads() == 2 and w.api.job["status"]["phase"] == "Running"


def test_the_echo_of_its_own_write_leaves_the_job_held_once() -> None:
    """After the echo of its status write the loop holds kopf's body of that version (shallow, kopf's spec and
    status objects), not the API's answer as well; it works from it without a read and never modifies it."""
    w = World()
    w.step()
    older = copy.deepcopy(w.api.job)
    older["metadata"]["resourceVersion"] = "1"  # the echo of an earlier write of the same status
    w.loop.job_event(older)
    assert w.loop.cache.job is not None and w.loop.cache.job["spec"] is not older["spec"]  # the loop's copy is newer
    echo = copy.deepcopy(w.api.job)
    echo["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    w.loop.job_event(echo)
    assert w.loop.cache.job["spec"] is echo["spec"] and w.loop.cache.job["status"] is echo["status"]
    assert "managedFields" not in w.loop.cache.job["metadata"] and "managedFields" in echo["metadata"]
    assert not w.loop.pace.pass_due()
    kept = copy.deepcopy(echo)
    w.pods = [copy.deepcopy(o) | {"status": {"phase": "Pending"}} for o in w.api.created if o["kind"] == "Pod"]
    w.loop.child_event("Pod/j-rank-0")
    w.step()
    assert w.passes() == 2 and w.reads() == 1 and echo == kept


def test_an_echo_during_a_step_leaves_the_job_to_the_steps_thread() -> None:
    """A step's thread may drop `job` to read the job fresh (another writer may have moved it on); an echo
    handled on the event loop meanwhile must not put a copy back."""
    w = World()
    w.step()
    echo = copy.deepcopy(w.api.job)
    held = w.loop.cache.job
    w.loop.cache.busy = True  # as run() sets it while the step's worker thread runs
    w.loop.job_event(echo)
    assert w.loop.cache.job is held and not w.loop.pace.pass_due()
    w.loop.cache.busy = False
    w.loop.cache.hold(echo)
    assert w.loop.cache.job is not None and w.loop.cache.job["spec"] is echo["spec"]


def test_a_followed_job_keeps_what_its_progress_refresh_needs_not_the_job() -> None:
    w = World()
    w.start_running()
    followed = w.loop.followed
    assert followed is not None and followed.source == ("j-rank-0", "trainer")
    assert followed.ident == {"metadata": {"uid": "uid-1", "generation": None}}
    assert followed.status == w.api.job["status"]


def test_the_operator_lets_kopfs_idle_object_workers_go_after_a_second() -> None:
    settings = kopf.OperatorSettings()
    assert settings.queueing.idle_timeout > handlers.WORKER_IDLE_S  # kopf's default keeps them 5 s
    handlers._configure(settings=settings)
    assert settings.queueing.idle_timeout == handlers.WORKER_IDLE_S == 1.0


def test_the_job_watch_drops_managed_fields_from_kopfs_body() -> None:
    """kopf keeps the newest body of every job for its daemon; the job handler strips the field tracking from it
    (as big as the spec again) before anything holds it."""
    raw = make_job(NAME, NS).build()
    raw["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:task": {}}}}]
    body = kopf.Body(raw)
    asyncio.run(handlers._job_event(type="MODIFIED", body=body, name=NAME, namespace=NS, memo=kopf.Memo(loops=Loops())))
    assert "managedFields" not in raw["metadata"] and raw["metadata"]["name"] == NAME


def test_a_pass_from_the_loops_copy_deletes_nothing_before_reading_the_job_fresh() -> None:
    """Two writers (a second operator): the other one counted a restart and made attempt 1's pods; this loop's
    copy still says attempt 0, so those pods look stale to it. It reads the job before deleting anything."""
    w = World()
    w.start_running()  # Running, from a fresh read; the loop's copy is the patch's answer
    w.api.job["status"]["restartCount"] = 1  # the other operator's write, whose watch event is still on its way
    w.pods = [copy.deepcopy(p) for p in w.pods]
    for pod in w.pods:
        pod["metadata"]["labels"]["finetune.dev/attempt"] = "1"
    w.loop.child_event("Pod/j-rank-0")
    reads = w.reads()
    w.step()
    assert w.reads() == reads + 1 and not [c for c in w.api.calls if c.startswith("delete_pod")]


def test_a_spec_change_or_deletion_is_read_fresh() -> None:
    w = World()
    w.step()
    changed = copy.deepcopy(w.api.job)
    changed["metadata"]["generation"] = 2  # the API server bumps it on every spec change
    w.loop.job_event(changed)
    assert w.loop.pace.pass_due()
    w.step()
    assert w.reads() == 2
    w.loop.job_event(copy.deepcopy(w.api.job), deleted=True)
    assert w.loop.pace.pass_due()


def test_a_timer_pass_reads_the_job_only_when_the_loops_copy_is_old() -> None:
    w = World()
    w.step()
    w.clock.advance(IDLE_REQUEUE_S)
    w.step()
    assert w.passes() == 2 and w.reads() == 2  # the safety net: a fresh read


def test_a_progress_refresh_wakes_no_pass_and_costs_a_log_read_and_a_patch() -> None:
    w = World()
    w.start_running()
    w.api.log = PROGRESS_LINE % 1
    w.clock.advance(PROGRESS_EVERY_S)
    w.step()
    passes, reads, patches = w.passes(), w.reads(), len(w.api.patches)
    for step in range(2, 6):  # four minutes of training, the log changing before every read
        w.api.log = PROGRESS_LINE % step
        w.clock.advance(PROGRESS_EVERY_S)
        w.step()
        w.loop.job_event(copy.deepcopy(w.api.job))  # the refresh's own status patch, coming back
        assert not w.loop.pace.pass_due()
    assert w.api.job["status"]["progress"]["step"] == 5
    assert len(w.api.patches) - patches == 4 and w.reads() == reads  # the patches' answers keep the copy fresh
    assert w.passes() - passes == 2  # the idle safety net, from that copy


def test_children_created_count_until_the_index_shows_them() -> None:
    """A wide job's pod events wake a pass before the index holds every pod it created: no create again."""
    w = World()
    created = len(w.api.created)
    w.step()
    made = len(w.api.created) - created
    assert made == 4  # Service, ConfigMap, 2 pods
    w.loop.wake()  # the first pod's event: the index shows nothing yet
    w.loop.step(lambda: ([], {}))
    assert len(w.api.created) - created == made
    w.loop.child_event("Pod/j-rank-0")  # the watch event: from now on the index is the truth for that pod
    w.loop.step(lambda: ([], {}))
    assert [o["metadata"]["name"] for o in w.api.created[created + made :]] == ["j-rank-0"]


def test_creates_of_a_wave_run_together_and_pods_come_after_their_config() -> None:
    import threading

    started: list[str] = []
    both = threading.Barrier(2, timeout=5)

    class Api(FakeApi):
        def create(self, obj: dict[str, Any]) -> bool:
            started.append(obj["kind"])
            if obj["kind"] == "Pod":
                both.wait()  # returns only if the two pods are created at the same time
            return True

    objs = [
        {"kind": k, "metadata": {"name": n}}
        for k, n in (("Pod", "p0"), ("Service", "s"), ("Pod", "p1"), ("ConfigMap", "c"))
    ]
    controller.create_all(Api({}), objs)
    assert sorted(started[:2]) == ["ConfigMap", "Service"] and started[2:] == ["Pod", "Pod"]


def test_the_loop_ends_when_its_job_is_gone_or_replaced_by_one_of_the_same_name() -> None:
    w = World()
    w.step()
    w.api.job["metadata"]["uid"] = "uid-2"  # deleted, and a new job made under the same name
    w.loop.job_event(copy.deepcopy(w.api.job))
    w.step()
    assert w.loop.gone and not w.api.created[4:]  # nothing made for the other job
    gone = World()
    gone.step()
    gone.api.get_job = lambda ns, name: None  # type: ignore[method-assign]
    gone.loop.job_event(copy.deepcopy(gone.api.job), deleted=True)
    gone.step()
    assert gone.loop.gone


def test_the_daemon_puts_no_finalizer_on_jobs() -> None:
    """A finalizer would cost a patch per job at creation and at deletion; the loop ends itself instead."""
    spawning = kopf.get_default_registry()._spawning.get_all_handlers()
    assert [(str(h.id), h.requires_finalizer) for h in spawning] == [("job_daemon", False)]


def test_no_change_handlers_and_every_watch_handler_runs_on_the_event_loop() -> None:
    """handlers.GenerationOnlyDiffBase gives kopf a generation instead of a copy of each object: right only while
    no on.create/on.update/on.resume/on.delete handler exists, which would see no real diff. And kopf runs a sync
    handler in a worker thread per watch event: every index and event handler must be `async`."""
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == []
    watch_handlers = [*registry._indexing.get_all_handlers(), *registry._watching.get_all_handlers()]
    assert watch_handlers and all(asyncio.iscoroutinefunction(h.fn) for h in watch_handlers), [
        str(h.id) for h in watch_handlers if not asyncio.iscoroutinefunction(h.fn)
    ]


def test_the_diff_base_is_the_generation_and_copies_nothing() -> None:
    storage = handlers.GenerationOnlyDiffBase(prefix="finetune.dev", key="last-handled-configuration")
    body = kopf.Body({"metadata": {"name": "j", "generation": 3}, "spec": {"big": ["x"] * 1000}})
    assert storage.build(body=body) == {"generation": 3}


def test_the_operator_freezes_its_startup_objects_before_kopf_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full garbage collections walk every tracked object; the tens of thousands of the imported modules never die, so
    run_operator takes them out of the scans (gc.freeze) before kopf starts watching."""
    frozen_at_run: list[int] = []
    monkeypatch.setattr(handlers.kopf, "run", lambda **_: frozen_at_run.append(gc.get_freeze_count()))
    monkeypatch.setattr(handlers.kopf, "configure", lambda **_: None)
    monkeypatch.setattr(handlers, "workloads_served", lambda: False)  # no cluster here: Kueue absent
    try:
        assert handlers.run_operator(namespaces=["ns"], config={}, metrics_port=0, health_port=0, verbose=True) == 0
    finally:
        gc.unfreeze()
    assert frozen_at_run and frozen_at_run[0] > 10_000


# -- a spec whose content made a pass raise: issue 23 ---------------------------------------------------------------
HUGE = 2**63 - 1  # the largest integer the API server stores


def test_a_job_stored_with_a_deadline_past_the_maximum_ends_invalid_once() -> None:
    """A job stored with activeDeadlineSeconds near int64's maximum (before a CRD upgrade set a maximum) used to
    raise OverflowError in every pass once it had a startTime: it never ran on, and never released its quota. Now
    its pass ends it Failed/InvalidSpec naming the field, once, without an error backoff (reconcile's own time
    arithmetic is safe for any value: test_reconcile_phases.py)."""
    w = World(activeDeadlineSeconds=HUGE)
    pause = w.step()
    st = w.api.job["status"]
    assert (st["phase"], st["reason"]) == ("Failed", "InvalidSpec"), st
    assert "activeDeadlineSeconds" in st["message"]
    assert w.loop.pace.failures == 0 and pause.wakeable
    patches = len(w.api.patches)
    w.clock.advance(IDLE_REQUEUE_S)
    w.step()
    assert len(w.api.patches) == patches


def test_a_pass_whose_pure_part_raises_fails_the_job_once_and_stops_its_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the spec's content makes reconcile or the builders raise would raise again on every pass: the job
    ends Failed/InvalidSpec naming the error, its pods are deleted (by uid), and nothing retries it. The fault
    is injected into a builder, since every known such spec is now handled."""
    w = World()
    w.start_running()
    monkeypatch.setattr(rec, "desired", raises(ZeroDivisionError("a builder divided by the spec's zero")))
    w.loop.wake()
    pause = w.step()
    st = w.api.job["status"]
    assert (st["phase"], st["reason"]) == ("Failed", "InvalidSpec"), st
    assert "ZeroDivisionError: a builder divided by the spec's zero" in st["message"]
    assert ("Warning", "InvalidSpec") in w.api.events
    assert sorted(c for c in w.api.calls if c.startswith("delete_pod")) == [
        "delete_pod j-rank-0 uid-pod-j-rank-0",
        "delete_pod j-rank-1 uid-pod-j-rank-1",
    ]
    assert w.loop.pace.failures == 0 and pause.wakeable  # no error backoff: nothing to retry
    patches = len(w.api.patches)
    w.clock.advance(IDLE_REQUEUE_S)
    w.step()
    assert len(w.api.patches) == patches and w.api.job["status"]["phase"] == "Failed"


def test_an_api_error_still_backs_off_and_retries() -> None:
    """Only the pure part's errors fail the job: an API error is transient (test_error_backoff_... above)."""
    w = World()
    w.api.fail_creates = True
    assert not w.step().wakeable and w.loop.pace.failures == 1
    assert w.api.job["status"].get("phase") != "Failed"


def test_a_stored_job_that_fails_validation_stops_its_pods_and_finishes_its_workload() -> None:
    """A job made valid by an older CRD and invalid by the current code: Failed/InvalidSpec, and what it held
    goes (its running pods, its Workload's quota), read from the indexes without building anything."""
    w = World(queueName="lq")
    w.step()
    [made] = [o for o in w.api.created if o["kind"] == "Workload"]
    w.workloads = [admitted_workload(made)]
    w.loop.child_event("Workload/j")
    w.step()
    w.running()
    w.loop.wake()
    w.step()
    assert w.api.job["status"]["phase"] == "Running"
    w.api.job["spec"]["hardware"]["nodes"] = 0  # what no admission lets in today
    w.api.job["metadata"]["generation"] = 2
    w.loop.job_event(copy.deepcopy(w.api.job))
    w.step()
    st = w.api.job["status"]
    assert (st["phase"], st["reason"]) == ("Failed", "InvalidSpec") and "nodes" in st["message"]
    assert sum(c.startswith("delete_pod") for c in w.api.calls) == 2
    finished = [c for c in w.api.workload_patches[-1]["status"]["conditions"] if c["type"] == "Finished"]
    assert finished and finished[0]["status"] == "True" and finished[0]["reason"] == "Failed"


# -- Kueue: the Workload is watched, not polled ---------------------------------------------------------------------
def admitted_workload(made: dict[str, Any]) -> dict[str, Any]:
    """The Workload as Kueue leaves it once admitted, as the Workload index holds it."""
    wl = shown(made)
    wl["metadata"].update(resourceVersion="7", generation=1)
    conds = [("QuotaReserved", "QuotaReserved"), ("Admitted", "Admitted")]
    wl["status"] = {
        "conditions": [{"type": t, "status": "True", "reason": r, "message": r} for t, r in conds],
        "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "rank", "count": 2, "flavors": {}}]},
    }
    return wl


def test_a_queued_job_makes_no_request_while_its_workload_does_not_change() -> None:
    w = World(queueName="lq")
    w.step()
    [made] = [o for o in w.api.created if o["kind"] == "Workload"]
    assert w.api.job["status"]["phase"] == "Queued"
    pending = shown(made)
    pending["status"] = {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending"}]}
    w.workloads = [pending]
    w.loop.child_event("Workload/j")  # the watch event of the create
    w.step()
    calls = len(w.api.calls)
    for _ in range(100):  # ten minutes in 6 s steps
        w.clock.advance(6)
        w.step()
    assert "get_workload" not in w.api.calls
    assert w.api.calls[calls:] == ["get_job"] * 10  # the safety-net pass's read of the job, once a minute
    # Kueue admits it: the Workload's watch event wakes the job, which creates its pods in that pass.
    w.workloads = [admitted_workload(made)]
    w.loop.child_event("Workload/j")
    assert w.loop.pace.pass_due()
    w.step()
    assert sorted(o["metadata"]["name"] for o in w.api.created if o["kind"] == "Pod") == ["j-rank-0", "j-rank-1"]


def test_without_the_workload_watch_a_queued_job_reads_its_workload_until_admitted() -> None:
    """Where Kueue came after the operator (no Workload watch), a Queued job reads its Workload every pass and
    passes every QUEUED_POLL_S, so an admission starts it within seconds; a job that never had a queue reads none."""
    w = World(poll_workloads=True, queueName="lq")
    w.step()
    [made] = [o for o in w.api.created if o["kind"] == "Workload"]
    w.api.workload = shown(made)
    w.clock.advance(controller.QUEUED_POLL_S)  # the first pass asked for the next one by then
    pause = w.step()
    assert w.api.job["status"]["phase"] == "Queued" and pause.seconds <= controller.QUEUED_POLL_S
    assert w.api.calls.count("get_workload") == 2
    w.api.workload = admitted_workload(made)
    w.clock.advance(pause.seconds)
    w.step()
    assert sorted(o["metadata"]["name"] for o in w.api.created if o["kind"] == "Pod") == ["j-rank-0", "j-rank-1"]
    plain = World(poll_workloads=True)
    plain.step()
    assert "get_workload" not in plain.api.calls


def test_an_eviction_seen_on_the_workload_watch_stops_the_pods_in_that_pass() -> None:
    w = World(queueName="lq")
    w.step()
    [made] = [o for o in w.api.created if o["kind"] == "Workload"]
    w.workloads = [admitted_workload(made)]
    w.loop.child_event("Workload/j")
    w.step()
    w.running()
    w.loop.wake()
    w.step()
    assert w.api.job["status"]["phase"] == "Running"
    evicted = copy.deepcopy(w.workloads[0])
    evicted["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "Preempted"})
    w.workloads = [evicted]
    w.loop.child_event("Workload/j")
    w.step()
    assert w.api.job["status"]["phase"] == "Queued"
    assert sum(c.startswith("delete_pod") for c in w.api.calls) == 2


def test_a_removed_queue_name_deletes_the_jobs_own_workload_by_uid() -> None:
    w = World(queueName="lq")
    w.step()
    [made] = [o for o in w.api.created if o["kind"] == "Workload"]
    w.workloads = [shown(made)]
    w.loop.child_event("Workload/j")
    w.step()
    del w.api.job["spec"]["runPolicy"]["queueName"]
    w.api.job["metadata"]["generation"] = 2
    w.loop.job_event(copy.deepcopy(w.api.job))
    w.step()
    assert "delete_workload uid-workload-j" in w.api.calls
    assert sorted(o["metadata"]["name"] for o in w.api.created if o["kind"] == "Pod") == ["j-rank-0", "j-rank-1"]


# -- operator-wide series: every full pass timed by outcome, and a job's failure counted once, by namespace and
# -- reason (the real registry /metrics serves).
def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def passes_timed(result: str) -> float:
    return sample("finetune_operator_reconcile_duration_seconds_count", {"result": result})


def failures(reason: str) -> float:
    return sample("finetune_operator_job_failures_total", {"namespace": NS, "reason": reason})


def test_every_full_pass_is_timed_with_its_outcome() -> None:
    ok, err = passes_timed("success"), passes_timed("error")
    w = World()
    w.api.fail_creates = True
    pause = w.step()  # raises inside the pass: an error pass
    assert (passes_timed("success"), passes_timed("error")) == (ok, err + 1)
    w.api.fail_creates = False
    w.clock.advance(pause.seconds)
    w.step()
    w.step()  # not due: no pass, nothing observed
    assert (passes_timed("success"), passes_timed("error")) == (ok + 1, err + 1) and w.passes() == 2


def test_a_failed_job_is_counted_once_by_namespace_and_reason() -> None:
    before = failures("OOMKilled")
    w = World()
    w.api.job["spec"]["runPolicy"] = {"backoffLimit": 0}
    w.start_running()
    w.pods[0]["status"] = {
        "phase": "Failed",
        "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
    }
    w.loop.wake()
    w.step()
    assert (w.api.job["status"]["phase"], w.api.job["status"]["reason"]) == ("Failed", "OOMKilled")
    assert failures("OOMKilled") == before + 1
    for _ in range(2):  # later passes of the failed job write no new failure
        w.clock.advance(IDLE_REQUEUE_S)
        w.loop.wake()
        w.step()
    assert failures("OOMKilled") == before + 1


def test_a_refused_or_invalid_job_counts_as_an_invalid_spec_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    before = failures("InvalidSpec")
    w = World()
    monkeypatch.setattr(w.api, "create", raises(Refused("Pod", "j-rank-0", 422, "Pod is invalid")))
    w.step()
    assert w.api.job["status"]["phase"] == "Failed" and failures("InvalidSpec") == before + 1
    # A job stored invalid (before a CRD upgrade tightened the schema) fails at validation instead.
    w = World()
    w.api.job["spec"]["hardware"]["nodes"] = 0
    w.step()
    w.clock.advance(IDLE_REQUEUE_S)
    w.loop.wake()
    w.step()
    assert w.api.job["status"]["reason"] == "InvalidSpec" and failures("InvalidSpec") == before + 2


def test_a_queued_jobs_priority_class_is_read_until_its_workload_exists_then_never() -> None:
    """spec.podTemplate.priorityClassName with a queue: the Workload carries the class's value as its priority, so
    it is made only once the class can be read (re-read every PRIORITY_CLASS_POLL_S meanwhile); once it exists,
    no pass reads the class again."""
    w = World(queueName="lq")
    w.api.job["spec"]["podTemplate"] = {"priorityClassName": "team-high"}
    pause = w.step()
    assert [o for o in w.api.created if o["kind"] == "Workload"] == []
    st = w.api.job["status"]
    assert st["phase"] == "Queued" and st["reason"] == "PriorityClassNotFound"
    assert "spec.podTemplate.priorityClassName" in st["message"] and "team-high" in st["message"]
    assert pause.seconds == kueue.PRIORITY_CLASS_POLL_S
    w.api.priority_classes["team-high"] = {"metadata": {"name": "team-high"}, "value": 1000}
    w.clock.advance(pause.seconds)
    w.step()
    [made] = [o for o in w.api.created if o["kind"] == "Workload"]
    assert made["spec"]["priority"] == 1000
    ref = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "team-high"}
    assert made["spec"]["priorityClassRef"] == ref
    assert made["spec"]["podSets"][0]["template"]["spec"]["priorityClassName"] == "team-high"
    reads = w.api.calls.count("get_priority_class team-high")
    assert reads >= 2  # before the class existed, and the pass that made the Workload
    w.workloads = [admitted_workload(made)]
    w.loop.child_event("Workload/j")
    w.step()
    w.running()
    w.loop.wake()
    w.step()
    assert w.api.calls.count("get_priority_class team-high") == reads
    assert all(p["spec"]["priorityClassName"] == "team-high" for p in w.api.created if p["kind"] == "Pod")
