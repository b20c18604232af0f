"""The per-job loop: one `JobLoop` per FineTuneJob, for as long as kopf's daemon for the job runs.

A full pass reads the job and its children (from the watch-fed indexes, given by the caller), runs the pure
`reconcile()` and applies the plan. Between passes the loop sleeps until a watch event on the job or one of its
children wakes it, or a timer falls due: the next pass (deadline, TTL, or the idle safety net), a progress
refresh of a training job, or the end of an error backoff. `JobLoop` keeps the pass itself and composes three
parts, each with one job and unit-tested alone with a fake clock:
- `jobcache.JobCache`: the job as the loop holds it (kopf's body, the answer to its own last write) and when to
  read it fresh, so that a pass woken by its own children's events costs no read;
- `expectations.Expectations`: what the loop created that the indexes do not show yet;
- `pacing.Pacing`: wake-ups, the next pass, the error backoff and the progress clock.
No kopf here: handlers.py makes one loop per job daemon and routes watch events to it through `Loops`; the
loop's rules run in unit tests with a fake clock and a fake API (tests/unit/test_controller.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from . import constants as c
from . import progress, throughput
from .admission import validate
from .api.validation import InvalidSpec
from .builders.layout import launcher_of, resolve
from .builders.names import Names
from .builders.objects import SshKeys
from .conditions import TERMINAL, set_condition
from .disruptions import hang_left, note_progress
from .expectations import Expectations
from .jobcache import JobCache
from .kueue import admitted_flavors, priority_class_to_read
from .metrics import (
    RECONCILE_ERRORS,
    RECONCILES,
    TRANSITIONS,
    clear_job,
    count_failure,
    observe_pass,
    set_job_progress,
)
from .pacing import IDLE_REQUEUE_S, Pacing, Pause
from .reconcile import Observed, Plan, Relabel, reconcile, slim_workload, wind_down
from .refusal import Refused, failed_status
from .sshkeys import generate_keys

log = logging.getLogger("finetune_operator")

FOLLOWED = ("Running", "Precompiling")  # phases whose progress is read from rank 0's log


@dataclass
class Children:
    """What the watch-fed indexes hold under one job's key (handlers.job_daemon): its children found by their
    controller owner, and the objects labelled with its name (reconcile tells the job's own from foreign ones).
    A caller may give a (pods, objects) pair instead; `JobLoop.take` copies every part."""

    pods: list[dict[str, Any]]  # reconcile.slim_child of each pod
    objects: dict[str, str | None]  # "Kind/name" -> controller uid of the other children
    workloads: list[dict[str, Any]] = field(default_factory=list)  # reconcile.slim_workload of each Workload
    # "Kind/name" -> (uid, labels) of `objects` found under the key by their controller owner whose job-name label
    # names another job (Observed.mislabelled).
    mislabelled: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)
    # Node name -> disruptions.slim_node of the nodes the pods are bound to (Observed.nodes).
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)


# Creates in flight at once, across all jobs: a 64-rank job's pods go out together instead of one after another,
# and 200 new jobs cannot open 800 connections (k8s.POOL_CONNECTIONS leaves room for them). The same number of
# threads the raw benchmark writes with (benchmarks/operator_scale.py).
CREATE_CONCURRENCY = 8
_creates = ThreadPoolExecutor(CREATE_CONCURRENCY, thread_name_prefix="create")


# Without a Workload watch (JobLoop.poll_workloads), a Queued job's next pass comes this soon: Kueue's admission
# wakes nothing then.
QUEUED_POLL_S = 3.0


def _queued_ever(job: Mapping[str, Any]) -> bool:
    """Whether the job names a queue, or named one (its Queued condition stays): then it has or had a Workload."""
    if ((job.get("spec") or {}).get("runPolicy") or {}).get("queueName"):
        return True
    return any(cond.get("type") == "Queued" for cond in (job.get("status") or {}).get("conditions") or [])


class _KeysFailed(Exception):
    """Making an MPI job's SSH keys failed: not the spec's content (see JobLoop._plan)."""


def _key_maker(job_name: str) -> Callable[[], SshKeys]:
    def make() -> SshKeys:
        try:
            return generate_keys(job_name)
        except Exception as e:
            raise _KeysFailed from e

    return make


class Api(Protocol):
    """What the loop calls on the Kubernetes API (k8s.Kube; a fake in the unit tests). Every delete and label
    repair carries the uid of the object it means as a precondition."""

    def get_job(self, ns: str, name: str) -> dict[str, Any] | None: ...
    def patch_status(self, ns: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None: ...
    def event(self, job: dict[str, Any], etype: str, reason: str, message: str) -> None: ...
    def create(self, obj: dict[str, Any]) -> bool: ...
    def delete_pod(self, ns: str, name: str, uid: str, grace: int | None = None) -> None: ...
    def delete_job(self, ns: str, name: str, uid: str) -> None: ...
    def relabel(self, ns: str, change: Relabel) -> None: ...
    def log_tail(self, ns: str, pod: str, container: str, lines: int = 200) -> str | None: ...
    def get_workload(self, ns: str, name: str) -> dict[str, Any] | None: ...
    def get_resource_flavor(self, name: str) -> dict[str, Any] | None: ...
    def get_priority_class(self, name: str) -> dict[str, Any] | None: ...
    def patch_workload_status(self, ns: str, name: str, patch: dict[str, Any]) -> None: ...
    def delete_workload(self, ns: str, name: str, uid: str) -> None: ...


def network_policies(config: Mapping[str, Any]) -> bool:
    """Whether the operator makes (and so may read and watch) a NetworkPolicy per job."""
    return bool((config.get("networkPolicy") or {}).get("enabled"))


def utcnow() -> datetime:
    """Wall-clock time as reconcile and the status timestamps use it (naive UTC)."""
    return datetime.now(UTC).replace(tzinfo=None)


def rank0_log_source(job: dict[str, Any], phase: str | None) -> tuple[str, str]:
    """(pod, container) whose stdout carries global rank 0's progress lines."""
    launcher = launcher_of(job["spec"])
    names = Names.of(job, launcher)
    if launcher == "mpi":
        pod, main = names.launcher, c.CONTAINER_LAUNCHER
    else:
        pod, main = names.rank_pod(0), c.CONTAINER_TRAINER
    return pod, c.INIT_PRECOMPILE if phase == "Precompiling" else main


def _rank0_finished(job: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """Whether the container that prints rank 0's progress (rank0_log_source) has exited 0."""
    pod_name, container = rank0_log_source(job, None)
    for pod in pods:
        if pod["metadata"]["name"] != pod_name or pod["metadata"].get("deletionTimestamp"):
            continue
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            done = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") == container and done.get("exitCode") == 0:
                return True
    return False


def apply(
    api: Api, job: dict[str, Any], old_status: dict[str, Any], plan: Plan
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Carries out the plan. Returns the job as the API server answered the status patch (None when no patch
    was sent or the job is gone), and the objects that were created (not those that existed already)."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    if plan.delete_job:
        api.event(job, "Normal", "TTLExpired", "ttlSecondsAfterFinished elapsed: deleting the job and its children")
        api.delete_job(ns, name, str(job["metadata"].get("uid")))
        return None, []
    # The status first: it is the job's memory. A process killed after deleting a failed attempt's pods but
    # before saving restartCount would come back to find them gone and recreate the same attempt, the restart
    # never counted against backoffLimit (tests/faults/test_operator_kill.py). Saved first, a restart already
    # counted meets the old pods as stale and finishes the deletes; a saved startTime meets missing pods and
    # creates them.
    patched = api.patch_status(ns, name, old_status, plan.status)
    for pod in plan.delete_pods:
        # A pod no watch event has shown yet (this loop created it) has no uid to delete it by: the pass its
        # event wakes deletes it.
        if pod in plan.pod_uids:
            api.delete_pod(ns, pod, plan.pod_uids[pod], plan.grace.get(pod))
    for change in plan.relabel:
        api.relabel(ns, change)
    if plan.delete_workload is not None:
        api.delete_workload(ns, name, plan.delete_workload)  # Names.workload: the job's own name
    created = create_all(api, plan.create)
    if plan.workload_status is not None:
        api.patch_workload_status(ns, name, plan.workload_status)
    for etype, reason, message in plan.events:
        api.event(job, etype, reason, message)
    for _, reason, _ in plan.events:
        TRANSITIONS.labels(phase=plan.status.get("phase", "Pending"), reason=reason).inc()
    count_failure(ns, old_status, plan.status)
    return patched, created


def create_all(api: Api, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Creates in two waves, each concurrent (CREATE_CONCURRENCY): first what the pods mount or sit behind
    (Service, ConfigMap, Secret, ...), then the pods, so a pod never starts before its configuration exists.
    Every create of a wave finishes before the first error (in plan order) is raised: a Refused pod ends the
    job (refusal.py) whatever the others did; the next pass finds the ones that were made. Returns the objects
    created (not those found to exist already, which k8s.Kube.create checked to be the job's own)."""
    created = []
    for wave in ([o for o in objects if o["kind"] != "Pod"], [o for o in objects if o["kind"] == "Pod"]):
        if len(wave) == 1:
            made = [api.create(wave[0])]
        elif wave:
            futures = [_creates.submit(api.create, obj) for obj in wave]
            wait(futures)
            made = [f.result() for f in futures]
        else:
            made = []
        created += [obj for obj, new in zip(wave, made, strict=True) if new]
    return created


@dataclass(frozen=True)
class _Planned:
    """A pass's reading of the job and its plan (JobLoop._plan -> JobLoop._apply)."""

    raw: dict[str, Any]  # the job as read
    job: dict[str, Any]  # validated, defaults applied
    old_status: dict[str, Any]
    plan: Plan
    now: datetime

    def acts(self) -> bool:
        """Whether the plan changes more than the status's details: creates, deletes, or a new phase."""
        p = self.plan
        return bool(p.create or p.delete_pods or p.delete_job or p.status.get("phase") != self.old_status.get("phase"))


@dataclass(frozen=True)
class Followed:
    """What a progress refresh between passes needs of a Running/Precompiling job (JobLoop.refresh_progress): the
    job's identity for the echo fingerprint, where rank 0's progress is printed, and the status this loop last
    wrote. Not the job itself: a training job can be followed for days, and its validated copy (larger than all of
    this, benchmarks/README.md) is what a pass needs, not a refresh."""

    ident: dict[str, Any]  # {"metadata": {"uid", "generation"}}: all fingerprint() reads of the job
    source: tuple[str, str]  # rank0_log_source(job, phase)
    status: dict[str, Any]
    hardware: throughput.Context  # what status.throughput's MFU needs of the job (its devices and their peaks)

    @classmethod
    def of(cls, job: dict[str, Any], status: dict[str, Any]) -> Followed:
        meta = job["metadata"]
        ident = {"metadata": {"uid": meta.get("uid"), "generation": meta.get("generation")}}
        hardware = throughput.Context.of(job, resolve(job))
        return cls(ident, rank0_log_source(job, status.get("phase")), status, hardware)


class JobLoop:
    """One job's loop: the pass (`reconcile_once`: read, plan, apply), and the parts that keep its state:
    `cache` (jobcache.JobCache), `expected` (expectations.Expectations) and `pace` (pacing.Pacing). Besides them:
    - `uid`: the job's, from kopf's body or the first read: a job of the same name with another uid is another job;
    - `gone`: the job was deleted (or replaced by a new one of the same name): the loop ends;
    - `followed`: for a Running/Precompiling job, what progress refreshes between passes need (`Followed`).
    `clock` is monotonic seconds and `now` the wall clock for status timestamps; tests pass fakes."""

    def __init__(
        self,
        namespace: str,
        name: str,
        api: Api,
        config: Mapping[str, Any],
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utcnow,
        body: Mapping[str, Any] | None = None,
        poll_workloads: bool = False,
    ) -> None:
        self.namespace, self.name = namespace, name
        self.api, self.config = api, config
        # No Workload watch (Kueue installed after the operator started, handlers.run_operator): a job that is or
        # was queued reads its Workload every pass, and a Queued one passes every QUEUED_POLL_S.
        self.poll_workloads = poll_workloads
        self.now = now
        self.cache = JobCache(body, clock)
        self.expected = Expectations(clock)
        self.pace = Pacing(clock)
        self.passes = 0
        self.uid: str | None = body["metadata"].get("uid") if body is not None else None
        self.gone = False
        self.followed: Followed | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    # -- watch events (on the event loop) -------------------------------------------------------------------------
    def wake(self) -> None:
        """A watch event on the job or one of its children: run a full pass as soon as the loop may."""
        self.pace.wake()

    def job_event(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A watch event on the job: wakes the loop unless it is the loop's own status write coming back."""
        if self.cache.event(body, deleted):
            self.wake()

    def child_event(self, ref: str, wake: bool = True) -> None:
        """A watch event on a child ("Kind/name"): the index holds its newest state, so a create the loop
        expects no longer needs to cover for the index's lag."""
        self.expected.seen(ref)
        if wake:
            self.wake()

    # -- one step -------------------------------------------------------------------------------------------------
    def pause(self) -> Pause:
        return self.pace.pause(following=self.followed is not None)

    def take(self, children: Callable[[], Children | tuple[Any, ...]]) -> Children | None:
        """When a full pass is due: use up the wake-up (an event during the pass triggers another) and copy the
        children, with what the loop created that the indexes do not show yet. Called on the event loop, which is
        what updates the indexes `children` reads."""
        if not self.pace.pass_due():
            return None
        if not self.pace.start_pass() and self.passes:
            self.cache.expire(IDLE_REQUEUE_S)  # a timer pass reads the job fresh unless the API answered lately
        got = children()
        got = got if isinstance(got, Children) else Children(*got)
        taken = Children(list(got.pods), dict(got.objects), list(got.workloads), dict(got.mislabelled), dict(got.nodes))
        self.expected.add_to(taken.pods, taken.objects, taken.workloads)
        return taken

    def tick(self, children: Children | None) -> Pause:
        """A full pass when `take()` gave children, else a progress refresh when one is due. Blocking (API
        calls): the daemon runs it in a worker thread."""
        if children is not None:
            self._full_pass(children)
        elif self._refresh_due():
            try:
                self.refresh_progress()
            except Exception:
                # Progress is best effort; the next full pass reports API errors in the job's status.
                log.exception("progress refresh of %s/%s failed", self.namespace, self.name)
        return self.pause()

    def step(self, children: Callable[[], Children | tuple[Any, ...]]) -> Pause:
        """take() and tick() in one call, for callers without threads (the unit tests)."""
        return self.tick(self.take(children))

    async def run(self, stopped: Callable[[], bool], children: Callable[[], Children | tuple[Any, ...]]) -> None:
        """Steps until `stopped()`; sleeps between them, woken early by `wake()` unless backing off."""
        loop = asyncio.get_running_loop()
        while not stopped() and not self.gone:
            taken = self.take(children)
            if taken is None and not self._refresh_due():
                pause = self.pause()  # nothing due (a wake-up while backing off ends here): no thread needed
            else:
                with self.cache.stepping():
                    pause = await loop.run_in_executor(None, self.tick, taken)
            await self.pace.sleep(pause)

    def _refresh_due(self) -> bool:
        return self.followed is not None and self.pace.progress_due()

    def _full_pass(self, children: Children) -> None:
        self.passes += 1
        started = time.perf_counter()
        try:
            wait = self.reconcile_once(children)
            if self.pace.failures:
                self._error_condition(None)
            self.pace.passed(wait)
        except Exception as e:
            log.exception("reconcile of %s/%s failed", self.namespace, self.name)
            self.cache.forget()
            try:
                RECONCILE_ERRORS.inc()
                self._error_condition(e)
            except Exception:
                log.exception("could not record the error in %s/%s status", self.namespace, self.name)
            self.pace.failed()
        observe_pass(time.perf_counter() - started, failed=self.pace.failures > 0)

    # -- the pass -------------------------------------------------------------------------------------------------
    def reconcile_once(self, children: Children) -> float:
        """One full pass. Returns seconds until the next one unless something wakes the loop earlier."""
        for fresh in (self.cache.job is None, True):
            wait, planned = self._plan(children)
            # A pass from the loop's copy acts (creates, deletes, a new phase) only on a fresh read: another
            # writer (a second operator, a stuck old replica) may have moved the job on since that copy
            # (tests/faults: two operators racing). The first pass (kopf's body, a new job) creates at once.
            if fresh or planned is None or not planned.acts() or self.passes <= 1:
                break
            self.cache.forget()
        return wait if planned is None else self._apply(planned)

    def _plan(self, children: Children) -> tuple[float, _Planned | None]:
        """The job (the loop's copy, or read fresh) and the plan for it; (seconds, None) when there is nothing
        to apply."""
        ns, name = self.key
        raw = self.cache.read(lambda: self.api.get_job(ns, name))
        if raw is None or (self.uid or raw["metadata"].get("uid")) != raw["metadata"].get("uid"):
            self.gone, self.followed = True, None
            self.cache.forget()
            clear_job(ns, name)
            return math.inf, None
        self.uid = raw["metadata"].get("uid")
        if raw["metadata"].get("deletionTimestamp"):
            self.followed = None
            clear_job(ns, name)
            return IDLE_REQUEUE_S, None
        old_status = dict(raw.get("status") or {})
        now = self.now()
        pods = children.pods
        # The Workload named like the job (Names.workload), from the Workload index: queued or not (a job whose
        # queueName was removed deletes its own). No request: its watch events wake the loop.
        wl = next((w for w in children.workloads if w["metadata"]["name"] == name), None)
        if self.poll_workloads and _queued_ever(raw):
            wl = slim_workload(got) if (got := self.api.get_workload(ns, name)) is not None else None
        bare = Observed(
            pods, children.objects, now, workload=wl, mislabelled=children.mislabelled, nodes=children.nodes
        )
        try:
            job = validate(raw)
        except InvalidSpec as e:
            # Admission normally rejects these; a job stored before a CRD upgrade can still be invalid.
            return self._wind_down(raw, bare, "invalid spec: " + "; ".join(str(x) for x in e.errors))
        except Exception as e:  # the spec's content broke validation itself: the same spec would again
            return self._wind_down(raw, bare, self._pure_error(e))
        job["status"] = raw.get("status") or {}
        prog = None
        if old_status.get("phase") in FOLLOWED:
            # Rank 0 finished: its last lines (final step, metrics, done) are read now, whatever the interval,
            # so a finished job's status.progress is its final one.
            # So is it when rank 0's silence reaches runPolicy.progressDeadlineSeconds: a Hung verdict is never
            # made on a read older than the deadline.
            due = hang_left(old_status, job["spec"].get("runPolicy", {}).get("progressDeadlineSeconds"), now) == 0
            prog = self._read_progress(
                rank0_log_source(job, old_status.get("phase")), old_status, force=due or _rank0_finished(job, pods)
            )
        # An admitted Workload's flavors, read each pass (a GET each): their nodeLabels and tolerations go onto
        # the pods; one that cannot be read (None) is left out and reconcile waits for it.
        flavors = {f: obj for f in admitted_flavors(wl) if (obj := self.api.get_resource_flavor(f)) is not None}
        # A queued job's PriorityClass, read (a GET) only while its Workload is still to be made: the value is
        # the Workload's priority. One that cannot be read is left out, and reconcile waits for it.
        pclass = priority_class_to_read(job, wl)
        classes = {}
        if pclass is not None and (obj := self.api.get_priority_class(pclass)) is not None:
            classes[pclass] = int(obj.get("value") or 0)
        observed = dataclasses.replace(
            bare, progress=prog, ssh_keys=_key_maker(name), flavors=flavors, priority_classes=classes
        )
        try:
            plan = reconcile(job, observed, self.config)
        except _KeysFailed as e:
            raise (e.__cause__ or e) from None  # not the spec's doing: backed off and retried like an API error
        except Exception as e:
            # reconcile and the builders are pure: what raised is the spec's content, and would raise again.
            return self._wind_down(raw, bare, self._pure_error(e))
        if self.poll_workloads and plan.status.get("phase") == "Queued":
            plan.requeue_after = min(plan.requeue_after or QUEUED_POLL_S, QUEUED_POLL_S)
        return 0.0, _Planned(raw, job, old_status, plan, now)

    def _pure_error(self, err: Exception) -> str:
        log.exception("reconciling the spec of %s/%s raised; the job is failed, not retried", *self.key)
        return (
            f"reconciling this spec raised {type(err).__name__}: {err}. The job is failed, not retried: the same "
            "spec would raise again. Create it again with a corrected spec, and report the error: the operator "
            "should have refused or handled this spec"
        )

    def _wind_down(self, raw: dict[str, Any], observed: Observed, message: str) -> tuple[float, _Planned]:
        """A job that cannot be reconciled ends Failed/InvalidSpec with its pods stopped and its Workload
        Finished (reconcile.wind_down); nothing retries it, since a spec change (a watch event) is all that
        could change the outcome."""
        plan = wind_down(raw, observed, message)
        return 0.0, _Planned(raw, raw, dict(raw.get("status") or {}), plan, observed.now)

    def _apply(self, planned: _Planned) -> float:
        """Applies a pass's plan; returns seconds until the next pass."""
        ns, name = self.key
        raw, job, old_status, plan, now = planned.raw, planned.job, planned.old_status, planned.plan, planned.now
        self.cache.intend(raw, plan.status)
        try:
            patched, created = apply(self.api, job, old_status, plan)
        except Refused as e:
            # No retry: the job ends here; the next pass (terminal phase) removes any pod this one created.
            status, msg = failed_status(plan.status, e, now)
            self.cache.forget()
            self.api.patch_status(ns, name, plan.status, status)  # apply() saved plan.status first
            self.api.event(raw, "Warning", "InvalidSpec", msg)
            TRANSITIONS.labels(phase="Failed", reason="InvalidSpec").inc()
            count_failure(ns, old_status, status)
            self.followed = None
            return IDLE_REQUEUE_S
        # apply() returned, so every create succeeded or met a 409 on an object this job controls.
        self.cache.remember(patched, old_status != plan.status and not plan.delete_job, raw)
        self.expected.expect(str(job["metadata"].get("uid")), plan.create, created)
        RECONCILES.inc()
        following = plan.status.get("phase") in FOLLOWED and not plan.delete_job
        self.followed = Followed.of(job, plan.status) if following else None
        self._export_progress(plan.status if following else None)
        if plan.delete_job:
            return IDLE_REQUEUE_S
        if plan.requeue_after is not None:
            return min(IDLE_REQUEUE_S, max(0.5, plan.requeue_after))
        if plan.status.get("phase") in TERMINAL and not plan.create and not plan.delete_pods:
            # A finished job (no TTL to wait for) has no timer: only a watch event on it or its children wakes it.
            return math.inf
        return IDLE_REQUEUE_S

    def refresh_progress(self) -> None:
        """Between full passes: read rank 0's log tail and patch status.progress alone when it changed."""
        if self.followed is None:
            return
        followed = self.followed
        status = followed.status
        prog = self._read_progress(followed.source, status)
        if prog is None or prog == status.get("progress"):
            return
        new = dict(status)
        note_progress(new, prog, self.now())  # lastProgressTime: runPolicy.progressDeadlineSeconds' clock
        measured = throughput.of(followed.hardware, prog)
        if measured is not None:
            new["throughput"] = measured
        self.cache.intend(followed.ident, new)
        patched = self.api.patch_status(self.namespace, self.name, status, new)  # sends only the changed key
        self.cache.remember(patched, True, None)
        self.followed = dataclasses.replace(followed, status=new)
        self._export_progress(new)

    def _export_progress(self, status: Mapping[str, Any] | None) -> None:
        """The job's Prometheus gauges follow status.progress while it trains; any other phase clears them."""
        if status is not None and status.get("progress"):
            set_job_progress(self.namespace, self.name, status["progress"], status.get("throughput"))
        else:
            clear_job(self.namespace, self.name)

    def _read_progress(
        self, source: tuple[str, str], status: Mapping[str, Any], force: bool = False
    ) -> dict[str, Any] | None:
        """Rank 0's newest progress folded onto status.progress, or None when it is not time to read again (every
        PROGRESS_EVERY_S, unless `force`) or the log has no progress yet."""
        if not force and not self.pace.progress_due():
            return None
        self.pace.progress_read()
        text = self.api.log_tail(self.namespace, *source)
        return progress.from_text(text, status.get("progress")) if text else None

    def _error_condition(self, err: Exception | None) -> None:
        """The ReconcileError condition: a pass's error shows in the job's status and an Event, not only in the
        operator's log; None: the first pass after failed ones succeeded, and the condition turns False."""
        raw = self.api.get_job(self.namespace, self.name)
        if raw is None:
            return
        old = dict(raw.get("status") or {})
        new = copy.deepcopy(old)  # set_condition edits conditions in place: old must stay what the API holds
        msg = f"reconcile error: {err}"
        if err is None:
            set_condition(new, "ReconcileError", False, "Recovered", "reconciled successfully", self.now())
        else:
            new["message"] = msg[:2000]
            set_condition(new, "ReconcileError", True, type(err).__name__, msg[:2000], self.now())
        self.cache.forget()
        self.api.patch_status(self.namespace, self.name, old, new)
        if err is not None:
            self.api.event(raw, "Warning", "ReconcileError", msg)


class Loops:
    """The running loops by (namespace, job name), so that watch events on a job or its pods reach its loop.
    One per operator, kept in kopf's memo (handlers.py): every object's memo is a shallow copy of the
    operator's, so they all share this registry, and the one API client every loop calls through."""

    def __init__(self) -> None:
        self._loops: dict[tuple[str, str], JobLoop] = {}
        self._api: Api | None = None
        self._ended = 0

    def kube(self, make: Callable[[], Api]) -> Api:
        """The shared API client, made on first use: by the time a job's daemon runs, kopf's login has loaded
        the credentials it is made from."""
        if self._api is None:
            self._api = make()
        return self._api

    def wake(self, namespace: str | None, name: str | None) -> None:
        loop = self._loops.get((namespace or "", name or ""))
        if loop is not None:
            loop.wake()

    def get(self, namespace: str, name: str) -> JobLoop | None:
        return self._loops.get((namespace, name))

    @contextlib.contextmanager
    def running(self, loop: JobLoop) -> Iterator[JobLoop]:
        """Registered while the job's daemon runs; its state (and its metrics' series) go with it."""
        self._loops[loop.key] = loop
        try:
            yield loop
        finally:
            if self._loops.get(loop.key) is loop:
                del self._loops[loop.key]
                clear_job(*loop.key)
            self._ended += 1
            if not self._loops or self._ended % TRIM_EVERY == 0:
                release_memory()


# After this many loops end (jobs deleted), or when the last one does, the C heap's free pages go back to the
# system: without it the RSS of a burst of jobs stays after they are gone (glibc keeps freed memory).
TRIM_EVERY = 100


def release_memory() -> None:
    """glibc's malloc_trim(0), found among the process's own symbols; nothing where the C library has none."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
