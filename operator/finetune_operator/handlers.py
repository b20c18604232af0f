"""kopf decorators and wiring only: the watches and indexes, and one daemon per FineTuneJob that runs the job's
`controller.JobLoop`. The loops are registered in kopf's memo (`memo.loops`, shared by every object's memo),
so watch events on a job or its pods wake that job's loop; the operator's configuration is `memo.config`."""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from . import constants as c
from .controller import QUEUED_POLL_S, Children, JobLoop, Loops, network_policies
from .disruptions import node_name, slim_node
from .k8s import Kube, load_client_config, shared_client
from .leader import Elector, Settings
from .metrics import LEADER, start_metrics_server
from .reconcile import controller_uid, slim_child, slim_workload

log = logging.getLogger("finetune_operator")

# Every object the operator makes carries this label; its watches ask the API server for these only.
_OURS = {c.LABEL_MANAGED_BY: c.MANAGED_BY}
_SELECTOR = ",".join(f"{k}={v}" for k, v in _OURS.items())


def _job_keys(body: Mapping[str, Any], labels: Mapping[str, str], namespace: str | None) -> list[tuple[str, str]]:
    """The (namespace, job) keys a child is indexed and routed under: the FineTuneJob its controller owner
    reference names, so that a child whose job-name label someone edited is still found by its job (reconcile
    then checks the owner's uid, and puts the label back), and the job its job-name label names, whose loop
    reports it as foreign unless it controls it."""
    ns = namespace or ""
    keys = []
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == c.KIND and str(ref.get("apiVersion", "")).startswith(c.GROUP):
            keys.append((ns, str(ref.get("name"))))
    label = labels.get(c.LABEL_JOB_NAME)
    if label is not None and (ns, label) not in keys:
        keys.append((ns, label))
    return keys


class GenerationOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds an "essence" of every watched object on every watch event (a deep copy of its body less
    metadata and status) to diff it for on.create/on.update/on.resume handlers and to reset idle daemons. This
    operator has neither kind (it is level-triggered: every pass starts from the whole job), so that copy of
    every pod and job on every event was pure cost, a large share of the operator's CPU while jobs start
    (docs/operator.md, "CPU per watch event"). The essence here is the object's generation, which changes with
    its spec, and is never stored. tests/unit/test_controller.py fails if a change handler is ever registered,
    since it would see no real diff."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {"generation": body.get("metadata", {}).get("generation")})


# kopf runs one worker task per watched object while its events come in, and lets it go after this many idle
# seconds (kopf's default 5). At 5 s, a burst of new jobs kept a worker for every job, pod, Service and ConfigMap
# alive at once, their tasks, queues and frames spread over pymalloc arenas that a few survivors then pinned: a
# higher peak RSS, kept after every job was deleted, for no less CPU per job (docs/operator.md, "Known limits",
# has the numbers). A worker that expires early costs only a new task at the object's next
# event; one awaiting its own patch's consistency stays as long as kopf needs.
WORKER_IDLE_S = 1.0


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = GenerationOnlyDiffBase(prefix=c.GROUP, key="last-handled-configuration")
    settings.posting.enabled = False  # we post our own events with reasons of our own
    # Server-side: the API server streams only our objects. A handler's `labels=` filter alone is applied by
    # kopf after receiving every object of the kind in the cluster (or in the watched namespaces).
    for plural in ("pods", *_CHILD_INDEXES, _POLICY_INDEX[0]):
        settings.watching.label_selectors[plural] = _SELECTOR
    settings.watching.label_selectors[c.KUEUE_GROUP, c.KUEUE_WORKLOADS] = _SELECTOR
    settings.queueing.idle_timeout = WORKER_IDLE_S
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300


# Every handler below is `async` although none awaits anything: kopf runs a plain function in a worker thread,
# one thread hop per watch event per handler, which was the largest single cost of an event (benchmarks/README.md).


