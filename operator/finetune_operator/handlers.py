"""kopf decorators and wiring only: the watches and indexes, and one daemon per FineTuneJob that runs the job's
`controller.JobLoop`. The loops are registered in kopf's memo (`memo.loops`, shared by every object's memo),
so watch events on a job or its pods wake that job's loop; the operator's configuration is `memo.config`."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from . import constants as c
from .controller import Children, JobLoop, Loops, network_policies
from .k8s import Kube
from .metrics import start_metrics_server
from .reconcile import controller_uid

# Every object the operator makes carries this label; its watches ask the API server for these only.
_OURS = {c.LABEL_MANAGED_BY: c.MANAGED_BY}


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


@kopf.index("pods", id="job_pods", labels=_OURS)
def job_pods(body: kopf.Body, labels: Mapping[str, str], namespace: str | None, **_: Any) -> Any:
    """(namespace, job) -> its pods, kept current by the pod watch: a pass reads them here, not by a LIST.

    The index can lag behind the operator's own writes by one watch event; reconcile tolerates that: a pod it
    just created and does not see yet is created again and the 409 read back as its own; a pod it just
    deleted and still sees belongs to an older attempt or is deleted again (404 ignored). The job itself is
    always read fresh, so restarts are never counted twice."""
    return {(namespace or "", labels.get(c.LABEL_JOB_NAME, "")): copy.deepcopy(dict(body))}


# The other children, by (namespace, job) -> ("Kind/name", uid of its controller owner), so a full pass makes no
# LIST at all and reconcile can tell the job's own objects from foreign ones that merely carry its labels. Each
# kind's watch is filtered server-side (see _configure). NetworkPolicies are indexed only when the operator makes
# them (run_operator): otherwise its RBAC cannot watch them. Secrets are not watched at all, so the operator
# needs no cluster-wide list/watch on Secrets: the one Secret it makes (an MPI job's SSH identity) is created
# once per loop and a 409 read back by name (controller.JobLoop.made).
_CHILD_INDEXES = {"services": "Service", "configmaps": "ConfigMap"}
_POLICY_INDEX = ("networkpolicies", "NetworkPolicy")


def _child_indexer(kind: str) -> Any:
    def index(body: kopf.Body, name: str, labels: Mapping[str, str], namespace: str | None, **_: Any) -> Any:
        return {(namespace or "", labels.get(c.LABEL_JOB_NAME, "")): (f"{kind}/{name}", controller_uid(body))}

    return index


def _wake_on_delete(type: str | None, labels: Mapping[str, str], namespace: str | None, memo: kopf.Memo,
                    **_: Any) -> None:
    """A child (or a foreign object holding a child's name) went away: the job may create it now."""
    if type == "DELETED":
        memo.loops.wake(namespace, labels.get(c.LABEL_JOB_NAME))


for _plural, _kind in _CHILD_INDEXES.items():
    kopf.index(_plural, id=f"job_{_plural}", labels=_OURS)(_child_indexer(_kind))
    kopf.on.event(_plural, id=f"wake_{_plural}", labels=_OURS)(_wake_on_delete)


@kopf.on.event("pods", labels=_OURS)
def _pod_event(labels: Mapping[str, str], namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.wake(namespace, labels.get(c.LABEL_JOB_NAME))


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
def _job_event(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.wake(namespace, name)


# Why a job's children always come from the indexes, never from a LIST: kopf passes every registered index to
# every handler as a keyword argument named by its id (kopf docs, "Indexing"). The pod, Service, ConfigMap and
# Secret indexes are registered above, at import, and the NetworkPolicy index in run_operator() before
# kopf.run() whenever the daemon reads it. So the daemon reads them with `kwargs[id]`: a missing index would
# be a KeyError at once, not a silent fallback (tests/unit/test_controller.py checks the registrations).
def _index_ids(config: Mapping[str, Any]) -> list[str]:
    """The ids of the indexes the job daemon reads: pods first, then the other children's."""
    plurals = ["pods", *_CHILD_INDEXES, *([_POLICY_INDEX[0]] if network_policies(config) else [])]
    return [f"job_{plural}" for plural in plurals]


@kopf.daemon(c.GROUP, c.VERSION, c.PLURAL, cancellation_timeout=10.0)
async def job_daemon(name: str, namespace: str | None, stopped: kopf.DaemonStopped, memo: kopf.Memo,
                     **kwargs: Any) -> None:
    key = (namespace or "default", name)
    config: Mapping[str, Any] = memo.config
    pods, *others = (kwargs[i] for i in _index_ids(config))

    def children() -> Children:
        return list(pods.get(key, [])), dict(v for index in others for v in index.get(key, []))

    loops: Loops = memo.loops
    with loops.running(JobLoop(*key, Kube(), config)) as loop:
        await loop.run(lambda: bool(stopped), children)


def run_operator(
    *, namespaces: list[str], config: dict[str, Any], metrics_port: int, health_port: int, verbose: bool
) -> int:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if metrics_port:
        start_metrics_server(metrics_port)
    if network_policies(config):
        plural, kind = _POLICY_INDEX
        kopf.index("networking.k8s.io", "v1", plural, id=f"job_{plural}", labels=_OURS)(_child_indexer(kind))
        kopf.on.event("networking.k8s.io", "v1", plural, id=f"wake_{plural}", labels=_OURS)(_wake_on_delete)
    kopf.configure(verbose=verbose)
    kopf.run(
        memo=kopf.Memo(config=config, loops=Loops()),
        standalone=True,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
    )
    return 0


__all__ = ["job_daemon", "run_operator"]
