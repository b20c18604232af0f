"""The per-job loop: one `JobLoop` per FineTuneJob owns everything that job's control needs between passes.

A full pass reads the job and its children (from the watch-fed indexes, given by the caller), runs the pure
`reconcile()` and applies the plan. The job is read fresh from the API unless the loop holds it as the API held it
after the loop's own last write or read, and no watch event since says that anything else changed it: a pass
woken by its own children's events then costs no read (see `JobLoop.job`). Between passes the loop sleeps
until a watch event on the job or one of its children wakes it, or a timer falls due: the next pass (deadline,
TTL, or the idle safety net), a progress refresh of a training job, or the end of an error backoff. No kopf
here: handlers.py makes one loop per job daemon and routes watch events to it through `Loops`; the loop's rules
(backoff, wake-ups, progress clock) run in unit tests with a fake clock and a fake API (tests/unit/test_controller.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import dataclasses
import hashlib
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from . import constants as c
from . import progress
from .admission import validate
from .api.validation import InvalidSpec
from .builders.layout import launcher_of
from .builders.names import Names
from .builders.objects import SshKeys
from .conditions import set_condition
from .kueue import admitted_flavors
from .metrics import (
    RECONCILE_ERRORS,
    RECONCILES,
    TRANSITIONS,
    clear_job,
    count_failure,
    observe_pass,
    set_job_progress,
)
from .reconcile import Observed, Plan, Relabel, controller_uid, reconcile, slim_child, slim_workload, wind_down
from .refusal import Refused, failed_status
from .sshkeys import generate_keys

log = logging.getLogger("finetune_operator")

# A full pass runs when a watch event on the job or one of its children wakes the loop, and at least this often
# as a safety net for a watch event lost (every child kind the operator makes is watched, but for Secrets).
# Such a timer pass reads the job fresh unless the loop's copy came from the API (a read, or the answer to a
# status patch, which carries the whole job) within this time.
IDLE_REQUEUE_S = 60.0
# While training, rank 0's log is read this often; between full passes that is the only request, plus a
# status patch when the progress changed, which wakes no pass (JobLoop.job_event): at most 4 requests per
# minute per training job (benchmarks/README.md).
PROGRESS_EVERY_S = 30.0
# A finished job (no TTL to wait for) has no timer: only a watch event on it or its children wakes its loop.
FINISHED = ("Succeeded", "Failed")
# Statuses this loop wrote lately, whose watch events are its own echo and wake nothing (JobLoop.job_event).
ECHOES_KEPT = 8
# A child created by this loop counts as existing until a watch event on it arrives or the index shows it, for
# at most this long (then a create again meets a 409 and reads it back): JobLoop.created.
CREATED_MEMORY_S = 30.0
FOLLOWED = ("Running", "Precompiling")  # phases whose progress is read from rank 0's log
# Seconds before the next pass after 1, 2, ... failed passes in a row (the last one repeats). Read by the
# control-plane backoff test too.
ERROR_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


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


# Creates in flight at once, across all jobs: a 64-rank job's pods go out together instead of one after another,
# and 200 new jobs cannot open 800 connections (k8s.POOL_CONNECTIONS leaves room for them). The same number of
# threads the raw benchmark writes with (benchmarks/operator_scale.py).
CREATE_CONCURRENCY = 8
_creates = ThreadPoolExecutor(CREATE_CONCURRENCY, thread_name_prefix="create")
# Kinds the operator creates but does not watch (handlers.py): a loop remembers the ones it made or found to be
# its own in `JobLoop.made`. A new loop (operator restart) creates again and reads the 409 back once.
UNWATCHED_KINDS = ("Secret",)


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
    def delete_pod(self, ns: str, name: str, uid: str) -> None: ...
    def delete_job(self, ns: str, name: str, uid: str) -> None: ...
    def relabel(self, ns: str, change: Relabel) -> None: ...
    def log_tail(self, ns: str, pod: str, container: str, lines: int = 200) -> str | None: ...
    def get_resource_flavor(self, name: str) -> dict[str, Any] | None: ...
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
            api.delete_pod(ns, pod, plan.pod_uids[pod])
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
    wrote. Not the job itself: a training job can be followed for days, and its validated copy (about 11 KiB of
    Python objects for the samples) is what a pass needs, not a refresh."""

    ident: dict[str, Any]  # {"metadata": {"uid", "generation"}}: all fingerprint() reads of the job
    source: tuple[str, str]  # rank0_log_source(job, phase)
    status: dict[str, Any]

    @classmethod
    def of(cls, job: dict[str, Any], status: dict[str, Any]) -> Followed:
        meta = job["metadata"]
        ident = {"metadata": {"uid": meta.get("uid"), "generation": meta.get("generation")}}
        return cls(ident, rank0_log_source(job, status.get("phase")), status)