@kopf.index("pods", id="job_pods", labels=_OURS)
async def job_pods(body: kopf.Body, labels: Mapping[str, str], namespace: str | None, **_: Any) -> Any:
    """(namespace, job) -> its pods, kept current by the pod watch: a pass reads them here, not by a LIST. Each
    entry is `reconcile.slim_child` of the pod: the fields reconcile reads, not the whole body. A pod is listed
    under its controller owner's job and under the job its job-name label names (`_job_keys`).

    A pod whose managed-by label someone edits leaves the watch (the API server ends a label-selected watch of
    an object that stops matching with a DELETED event). Its job then misses it and creates it again: the 409
    is read back as the job's own and its labels are put back (k8s.Kube.create), and it re-enters the watch.

    The index can lag behind the operator's own writes by one watch event; the job's loop covers for it: a pod
    it just created and the index does not show yet counts as existing (expectations.py), and one created again
    anyway meets a 409 that is read back as its own; a pod it just deleted and still sees belongs to an older
    attempt or is deleted again (404 ignored). The status the loop works from is what the API answered to its
    own last write, or a fresh read, so restarts are never counted twice."""
    slim = slim_child(body)
    return dict.fromkeys(_job_keys(body, labels, namespace), slim)


# The other children, by (namespace, job) -> ("Kind/name", uid of its controller owner, None or, when the key is
# its owner's but its job-name label names another job, (its uid, its labels) for reconcile to put them back), so
# a full pass makes no LIST at all and reconcile can tell the job's own objects from foreign ones that merely
# carry its labels. Each kind's watch is filtered server-side (see _configure). NetworkPolicies are indexed only
# when the operator makes them (run_operator): otherwise its RBAC cannot watch them. Secrets are not watched at
# all, so the operator needs no cluster-wide list/watch on Secrets: the one Secret it makes (an MPI job's SSH
# identity) is created once per loop and a 409 read back by name (expectations.Expectations.made).
_CHILD_INDEXES = {"services": "Service", "configmaps": "ConfigMap"}
_POLICY_INDEX = ("networkpolicies", "NetworkPolicy")


def _child_indexer(kind: str) -> Any:
    async def index(body: kopf.Body, name: str, labels: Mapping[str, str], namespace: str | None, **_: Any) -> Any:
        ref, owner, label = f"{kind}/{name}", controller_uid(body), labels.get(c.LABEL_JOB_NAME)
        meta = body.get("metadata") or {}
        wrong = (str(meta.get("uid")), dict(labels))
        return {key: (ref, owner, None if key[1] == label else wrong) for key in _job_keys(body, labels, namespace)}

    return index


