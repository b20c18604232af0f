"""kopf wiring only. One daemon per FineTuneJob runs the level-triggered loop: read the job and its children,
`reconcile()`, apply the plan, sleep until a watch event on the job or one of its pods wakes it (or a timer
fires for deadlines, TTLs and progress refreshes)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from . import constants as c
from . import progress
from .admission import validate
from .api.validation import InvalidSpec
from .builders.layout import launcher_of
from .builders.names import Names
from .k8s import Kube
from .metrics import RECONCILE_ERRORS, RECONCILES, TRANSITIONS, start_metrics_server
from .reconcile import Observed, Plan, iso, reconcile, set_condition
from .sshkeys import generate_keys

log = logging.getLogger("finetune_operator")

# A full pass (GET the job; children come from the watch-fed indexes) runs when a watch event on the job or
# one of its pods wakes the daemon, and at least this often as a safety net for what wakes nothing (a child
# Service deleted by hand).
IDLE_REQUEUE_S = 30.0
# While training, rank 0's log is read this often; between full passes that is the only request, plus a
# status patch when the progress changed (benchmarks/README.md: requests per job per minute).
PROGRESS_EVERY_S = 10.0
_FOLLOWED = ("Running", "Precompiling")  # phases whose progress is read from rank 0's log
ERROR_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)

_config: dict[str, Any] = {}
_wakers: dict[tuple[str, str], asyncio.Event] = {}
_progress_read_at: dict[tuple[str, str], float] = {}
# Jobs whose progress is being followed: the job and the status this daemon last wrote (it is the only writer
# of the status, so this is what the API holds).
_training: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}

# Every object the operator makes carries this label; its watches ask the API server for these only.
_OURS = {c.LABEL_MANAGED_BY: c.MANAGED_BY}


def _network_policies(config: Mapping[str, Any]) -> bool:
    """Whether the operator makes (and so may read and watch) a NetworkPolicy per job."""
    return bool((config.get("networkPolicy") or {}).get("enabled"))


def _wake(namespace: str | None, name: str | None) -> None:
    ev = _wakers.get((namespace or "", name or ""))
    if ev is not None:
        ev.set()


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # we post our own events with reasons of our own
    # Server-side: the API server streams only our objects. A handler's `labels=` filter alone is applied by
    # kopf after receiving every object of the kind in the cluster (or in the watched namespaces).
    for plural in ("pods", *_CHILD_INDEXES, _POLICY_INDEX[0]):
        settings.watching.label_selectors[plural] = ",".join(f"{k}={v}" for k, v in _OURS.items())
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300


@kopf.index("pods", labels=_OURS)
def job_pods(body: kopf.Body, labels: Mapping[str, str], namespace: str | None, **_: Any) -> Any:
    """(namespace, job) -> its pods, kept current by the pod watch: a pass reads them here, not by a LIST.

    The index can lag behind the operator's own writes by one watch event; reconcile tolerates that: a pod it
    just created and does not see yet is created again and the 409 read back as its own; a pod it just
    deleted and still sees belongs to an older attempt or is deleted again (404 ignored). The job itself is
    always read fresh, so restarts are never counted twice."""
    return {(namespace or "", labels.get(c.LABEL_JOB_NAME, "")): copy.deepcopy(dict(body))}


# The other children, by (namespace, job) -> "Kind/name", so a full pass makes no LIST at all. Each kind's
# watch is filtered server-side (see _configure), or kopf would stream every Secret of the cluster.
# NetworkPolicies are indexed only when the operator makes them (run_operator): otherwise its RBAC cannot
# watch them.
_CHILD_INDEXES = {"services": "Service", "configmaps": "ConfigMap", "secrets": "Secret"}
_POLICY_INDEX = ("networkpolicies", "NetworkPolicy")


def _child_indexer(kind: str) -> Any:
    def index(name: str, labels: Mapping[str, str], namespace: str | None, **_: Any) -> Any:
        return {(namespace or "", labels.get(c.LABEL_JOB_NAME, "")): f"{kind}/{name}"}

    return index


for _plural, _kind in _CHILD_INDEXES.items():
    kopf.index(_plural, id=f"job_{_plural}", labels=_OURS)(_child_indexer(_kind))


@kopf.on.event("pods", labels=_OURS)
def _pod_event(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
    _wake(namespace, labels.get(c.LABEL_JOB_NAME))


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
def _job_event(name: str, namespace: str | None, **_: Any) -> None:
    _wake(namespace, name)


def _rank0_log_source(job: dict[str, Any], phase: str | None) -> tuple[str, str]:
    """(pod, container) whose stdout carries global rank 0's progress lines."""
    launcher = launcher_of(job["spec"])
    names = Names.of(job, launcher)
    if launcher == "mpi":
        pod, main = names.launcher, c.CONTAINER_LAUNCHER
    else:
        pod, main = names.rank_pod(0), c.CONTAINER_TRAINER
    return pod, c.INIT_PRECOMPILE if phase == "Precompiling" else main