@dataclass(frozen=True)
class Pause:
    """How long the loop sleeps after a step."""

    seconds: float
    wakeable: bool  # False while backing off (see JobLoop.pass_due): a plain sleep, not a wait for a wake-up


class JobLoop:
    """One job's loop. Its state lives here, for as long as kopf's daemon for the job runs:
    - `next_pass`: clock time of the next full pass; a wake-up brings it forward (except while backing off);
    - `failures`: failed passes in a row, which pick the backoff from ERROR_BACKOFF_S;
    - `job`: the job as the API server held it after this loop's last status write or read, or None when it must
      be read fresh (at first, unless the daemon gave kopf's body; after a watch event that is not this loop's
      own echo; before a timer pass). The loop is the only writer of the status, and a spec change bumps the
      generation, which is never an echo. Once the echo of the loop's last write arrives, `job` is kopf's body
      of that same version (shallow: spec and status are kopf's objects, never modified here), so a job is held
      in memory once, not twice;
    - `echoes`: fingerprints of the statuses this loop wrote lately: a watch event showing one of them (same
      generation) is the loop's own write coming back and wakes nothing;
    - `followed`: for a Running/Precompiling job, what progress refreshes between passes need (`Followed`);
    - `progress_read_at`: clock time of the last read of rank 0's log (at most one per PROGRESS_EVERY_S);
    - `made`: "Kind/name" -> job uid of the unwatched children (UNWATCHED_KINDS) this loop created or found to
      be the job's own, so their key pairs are made once;
    - `created`: "Kind/name" -> (the object, clock time) of watched children this loop created that the indexes
      have not shown yet: a pass woken by the first of a wide job's pod events must not create the others again.
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
    ) -> None:
        self.namespace, self.name = namespace, name
        self.api, self.config = api, config
        self.clock, self.now = clock, now
        self.next_pass = clock()  # the first pass is due at once
        self.failures = 0
        self.passes = 0
        self.job: dict[str, Any] | None = lean(body)
        self.live = body  # kopf's body of the job, which kopf replaces with each watch event's (see hold)
        self.ticking = False  # a step runs in a worker thread (run): only that thread sets `job` meanwhile
        self.job_at = clock()  # when `job` came from the API
        self.uid: str | None = body["metadata"].get("uid") if body is not None else None  # else the first read's
        self.gone = False  # the job was deleted (or replaced by a new one of the same name): the loop ends
        self.echoes: deque[bytes] = deque(maxlen=ECHOES_KEPT)
        self.followed: Followed | None = None
        self.progress_read_at: float | None = None
        self.made: dict[str, str] = {}
        self.created: dict[str, tuple[dict[str, Any], float]] = {}
        self._woken = asyncio.Event()  # set by watch events (on the event loop); binds to no loop until awaited

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    # -- wake-ups and timers ------------------------------------------------------------------------------------
    def wake(self) -> None:
        """A watch event on the job or one of its children: run a full pass as soon as the loop may."""
        self._woken.set()

    def job_event(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A watch event on the job (on the event loop). This loop's own status write coming back wakes nothing;
        anything else (a spec change, a deletion, a status another writer set) is read fresh by the next pass."""
        meta = body.get("metadata") or {}
        mine = fingerprint(body, body.get("status") or {}) in self.echoes
        if mine and not deleted and not meta.get("deletionTimestamp"):
            self.hold(body)
            return
        self.job = None
        self.wake()

    def hold(self, body: Mapping[str, Any] | None) -> None:
        """When `body` (kopf's, from a watch event) is the version of the job this loop holds, keep kopf's objects
        and drop the loop's own copy. Called on the event loop, where kopf replaces its body: on the echo of the
        loop's write, and after each step, for an echo that arrived while the write was still being answered. Not
        while a step runs: its thread may have just dropped `job` to read the job fresh, which must stand."""
        job = self.job
        if self.ticking or body is None or job is None:
            return
        meta = body.get("metadata") or {}
        if meta.get("resourceVersion") == job["metadata"].get("resourceVersion") and body.get("spec") is not job.get(
            "spec"
        ):
            self.job = lean(body)

    def child_event(self, ref: str, wake: bool = True) -> None:
        """A watch event on a child ("Kind/name"): the index holds its newest state, so a create this loop
        remembers (`created`) no longer needs to cover for the index's lag."""
        self.created.pop(ref, None)
        if wake:
            self.wake()

    def _intend(self, job: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """Before a status write: its watch event is an echo (see job_event)."""
        self.echoes.append(fingerprint(job, status))

    def _remember(self, patched: dict[str, Any] | None, sent: bool, raw: dict[str, Any] | None) -> None:
        """After a status write: the job as the API server answered it; unchanged when nothing was sent."""
        self.job = lean(patched) if sent else raw  # None (gone, or a fake API that answers nothing): read it fresh
        if sent:
            self.job_at = self.clock()

    def pass_due(self) -> bool:
        """A wake-up makes the pass due at once, except while backing off after failed passes: the failure's
        own status patch sends a watch event, which must not cut the backoff short."""
        if self._woken.is_set() and not self.failures:
            return True
        return self.clock() >= self.next_pass

    def _progress_due_in(self) -> float:
        if self.progress_read_at is None:
            return 0.0
        return PROGRESS_EVERY_S - (self.clock() - self.progress_read_at)

    def pause(self) -> Pause:
        """After a step: until the next pass, or the next progress read of a followed job, whichever is first."""
        until_pass = self.next_pass - self.clock()
        if math.isinf(until_pass):
            return Pause(math.inf, wakeable=True)
        if self.failures:
            return Pause(max(0.0, until_pass), wakeable=False)
        if self.followed is not None:
            until_pass = min(until_pass, self._progress_due_in())
        return Pause(max(0.0, until_pass), wakeable=True)

    # -- one step -------------------------------------------------------------------------------------------------
    def take(self, children: Callable[[], Children | tuple[Any, ...]]) -> Children | None:
        """When a full pass is due: clear the wake-up (an event during the pass triggers another) and copy the
        children. Called on the event loop, which is what updates the indexes `children` reads."""
        if not self.pass_due():
            return None
        if not self._woken.is_set() and self.passes and self.clock() - self.job_at >= IDLE_REQUEUE_S:
            self.job = None  # a timer pass reads the job fresh unless the API answered with it lately
        self._woken.clear()
        got = children()
        got = got if isinstance(got, Children) else Children(*got)
        taken = Children(list(got.pods), dict(got.objects), list(got.workloads), dict(got.mislabelled))
        return self._with_created(taken)

    def _with_created(self, children: Children) -> Children:
        """The indexes' children plus what this loop created that they do not show yet (`created`)."""
        now = self.clock()
        pods, objects, workloads = children.pods, children.objects, children.workloads
        shown = {f"Pod/{p['metadata']['name']}" for p in pods} | objects.keys()
        shown |= {f"Workload/{w['metadata']['name']}" for w in workloads}
        for ref, (obj, at) in list(self.created.items()):
            if ref in shown or now - at > CREATED_MEMORY_S:
                del self.created[ref]
            elif obj["kind"] == "Pod":
                pods.append(obj)
            elif obj["kind"] == "Workload":
                workloads.append(obj)
            else:
                objects[ref] = controller_uid(obj)
        return children

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
                self.ticking = True
                try:
                    pause = await loop.run_in_executor(None, self.tick, taken)
                finally:
                    self.ticking = False
                self.hold(self.live)
            if not pause.wakeable:
                await asyncio.sleep(pause.seconds)
                continue
            with contextlib.suppress(TimeoutError):  # capped, to see `stopped()`; an early look does no work
                await asyncio.wait_for(self._woken.wait(), timeout=min(pause.seconds, IDLE_REQUEUE_S))

    def _refresh_due(self) -> bool:
        return self.followed is not None and self._progress_due_in() <= 0

    def _full_pass(self, children: Children) -> None:
        self.passes += 1
        started = time.perf_counter()
        try:
            wait = self.reconcile_once(children)
            if self.failures:
                self._clear_error()
            self.failures = 0
        except Exception as e:
            log.exception("reconcile of %s/%s failed", self.namespace, self.name)
            self.job = None
            wait = ERROR_BACKOFF_S[min(self.failures, len(ERROR_BACKOFF_S) - 1)]
            self.failures += 1
            try:
                self._record_error(e)
            except Exception:
                log.exception("could not record the error in %s/%s status", self.namespace, self.name)
        self.next_pass = self.clock() + wait
        observe_pass(time.perf_counter() - started, failed=self.failures > 0)

    # -- the pass -------------------------------------------------------------------------------------------------
    def reconcile_once(self, children: Children) -> float:
        """One full pass. Returns seconds until the next one unless something wakes the loop earlier."""
        for fresh in (self.job is None, True):
            wait, planned = self._plan(children)
            # A pass from the loop's copy acts (creates, deletes, a new phase) only on a fresh read: another
            # writer (a second operator, a stuck old replica) may have moved the job on since that copy
            # (tests/faults: two operators racing). The first pass (kopf's body, a new job) creates at once.
            if fresh or planned is None or not planned.acts() or self.passes <= 1:
                break
            self.job = None
        return wait if planned is None else self._apply(planned)

    def _plan(self, children: Children) -> tuple[float, _Planned | None]:
        """The job (the loop's copy, or read fresh) and the plan for it; (seconds, None) when there is nothing
        to apply."""
        ns, name = self.key
        raw = self.job
        if raw is None:
            raw = self.job = lean(self.api.get_job(ns, name))
            self.job_at = self.clock()
        if raw is None or (self.uid or raw["metadata"].get("uid")) != raw["metadata"].get("uid"):
            self.gone, self.followed, self.job = True, None, None
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
        seen = {**children.objects, **self.made}
        # The Workload named like the job (Names.workload), from the Workload index: queued or not (a job whose
        # queueName was removed deletes its own). No request: its watch events wake the loop.
        wl = next((w for w in children.workloads if w["metadata"]["name"] == name), None)
        bare = Observed(pods, seen, now, workload=wl, mislabelled=children.mislabelled)
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
            prog = self._read_progress(
                rank0_log_source(job, old_status.get("phase")), old_status, force=_rank0_finished(job, pods)
            )
        # An admitted Workload's flavors, read each pass (a GET each): their nodeLabels and tolerations go onto
        # the pods; one that cannot be read (None) is left out and reconcile waits for it.
        flavors = {f: obj for f in admitted_flavors(wl) if (obj := self.api.get_resource_flavor(f)) is not None}
        observed = dataclasses.replace(bare, progress=prog, ssh_keys=_key_maker(name), flavors=flavors)
        try:
            plan = reconcile(job, observed, self.config)
        except _KeysFailed as e:
            raise (e.__cause__ or e) from None  # not the spec's doing: backed off and retried like an API error
        except Exception as e:
            # reconcile and the builders are pure: what raised is the spec's content, and would raise again.
            return self._wind_down(raw, bare, self._pure_error(e))
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
        self._intend(raw, plan.status)
        try:
            patched, created = apply(self.api, job, old_status, plan)
        except Refused as e:
            # No retry: the job ends here; the next pass (terminal phase) removes any pod this one created.
            status, msg = failed_status(plan.status, e, now)
            self.job = None
            self.api.patch_status(ns, name, plan.status, status)  # apply() saved plan.status first
            self.api.event(raw, "Warning", "InvalidSpec", msg)
            TRANSITIONS.labels(phase="Failed", reason="InvalidSpec").inc()
            count_failure(ns, old_status, status)
            self.followed = None
            return IDLE_REQUEUE_S
        # apply() returned, so every create succeeded or met a 409 on an object this job controls.
        self._remember(patched, old_status != plan.status and not plan.delete_job, raw)
        uid = str(job["metadata"].get("uid"))
        made = [o for o in plan.create if o["kind"] in UNWATCHED_KINDS]
        self.made.update({f"{o['kind']}/{o['metadata']['name']}": uid for o in made})
        at = self.clock()
        # Only what was made now: an object that existed already is shown by the index, or soon will be (a
        # 409 read-back restores the labels it is watched by), and a Workload taken from the plan's own copy
        # would read as not admitted.
        self.created.update(
            {
                f"{o['kind']}/{o['metadata']['name']}": (
                    slim_workload(o) if o["kind"] == "Workload" else slim_child(o),
                    at,
                )
                for o in created
                if o["kind"] not in UNWATCHED_KINDS
            }
        )
        RECONCILES.inc()
        following = plan.status.get("phase") in FOLLOWED and not plan.delete_job
        self.followed = Followed.of(job, plan.status) if following else None
        self._export_progress(plan.status if following else None)
        if plan.delete_job:
            return IDLE_REQUEUE_S
        if plan.requeue_after is not None:
            return min(IDLE_REQUEUE_S, max(0.5, plan.requeue_after))
        if plan.status.get("phase") in FINISHED and not plan.create and not plan.delete_pods:
            return math.inf  # no work for a finished job until a watch event brings some
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
        new = {**status, "progress": prog}
        self._intend(followed.ident, new)
        patched = self.api.patch_status(self.namespace, self.name, status, new)  # sends only the changed key
        self._remember(patched, True, None)
        self.followed = dataclasses.replace(followed, status=new)
        self._export_progress(new)

    def _export_progress(self, status: Mapping[str, Any] | None) -> None:
        """The job's Prometheus gauges follow status.progress while it trains; any other phase clears them."""
        if status is not None and status.get("progress"):
            set_job_progress(self.namespace, self.name, status["progress"])
        else:
            clear_job(self.namespace, self.name)

    def _read_progress(
        self, source: tuple[str, str], status: Mapping[str, Any], force: bool = False
    ) -> dict[str, Any] | None:
        """Rank 0's newest progress folded onto status.progress, or None when it is not time to read again (every
        PROGRESS_EVERY_S, unless `force`) or the log has no progress yet."""
        if not force and self._progress_due_in() > 0:
            return None
        self.progress_read_at = self.clock()  # before the read: a failing read must not be retried at once
        text = self.api.log_tail(self.namespace, *source)
        return progress.from_text(text, status.get("progress")) if text else None

    # -- reconcile errors in the job's status -------------------------------------------------------------------
    def _record_error(self, err: Exception) -> None:
        """A reconcile error shows in the job's status, not only in the operator's log."""
        RECONCILE_ERRORS.inc()
        raw = self.api.get_job(self.namespace, self.name)
        if raw is None:
            return
        old = dict(raw.get("status") or {})
        new = copy.deepcopy(old)  # set_condition edits conditions in place: old must stay what the API holds
        msg = f"reconcile error: {err}"
        new["message"] = msg[:2000]
        set_condition(new, "ReconcileError", True, type(err).__name__, msg[:2000], self.now())
        self.job = None
        self.api.patch_status(self.namespace, self.name, old, new)
        self.api.event(raw, "Warning", "ReconcileError", msg)

    def _clear_error(self) -> None:
        raw = self.api.get_job(self.namespace, self.name)
        if raw is None:
            return
        old = dict(raw.get("status") or {})
        new = copy.deepcopy(old)  # set_condition edits conditions in place: old must stay what the API holds
        set_condition(new, "ReconcileError", False, "Recovered", "reconciled successfully", self.now())
        self.job = None
        self.api.patch_status(self.namespace, self.name, old, new)


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