def _on_child(kind: str, wake_on: tuple[str, ...] = ("DELETED",)) -> Any:
    async def event(
        type: str | None,
        body: kopf.Body,
        name: str,
        labels: Mapping[str, str],
        namespace: str | None,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        """The index now shows the child; a deletion (of it, or of a foreign object holding a child's name, or
        its managed-by label edited so that the watch lost it) wakes the job, which may create it now, and so
        does its job-name label naming another job than its owner (reconcile puts it back)."""
        label = labels.get(c.LABEL_JOB_NAME)
        for key in _job_keys(body, labels, namespace):
            loop = memo.loops.get(*key)
            if loop is not None:
                wake = type in wake_on or "*" in wake_on or key[1] != label
                loop.child_event(f"{kind}/{name}", wake=wake)

    return event


for _plural, _kind in _CHILD_INDEXES.items():
    kopf.index(_plural, id=f"job_{_plural}", labels=_OURS)(_child_indexer(_kind))
    kopf.on.event(_plural, id=f"wake_{_plural}", labels=_OURS)(_on_child(_kind))


kopf.on.event("pods", id="wake_pods", labels=_OURS)(_on_child("Pod", wake_on=("*",)))


# Kueue Workloads (spec.runPolicy.queueName), indexed like the pods: (namespace, job) -> reconcile.slim_workload,
# and every event on one wakes its job, so an admission or an eviction is acted on at once and a queued job costs
# no request while nothing changes. Registered by run_operator() only when the API serves Workloads as the operator
# starts. Not unconditionally: kopf resolves a resource through discovery at start and again on a CRD's events,
# and when Kueue is installed later its last CRD event can come before discovery lists Workloads, after which
# kopf never watches them (seen here: tests/controlplane/test_kueue.py). Without the watch each queued job reads
# its Workload (JobLoop, poll_workloads); restarting the operator after installing Kueue turns the watch on.
async def job_workloads(body: kopf.Body, labels: Mapping[str, str], namespace: str | None, **_: Any) -> Any:
    slim = slim_workload(body)
    return dict.fromkeys(_job_keys(body, labels, namespace), slim)


def workloads_served() -> bool:
    """Whether the API serves Kueue's Workloads as the operator starts (a discovery GET, before kopf logs in)."""
    load_client_config()
    return Kube(shared_client()).workloads_served()


def watch_workloads() -> None:
    kopf.index(c.KUEUE_GROUP, c.KUEUE_VERSION, c.KUEUE_WORKLOADS, id="job_workloads", labels=_OURS)(job_workloads)
    kopf.on.event(c.KUEUE_GROUP, c.KUEUE_VERSION, c.KUEUE_WORKLOADS, id="wake_workloads", labels=_OURS)(
        _on_child("Workload", wake_on=("*",))
    )


# Nodes, for node loss (runPolicy.nodeLossSeconds; docs/operator.md, "Node loss"): node name -> its Ready state
# (disruptions.slim_node). Every Node is watched, unfiltered (the nodes are not the operator's): a cluster-scoped
# list/watch, in both modes. A change of a node's Ready state or cordon wakes the jobs with a pod on it; a job's pass
# reads the states of its pods' nodes from here, with no request.
@kopf.index("nodes", id="node_health")
async def node_health(body: kopf.Body, name: str, **_: Any) -> Any:
    return {name: slim_node(body)}


@kopf.on.event("nodes", id="wake_nodes")
async def _node_event(type: str | None, body: kopf.Body, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """Wakes the loops of the jobs with a pod on this node when its Ready state or cordon changed (most Node
    events are the kubelet's periodic status reports, which change neither)."""
    health = None if type == "DELETED" else slim_node(body)
    if "health" in memo and memo["health"] == health:  # the node's own memo: what its last event said
        return
    memo["health"] = health
    pods: kopf.Index[tuple[str, str], dict[str, Any]] = kwargs["job_pods"]
    for key in pods:
        if any(node_name(pod) == name for pod in pods.get(key, [])):
            memo.loops.wake(*key)


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
async def _job_event(
    type: str | None, body: kopf.Body, name: str, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    drop_managed_fields(body)
    loop = memo.loops.get(namespace or "", name)
    if loop is not None:
        loop.job_event(body, deleted=type == "DELETED")


def drop_managed_fields(body: kopf.Body) -> None:
    """Removes metadata.managedFields from kopf's own copy of a job, the one it keeps for the job's daemon until
    the next watch event replaces it. Server-side field tracking lists every field of the spec and status once
    more, most of a job body's memory (docs/operator.md, "Known limits"). Neither
    kopf nor this operator reads them; `body["metadata"]` is the decoded watch event's own dict, which kopf
    never writes back (its patches are built apart from the body)."""
    meta = body.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)


# Why a job's children always come from the indexes, never from a LIST: kopf passes every registered index to
# every handler as a keyword argument named by its id (kopf docs, "Indexing"). The pod, Service, ConfigMap and
# Secret indexes are registered above, at import, and the NetworkPolicy index in run_operator() before
# kopf.run() whenever the daemon reads it. So the daemon reads them with `kwargs[id]`: a missing index would
# be a KeyError at once, not a silent fallback (tests/unit/test_controller.py checks the registrations).
def _index_ids(config: Mapping[str, Any], workloads: bool = True) -> list[str]:
    """The ids of the indexes the job daemon reads: pods first, Workloads second (when watched), then the other
    children's."""
    plurals = [
        "pods",
        *([c.KUEUE_WORKLOADS] if workloads else []),
        *_CHILD_INDEXES,
        *([_POLICY_INDEX[0]] if network_policies(config) else []),
    ]
    return [f"job_{plural}" for plural in plurals]


async def job_daemon(
    name: str, namespace: str | None, body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **kwargs: Any
) -> None:
    key = (namespace or "default", name)
    config: Mapping[str, Any] = memo.config
    polled = bool(memo.get("poll_workloads"))
    pods, *others = (kwargs[i] for i in _index_ids(config, workloads=not polled))
    workloads: Mapping[Any, Any] = {} if polled else others.pop(0)
    nodes = kwargs["node_health"]

    def children() -> Children:
        objects: dict[str, str | None] = {}
        mislabelled: dict[str, tuple[str, dict[str, str]]] = {}
        for index in others:
            for ref, owner, wrong in index.get(key, []):
                objects[ref] = owner
                if wrong is not None:
                    mislabelled[ref] = wrong
        mine = list(pods.get(key, []))
        health = {n: next(iter(nodes[n])) for p in mine if (n := node_name(p)) is not None and n in nodes}
        return Children(mine, objects, list(workloads.get(key, [])), mislabelled, health)

    loops: Loops = memo.loops
    # The first pass works from kopf's body of the job (as fresh as a read: it came with the watch that started
    # this daemon) and reads it only when a watch event or a timer says so (jobcache.JobCache).
    api = loops.kube(lambda: Kube(shared_client(), guard=memo.get("guard")))
    with loops.running(JobLoop(*key, api, config, body=body, poll_workloads=polled)) as loop:
        await loop.run(lambda: bool(stopped), children)  # returns once the job is gone (JobLoop.gone)


# kopf versions daemon_without_finalizer was tested with. It reaches into kopf's private registry
# (OperatorRegistry._spawning, its handlers' requires_finalizer), which any kopf release may change: on another
# version the operator stops at import with UntestedKopf, rather than run with its daemon lost or a finalizer
# back on every job. To move to a new kopf: add it here, run the unit and control-plane tiers with it, keep it
# only if they pass (tests/unit/test_kopf_patch.py checks the registration itself).
KOPF_TESTED = ("1.45.2",)


class UntestedKopf(RuntimeError):
    """The installed kopf is not one that daemon_without_finalizer was tested with (KOPF_TESTED)."""


def daemon_without_finalizer(
    fn: Callable[..., Any],
    *,
    id: str,
    cancellation_timeout: float,
    registry: kopf.OperatorRegistry | None = None,
    kopf_version: str | None = None,
) -> None:
    """kopf.daemon on FineTuneJobs, into `registry` (kopf's default one unless given), without the finalizer kopf
    puts on every object a daemon runs for. The one place that touches kopf's private registry: the daemon is
    registered in a registry of its own, and its handler copied over with requires_finalizer=False. Raises
    UntestedKopf, before touching any registry, when the installed kopf (or `kopf_version`) is not in KOPF_TESTED."""
    version = kopf_version or importlib.metadata.version("kopf")
    if version not in KOPF_TESTED:
        raise UntestedKopf(
            f"kopf {version} is installed, but this operator was tested with kopf {', '.join(KOPF_TESTED)} only: "
            "finetune_operator.handlers.daemon_without_finalizer patches kopf's private daemon registry "
            f"(OperatorRegistry._spawning). Install a tested one (pip install 'kopf=={KOPF_TESTED[-1]}'), or add "
            "this one to handlers.KOPF_TESTED and keep it only if the unit and control-plane tests pass with it"
        )
    private = kopf.OperatorRegistry()
    kopf.daemon(c.GROUP, c.VERSION, c.PLURAL, id=id, cancellation_timeout=cancellation_timeout, registry=private)(fn)
    target = registry if registry is not None else kopf.get_default_registry()
    for handler in private._spawning.get_all_handlers():
        target._spawning.append(dataclasses.replace(handler, requires_finalizer=False))


def _register_daemon() -> None:
    """The job daemon, without a finalizer (daemon_without_finalizer). The finalizer would only make a deletion
    wait for the daemon to stop; nothing needs to be cleaned up then (the children go by their owner
    references), and it costs a patch of every job when it is created and another when it is deleted. Without it
    the loop ends itself: a deletion's watch event wakes it, and a pass that finds the job gone (or a new job of
    the same name) returns (controller.JobLoop.gone). Jobs that still carry the finalizer from an earlier
    operator lose it at their next event (kopf removes a finalizer nothing requires)."""
    daemon_without_finalizer(job_daemon, id="job_daemon", cancellation_timeout=10.0)


_register_daemon()


def freeze_startup_objects() -> None:
    """Takes every object alive now out of the cyclic garbage collector's scans: the modules, classes and
    functions of kopf, the Kubernetes client and this package, tracked objects that live as long as the process.
    Without it each full collection walked them all again, a cost that grew with the jobs' churn
    (docs/operator.md, "CPU per watch event", has the numbers)."""
    gc.collect()
    gc.freeze()


def run_operator(
    *,
    namespaces: list[str],
    config: dict[str, Any],
    metrics_port: int,
    health_port: int,
    verbose: bool,
    election: Settings | None = None,
) -> int:
    """Runs the operator until it is stopped. With `election`, it first stands by until it holds the Lease
    (leader.py) and starts kopf's watches and the job daemons only then; it exits (leader.EXIT_LEASE_LOST) the
    moment it loses it, and hands the lease over when it is stopped."""
    if metrics_port:
        start_metrics_server(metrics_port)
    if network_policies(config):
        plural, kind = _POLICY_INDEX
        kopf.index("networking.k8s.io", "v1", plural, id=f"job_{plural}", labels=_OURS)(_child_indexer(kind))
        kopf.on.event("networking.k8s.io", "v1", plural, id=f"wake_{plural}", labels=_OURS)(_on_child(kind))
    # One handler on the root logger: kopf's (logging.basicConfig beside it printed every line twice). kopf logs
    # "Handler ... succeeded." at INFO for every watch event of every object, several per pod: at scale that
    # was most of the log and a few % of the CPU. Its warnings and errors still show; --verbose shows all.
    kopf.configure(verbose=verbose)
    if not verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    elector = None
    if election is not None:
        load_client_config()
        elector = Elector(Kube(shared_client()), election)
        elector.acquire(health_port)  # a standby waits here: no watch, no write but its Lease attempts
    LEADER.set(1)
    poll_workloads = not workloads_served()
    if poll_workloads:
        log.warning(
            "Kueue's Workloads (%s/%s) are not served: queued jobs read their Workload every %.0f s; restart the "
            "operator after installing Kueue to watch them instead",
            c.KUEUE_GROUP,
            c.KUEUE_VERSION,
            QUEUED_POLL_S,
        )
    else:
        watch_workloads()
    freeze_startup_objects()
    try:
        kopf.run(
            # kopf's `standalone`: no kopf peering objects; with --leader-elect, the Lease decides who runs.
            memo=kopf.Memo(
                config=config, loops=Loops(), guard=elector.guard if elector else None, poll_workloads=poll_workloads
            ),
            standalone=True,
            namespaces=namespaces,
            clusterwide=not namespaces,
            liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
        )
    finally:
        if elector is not None:
            elector.release()  # kopf has stopped, its daemons with it: a standby may take over at once
    return 0


__all__ = ["job_daemon", "run_operator"]