def _read_progress(kube: Kube, key: tuple[str, str], job: dict[str, Any],
                   status: Mapping[str, Any]) -> dict[str, Any] | None:
    """Rank 0's newest progress folded onto status.progress, or None when it is not time to read again (every
    PROGRESS_EVERY_S) or the log has no progress yet."""
    if time.monotonic() - _progress_read_at.get(key, 0) < PROGRESS_EVERY_S:
        return None
    _progress_read_at[key] = time.monotonic()  # before the read: a failing read must not be retried at once
    text = kube.log_tail(key[0], *_rank0_log_source(job, status.get("phase")))
    return progress.from_text(text, status.get("progress")) if text else None


def reconcile_once(kube: Kube, namespace: str, name: str, pods: list[dict[str, Any]] | None = None,
                   objects: frozenset[str] | None = None) -> float:
    """One pass for one job. Returns seconds until the next pass unless something wakes it earlier.
    `pods` and `objects` ("Kind/name" of the other children): from the watch-fed indexes; None lists them."""
    raw = kube.get_job(namespace, name)
    if raw is None or raw["metadata"].get("deletionTimestamp"):
        return IDLE_REQUEUE_S
    old_status = dict(raw.get("status") or {})
    now = datetime.now(UTC).replace(tzinfo=None)
    try:
        job = validate(raw)
    except InvalidSpec as e:
        # Admission normally rejects these; a job stored before a CRD upgrade can still be invalid.
        status = copy.deepcopy(old_status)
        if status.get("phase") != "Failed":
            msg = "invalid spec: " + "; ".join(str(x) for x in e.errors)
            status.update(phase="Failed", reason="InvalidSpec", message=msg, completionTime=iso(now))
            set_condition(status, "Failed", True, "InvalidSpec", msg, now)
            kube.event(raw, "Warning", "InvalidSpec", msg)
            kube.patch_status(namespace, name, old_status, status)
        return IDLE_REQUEUE_S
    job["status"] = raw.get("status") or {}

    if pods is None:
        pods = kube.list_pods(namespace, name)
    if objects is None:
        objects = kube.list_other_children(namespace, name, network_policies=_network_policies(_config))
    key = (namespace, name)
    prog = _read_progress(kube, key, job, old_status) if old_status.get("phase") in _FOLLOWED else None
    plan = reconcile(job, Observed(pods, objects, now, prog, functools.partial(generate_keys, name)), _config)
    apply(kube, job, old_status, plan)
    RECONCILES.inc()
    if plan.status.get("phase") in _FOLLOWED and not plan.delete_job:
        _training[key] = (job, plan.status)
    else:
        _training.pop(key, None)
    if plan.delete_job:
        return IDLE_REQUEUE_S
    wait = IDLE_REQUEUE_S
    if plan.requeue_after is not None:
        wait = min(wait, max(0.5, plan.requeue_after))
    return wait


def refresh_progress(kube: Kube, namespace: str, name: str) -> None:
    """Between full passes: read rank 0's log tail and patch status.progress alone when it changed."""
    key = (namespace, name)
    followed = _training.get(key)
    if followed is None:
        return
    job, status = followed
    prog = _read_progress(kube, key, job, status)
    if prog is None or prog == status.get("progress"):
        return
    new = {**status, "progress": prog}
    kube.patch_status(namespace, name, status, new)  # sends only the changed key: progress
    _training[key] = (job, new)


def apply(kube: Kube, job: dict[str, Any], old_status: dict[str, Any], plan: Plan) -> None:
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    if plan.delete_job:
        kube.event(job, "Normal", "TTLExpired", "ttlSecondsAfterFinished elapsed: deleting the job and its children")
        kube.delete_job(ns, name)
        return
    for pod in plan.delete_pods:
        kube.delete_pod(ns, pod)
    for obj in plan.create:
        kube.create(obj)
    kube.patch_status(ns, name, old_status, plan.status)
    for etype, reason, message in plan.events:
        kube.event(job, etype, reason, message)
    for _, reason, _ in plan.events:
        TRANSITIONS.labels(phase=plan.status.get("phase", "Pending"), reason=reason).inc()


def _record_error(kube: Kube, namespace: str, name: str, err: Exception) -> None:
    """A reconcile error shows in the job's status, not only in the operator's log."""
    RECONCILE_ERRORS.inc()
    raw = kube.get_job(namespace, name)
    if raw is None:
        return
    old = dict(raw.get("status") or {})
    new = copy.deepcopy(old)  # set_condition edits conditions in place: old must stay what the API holds
    msg = f"reconcile error: {err}"
    new["message"] = msg[:2000]
    now = datetime.now(UTC).replace(tzinfo=None)
    set_condition(new, "ReconcileError", True, type(err).__name__, msg[:2000], now)
    kube.patch_status(namespace, name, old, new)
    kube.event(raw, "Warning", "ReconcileError", msg)


@kopf.daemon(c.GROUP, c.VERSION, c.PLURAL, cancellation_timeout=10.0)
async def job_daemon(name: str, namespace: str | None, stopped: kopf.DaemonStopped,
                     job_pods: kopf.Index[Any, Any] | None = None, **kwargs: Any) -> None:
    namespace = namespace or "default"
    key = (namespace, name)
    wake = _wakers.setdefault(key, asyncio.Event())
    kube = Kube()
    loop = asyncio.get_running_loop()
    failures = 0
    next_pass = 0.0  # monotonic time of the next full pass; a wake event brings it forward
    try:
        while not stopped:
            if wake.is_set() or time.monotonic() >= next_pass:
                wake.clear()  # before the pass: an event during it triggers another
                # Copied here, on the event loop that updates the index, not in the worker thread.
                pods = None if job_pods is None else list(job_pods.get(key, []))
                objects = _indexed_children(kwargs, key)
                try:
                    wait = await loop.run_in_executor(None, reconcile_once, kube, namespace, name, pods, objects)
                    if failures:
                        await loop.run_in_executor(None, _clear_error, kube, namespace, name)
                    failures = 0
                except Exception as e:
                    log.exception("reconcile of %s/%s failed", namespace, name)
                    wait = ERROR_BACKOFF_S[min(failures, len(ERROR_BACKOFF_S) - 1)]
                    failures += 1
                    try:
                        await loop.run_in_executor(None, _record_error, kube, namespace, name, e)
                    except Exception:
                        log.exception("could not record the error in %s/%s status", namespace, name)
                next_pass = time.monotonic() + wait
            elif key in _training:
                try:
                    await loop.run_in_executor(None, refresh_progress, kube, namespace, name)
                except Exception:
                    # Progress is best effort; the next full pass reports API errors in the job's status.
                    log.exception("progress refresh of %s/%s failed", namespace, name)
            if failures:
                # Back off for real: a failing pass patches the job's status, whose watch event would
                # otherwise wake the next pass at once.
                await asyncio.sleep(max(0.0, next_pass - time.monotonic()))
                continue
            sleep = next_pass - time.monotonic()
            if key in _training:
                sleep = min(sleep, PROGRESS_EVERY_S - (time.monotonic() - _progress_read_at.get(key, 0)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=max(0.0, sleep))
    finally:
        _wakers.pop(key, None)
        _progress_read_at.pop(key, None)
        _training.pop(key, None)


def _indexed_children(kwargs: Mapping[str, Any], key: tuple[str, str]) -> frozenset[str] | None:
    """The job's non-pod children from the indexes, or None (list them) when an index is not there."""
    ids = [f"job_{p}" for p in _CHILD_INDEXES]
    if _network_policies(_config):
        ids.append(f"job_{_POLICY_INDEX[0]}")
    if not all(i in kwargs for i in ids):
        return None
    return frozenset(v for i in ids for v in kwargs[i].get(key, []))


def _clear_error(kube: Kube, namespace: str, name: str) -> None:
    raw = kube.get_job(namespace, name)
    if raw is None:
        return
    old = dict(raw.get("status") or {})
    new = copy.deepcopy(old)  # set_condition edits conditions in place: old must stay what the API holds
    now = datetime.now(UTC).replace(tzinfo=None)
    set_condition(new, "ReconcileError", False, "Recovered", "reconciled successfully", now)
    kube.patch_status(namespace, name, old, new)


def run_operator(
    *, namespaces: list[str], config: dict[str, Any], metrics_port: int, health_port: int, verbose: bool
) -> int:
    _config.clear()
    _config.update(config)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if metrics_port:
        start_metrics_server(metrics_port)
    if _network_policies(config):
        plural, kind = _POLICY_INDEX
        kopf.index("networking.k8s.io", "v1", plural, id=f"job_{plural}", labels=_OURS)(_child_indexer(kind))
    kopf.configure(verbose=verbose)
    kopf.run(
        standalone=True,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
    )
    return 0


__all__ = ["job_daemon", "reconcile_once", "refresh_progress", "run_operator"]
