"""Operator at scale against a real control plane, next to the raw API server doing the same writes.

    python benchmarks/operator_scale.py --jobs 50 [--json OUT]

Starts its own LocalCluster (tools/cluster: etcd + kube-apiserver + controller-manager + scheduler, no kubelet)
with an audit log that records every request of one user, `bench-operator`, the identity `ftjob operator` runs
as here (bound to the operator's real ClusterRoles from manifests/rbac/rbac.yaml). Then:

1. raw: the children `ftjob render` predicts for N jobs are created straight through the API (the same Python
   client the operator uses, 8 threads): the ceiling for getting these objects into this API server.
2. operator: N FineTuneJobs are created at once; the clock stops for a job when all its children exist.
   Latency per job (p50/p95/max), makespan, and the operator's requests by verb from the audit log.
3. steady: every pod is reported Running (as a kubelet would) and the operator's request rate is measured
   over a window while nothing changes: the per-job cost of keeping jobs watched and their progress fresh.

`--peer` (make bench-peer) measures four systems on the same control plane, interleaved over `--rounds`
rounds (the order rotates each round): raw; the floor, what any operator must pay per job (the FineTuneJob's
create, its children and one status patch, written by the benchmark itself as user `bench-floor`); ours; and
the peer, Kubeflow training-operator v1.8.1's PyTorchJob controller (built from its Go module by tools/cluster,
run as a host process, tools/cluster ftjob_cluster/peer.py) as user `bench-peer` (cluster-admin). Each
operator is started fresh for its turn;
one measurement (`Bench.measure`) serves both: N jobs x 2 ranks, then 1 job x `--wide` ranks; makespan and
per-job p50/p95/max until every pod and Service exists, operator CPU per job, RSS at rest / peak / after
every job is deleted, and requests per job from the audit log. `--readme` writes the table (peer_report.py).

Numbers depend on the machine: compare runs on one machine, never against a fixed threshold.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import peer_report
import procstat
import yaml
from benchio import scratch, write_json
from cluster_support import make_kubectl
from kubernetes import client, config
from operator_support import Kubelet, NodeLogs, install_crd, running_operator

from finetune_operator.admission import validate
from finetune_operator.builders import desired
from finetune_operator.controller import CREATE_CONCURRENCY
from finetune_operator.k8s import Kube
from finetune_operator.reconcile import Observed, reconcile
from finetune_operator.sshkeys import generate_keys
from finetune_runtime.progress import format_line
from ftjob_cluster import bins
from ftjob_cluster.auditlog import count_requests, policy_for_user, watch_uris
from ftjob_cluster.localcluster import (
    Etcd,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
    LocalCluster,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[1]

OPERATOR_USER = "bench-operator"
PEER_USER = "bench-peer"
FLOOR_USER = "bench-floor"
# Requests raw keeps in flight, and the writers every system's jobs are created with (the floor's too): as many as
# the operator's own create pool (controller.CREATE_CONCURRENCY), the pool the floor writes a job's children and
# status patch with. One number: raw writes as many objects at a time as ours can, and no more.
RAW_THREADS = CREATE_CONCURRENCY
SYSTEMS = ("raw", "floor", "ours", "peer")
NODE = "bench-node"
LEAD_IN_SECONDS = 30.0  # after every job is Running, before the steady window opens
HEARTBEAT_SECONDS = 10.0  # the node's Lease renewal (the node lifecycle controller's grace period is 50 s)


SAMPLE = ROOT / "manifests" / "samples" / "cpu-bert-ja.yaml"
CLAIMS = ("finetune-cache", "results")  # the sample's spec.compileCache and spec.output claims
PODS_PER_JOB = 2  # the sample: 2 pods x 1 process, torchrun (checked against the builders in raw())


def job_manifest(name: str, namespace: str, ranks: int = PODS_PER_JOB) -> dict[str, Any]:
    """The cpu-bert-ja sample (a Service, a ConfigMap and one pod per rank: the common shape) under a new name."""
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text(encoding="utf-8"))
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"]["output"]["path"] = f"bench/{name}"
    job["spec"]["hardware"]["nodes"] = ranks
    return job


def pytorchjob_manifest(name: str, namespace: str, ranks: int = PODS_PER_JOB) -> dict[str, Any]:
    """The peer's equivalent of job_manifest: a PyTorchJob with one Master and ranks - 1 Workers, the same
    requests; it makes one pod and one Service per rank. Nothing runs (no kubelet), so the image is a name."""

    def replicas(n: int) -> dict[str, Any]:
        container = {
            "name": "pytorch",
            "image": "finetune-operator/bench-peer:none",
            "command": ["torchrun"],
            "resources": {"requests": {"cpu": "4", "memory": "8Gi"}},
        }
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [container]}}}

    specs = {"Master": replicas(1), **({"Worker": replicas(ranks - 1)} if ranks > 1 else {})}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": specs},
    }


@dataclass(frozen=True)
class System:
    """What the one measurement loop needs from an operator under test: its custom resource, the label its
    children carry with the job's name, the user it runs as (audit log), and how many Services a job has."""

    name: str
    group: str
    version: str
    plural: str
    manifest: Callable[[str, str, int], dict[str, Any]]
    job_label: str
    user: str
    services_per_job: Callable[[int], int]


OURS = System(
    "ours",
    "finetune.dev",
    "v1alpha1",
    "finetunejobs",
    job_manifest,
    "finetune.dev/job-name",
    OPERATOR_USER,
    lambda ranks: 1,
)
PEER = System(
    "peer",
    "kubeflow.org",
    "v1",
    "pytorchjobs",
    pytorchjob_manifest,
    "training.kubeflow.org/job-name",
    PEER_USER,
    lambda ranks: ranks,
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


PLACEHOLDER_UID = "00000000-0000-0000-0000-00000000f100"  # the job's uid until its create answers


def with_uid(value: Any, uid: str) -> Any:
    """`value` (an object built for PLACEHOLDER_UID) with the job's real uid wherever the placeholder stood."""
    if isinstance(value, dict):
        return {k: with_uid(v, uid) for k, v in value.items()}
    if isinstance(value, list):
        return [with_uid(v, uid) for v in value]
    return uid if value == PLACEHOLDER_UID else value


def first_pass(
    name: str, ns: str, ranks: int = PODS_PER_JOB
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """What the floor writes for one job: the manifest ours is given, and what our operator's first pass over it
    plans (the pure reconcile(), run before the clock starts): its children, owned by the job (PLACEHOLDER_UID
    until the create answers), and the status it writes once (phase Pending, the Created condition)."""
    manifest = job_manifest(name, ns, ranks)
    job = validate(copy.deepcopy(manifest))
    job["metadata"]["uid"] = PLACEHOLDER_UID
    job["metadata"]["generation"] = 1
    plan = reconcile(job, Observed(pods=[], objects={}, now=datetime.now(UTC), ssh_keys=lambda: generate_keys(name)))
    return manifest, plan.create, plan.status


WriteJob = tuple[str, str, list[dict[str, Any]], dict[str, Any]]  # (namespace, job name, children, status)


def serve_writes(
    inbox: Any,
    outbox: Any,
    create: Callable[[dict[str, Any]], object],
    patch: Callable[[str, str, dict[str, Any]], object],
    threads: int,
) -> None:
    """The floor's operator side: for each (namespace, name, children, status) from `inbox`, its children created
    and its status patched, `threads` writes at a time across jobs (as the operator's create pool); `outbox`
    gets (name, clock time the patch answered) per job, ("!error", message) for a write that failed, and
    ("!done", 0.0) once `inbox` gave None and every write has ended."""
    with ThreadPoolExecutor(threads) as pool:

        def report(name: str, write: Callable[[], object], last: bool) -> None:
            try:
                write()
            except Exception as e:  # told to the parent, which raises it
                outbox.put(("!error", f"{name}: {e}"))
                return
            if last:
                outbox.put((name, time.monotonic()))

        while (job := inbox.get()) is not None:
            ns, name, children, status = job
            for child in children:
                pool.submit(report, name, lambda c=child: create(c), False)
            pool.submit(report, name, lambda ns=ns, name=name, status=status: patch(ns, name, status), True)
    outbox.put(("!done", 0.0))


def floor_writes(kubeconfig: str, inbox: Any, outbox: Any) -> None:
    """serve_writes in a process of its own, as user `bench-floor` (`kubeconfig`), through the operator's own
    request path (k8s.Kube): the floor's writes do not share the benchmark's process, as ours' do not."""
    kube = Kube(Bench._pooled(config.new_client_from_config(kubeconfig)))
    outbox.put(("!ready", 0.0))
    serve_writes(
        inbox, outbox, kube.create, lambda ns, name, status: kube.patch_status(ns, name, {}, status), CREATE_CONCURRENCY
    )


def latency_summary(latencies: list[float]) -> dict[str, float]:
    """Per-job create-to-complete seconds as every system's result reports them."""
    return {
        "p50": round(statistics.median(latencies), 3),
        "p95": round(percentile(latencies, 0.95), 3),
        "max": round(max(latencies), 3),
    }


def bench_cluster(directory: Path, apiserver_flags: list[str]) -> LocalCluster:
    """The control plane every operator benchmark runs on: etcd, the API server, the controller-manager (service
    accounts, garbage collection) and the scheduler; no kubelet (BenchNode stands in for one)."""
    return LocalCluster(directory, [Etcd(), KubeApiserver(apiserver_flags), KubeControllerManager(), KubeScheduler()])


def settle(
    pid: int, busy: float = 0.05, window: float = 1.0, timeout: float = 60.0, cpu: Callable[[], float] | None = None
) -> None:
    """Wait until process `pid` (or what `cpu` counts) uses under `busy` of a CPU over `window` seconds (a fresh
    operator finishes its start-up work after it reports healthy; a fresh API server builds its OpenAPI for
    minutes), so that neither start-up nor clean-up lands in a measurement."""
    used = cpu or (lambda: procstat.usage(pid).cpu_seconds)
    deadline = time.monotonic() + timeout
    last = used()
    while time.monotonic() < deadline:
        time.sleep(window)
        now = used()
        if now - last < busy * window:
            return
        last = now


METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class Arrivals:
    """When each job's pods and Services first appeared, from two watches of the namespace (metadata only: the
    API server sends names and labels, not whole pods). A LIST every 0.2 s, as this benchmark first measured, made
    the API server serialise every pod five times a second: CPU taken from the system under test."""

    def __init__(self, api: client.ApiClient, ns: str, label: str) -> None:
        self.label = label
        self.counts: dict[str, Counter[str]] = {"pods": Counter(), "services": Counter()}
        self.times: dict[str, dict[str, list[float]]] = {"pods": {}, "services": {}}  # job -> arrival clock times
        self.seen: set[tuple[str, str]] = set()
        self.changed = threading.Condition()
        self.responses = [self._open(api, ns, plural) for plural in self.counts]  # open before the first create
        for plural, resp in zip(self.counts, self.responses, strict=True):
            threading.Thread(target=self._read, args=(plural, resp), daemon=True).start()

    def _open(self, api: client.ApiClient, ns: str, plural: str) -> Any:
        req = api.param_serialize(
            method="GET",
            resource_path=f"/api/v1/namespaces/{ns}/{plural}",
            query_params=[("watch", "true"), ("labelSelector", self.label), ("timeoutSeconds", "3600")],
            header_params={"Accept": METADATA_ONLY},
            auth_settings=["BearerToken"],
        )
        return api.call_api(*req).response  # the answer's headers are in: the watch is registered

    def _read(self, plural: str, resp: Any) -> None:
        with contextlib.suppress(Exception):  # closed by close()
            for line in resp:
                event = json.loads(line)
                meta = event["object"].get("metadata") or {}
                if event["type"] == "ADDED" and (plural, meta.get("name")) not in self.seen:
                    self.seen.add((plural, meta["name"]))
                    job = (meta.get("labels") or {}).get(self.label, "")
                    with self.changed:
                        self.counts[plural][job] += 1
                        self.times[plural].setdefault(job, []).append(time.monotonic())
                        self.changed.notify_all()

    def complete_at(self, job: str, pods: int, services: int) -> float | None:
        """When `job` had `pods` pods and `services` Services (clock time of the last to arrive), or None."""
        have_pods, have_services = self.times["pods"].get(job, []), self.times["services"].get(job, [])
        if len(have_pods) < pods or len(have_services) < services:
            return None
        return max(sorted(have_pods)[pods - 1], sorted(have_services)[services - 1] if services else 0.0)

    def wait_complete(self, jobs: list[str], pods: int, services: int, timeout: float, who: str) -> dict[str, float]:
        """Block until every job in `jobs` is complete (complete_at); their completion clock times."""
        deadline = time.monotonic() + timeout
        done: dict[str, float] = {}
        with self.changed:
            while True:
                for job in set(jobs) - done.keys():
                    if (at := self.complete_at(job, pods, services)) is not None:
                        done[job] = at
                if len(done) == len(jobs):
                    return done
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{who}: only {len(done)}/{len(jobs)} jobs got their children in time")
                self.changed.wait(1.0)

    def close(self) -> None:
        for resp in self.responses:
            resp.shutdown()  # unblocks the reader thread's read (urllib3 2.3+); close() alone would wait for it
            resp.release_conn()


class BenchNode(NodeLogs):
    """One node with room for every pod, kept Ready by renewing its Lease as a kubelet does: the scheduler binds
    every pod to it, as on a cluster with capacity (without a node, every pod is Unschedulable and each job's
    status reports it: a status patch a real cluster does not see). Its kubelet endpoint serves rank 0's log
    (NodeLogs), so the operator's progress reads go through the API server's real pods/log proxy."""

    def __init__(self, api: client.ApiClient, pki: Path) -> None:
        super().__init__(api, pki, NODE)
        room = {"cpu": "100k", "memory": "100Pi", "pods": "100k"}
        self.core.patch_node_status(
            NODE,
            {
                "status": {
                    "capacity": room,
                    "allocatable": room,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "benchmark node",
                            "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now(),
                        }
                    ],
                }
            },
        )
        self.api = api
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": NODE},
            "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": _now(micro=True)},
        }
        _request(api, "POST", LEASES, lease)  # plain JSON: the generated model reformats MicroTime wrongly
        self.stopping = threading.Event()
        self.heart = threading.Thread(target=self._beat, daemon=True)
        self.heart.start()

    def _beat(self) -> None:
        while not self.stopping.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(Exception):  # one missed beat is within the grace period
                _request(self.api, "PATCH", f"{LEASES}/{NODE}", {"spec": {"renewTime": _now(micro=True)}})

    def close(self) -> None:
        self.stopping.set()
        super().close()


LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def _request(api: client.ApiClient, method: str, path: str, body: dict[str, Any]) -> None:
    """One plain-JSON write through the operator's own request path (k8s.Kube: a merge patch for PATCH; a status
    outside 2xx raises), for kinds Kube has no method for (Leases, PyTorchJobs) and for the jobs themselves."""
    Kube(api)._call(method, path, body, patch=method == "PATCH")


def _now(micro: bool = False) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + (".000000Z" if micro else "Z")


class Bench:
    def __init__(self, cluster: LocalCluster, audit_log: Path, workdir: Path) -> None:
        self.cluster = cluster
        self.audit_log = audit_log
        self.workdir = workdir
        self.api = config.new_client_from_config(str(cluster.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.kubectl = make_kubectl(bins.ensure_binary("kubectl"), cluster.kubeconfig)
        self.writer = self._pooled(self.api)  # raw's objects and every system's jobs: RAW_THREADS at a time
        self.floor_kubeconfig: Path | None = None  # the floor's children and status patches (install())

    @staticmethod
    def _pooled(api: client.ApiClient) -> client.ApiClient:
        writer = copy.copy(api.configuration)
        writer.connection_pool_maxsize = RAW_THREADS
        return client.ApiClient(writer)

    def quiet(self) -> None:
        """Until the API server and etcd idle (under 15% of a CPU for 2 s): the first turn began while a fresh
        API server was still building its OpenAPI, which doubled raw's time in one run."""
        settle(0, busy=0.15, window=2.0, timeout=180.0, cpu=self.control_plane_cpu)

    def control_plane_cpu(self) -> float:
        """CPU seconds used so far by the API server and etcd: what the writes cost on the server side."""
        return sum(
            procstat.usage(c.process.pid).cpu_seconds
            for c in self.cluster.components
            if isinstance(c, KubeApiserver | Etcd) and c.process is not None
        )

    def install(self) -> Path:
        install_crd(self.kubectl, wait_for)
        # rbac.yaml's Role for the leader-election Lease lives in the operator's namespace: it must exist first.
        self.kubectl("create", "namespace", "finetune-operator")
        self.kubectl("apply", "-f", str(ROOT / "manifests" / "rbac" / "rbac.yaml"))
        for role in ("finetune-operator", "finetune-operator-cluster"):
            self.kubectl(
                "create", "clusterrolebinding", f"bench-{role}", f"--clusterrole={role}", f"--user={OPERATOR_USER}"
            )
            # The floor writes what the operator writes, as an audited user with the operator's roles: the same
            # authorization and audit-log cost per request as ours, and its requests counted the same way.
            self.kubectl(
                "create", "clusterrolebinding", f"bench-floor-{role}", f"--clusterrole={role}", f"--user={FLOOR_USER}"
            )
        assert self.cluster.ctx is not None
        self.floor_kubeconfig = self.cluster.ctx.write_kubeconfig("bench-floor", FLOOR_USER)
        return self.cluster.ctx.write_kubeconfig("bench-operator", OPERATOR_USER)

    def namespace(self, name: str) -> str:
        self.core.create_namespace({"metadata": {"name": name}})

        def has_default_account() -> bool:  # pods are refused until the controller-manager makes it
            return any(a.metadata.name == "default" for a in self.core.list_namespaced_service_account(name).items)

        wait_for(has_default_account, timeout=60, message=f"service account {name}/default")
        self.claims(name)
        return name

    def claims(self, ns: str) -> None:
        """The sample's claims (compile cache and output), each bound to a volume of its own: without them the
        scheduler leaves every pod Pending ("persistentvolumeclaim not found") and each job reports it."""
        for claim in CLAIMS:
            volume = f"{ns}-{claim}"
            self.core.create_persistent_volume(
                {
                    "metadata": {"name": volume},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": "",
                        "hostPath": {"path": f"/tmp/ftjob-bench-volumes/{volume}"},
                        "claimRef": {"namespace": ns, "name": claim},
                    },
                }
            )
            self.core.create_namespaced_persistent_volume_claim(
                ns,
                {
                    "metadata": {"name": claim},
                    "spec": {
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": "",
                        "volumeName": volume,
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                },
            )

        def bound() -> bool:
            return all(c.status.phase == "Bound" for c in self.core.list_namespaced_persistent_volume_claim(ns).items)

        wait_for(bound, timeout=60, message=f"claims {', '.join(CLAIMS)} in {ns} bound")

    # --- 1. raw ------------------------------------------------------------------------------------------
    def raw(self, jobs: int, ranks: int = PODS_PER_JOB, ns: str = "bench-raw") -> dict[str, Any]:
        ns = self.namespace(ns)
        objs: list[dict[str, Any]] = []
        for i in range(jobs):
            job = validate(job_manifest(f"raw-{i}", ns, ranks))
            job["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
            children = desired(job, ssh_keys=generate_keys(f"raw-{i}"))
            assert len(children.pods) == ranks, f"{SAMPLE.name} with nodes={ranks} no longer has {ranks} pods"
            for obj in children.all():
                obj["metadata"].pop("ownerReferences", None)  # no such owner exists; GC would remove them
                objs.append(obj)
        kube = Kube(self.writer)  # the operator's own create path
        # The same watches and clock as an operator's turn (measure()): raw is done when its last child reaches
        # the watch, not when its last create returns, so both sides pay the watch delivery and its serialisation.
        arrivals = Arrivals(self.api, ns, OURS.job_label)

        cpu = self.control_plane_cpu()
        start = time.monotonic()
        try:
            with ThreadPoolExecutor(RAW_THREADS) as pool:
                list(pool.map(kube.create, objs))
            seconds = time.monotonic() - start
            done = arrivals.wait_complete(
                [f"raw-{i}" for i in range(jobs)], ranks, OURS.services_per_job(ranks), 120, "raw"
            )
        finally:
            arrivals.close()
        watched = max(done.values()) - start
        return {
            "objects": len(objs),
            "seconds": round(seconds, 3),
            "watchedSeconds": round(watched, 3),
            "objectsPerSecond": round(len(objs) / seconds, 1),
            "threads": RAW_THREADS,
            "perJob": len(objs) / jobs,
            "controlPlaneCpuSeconds": round(self.control_plane_cpu() - cpu, 2),
        }

    # --- 2. an operator: ours or the peer, one code path -------------------------------------------------------
    def measure(self, system: System, ns: str, jobs: int, ranks: int = PODS_PER_JOB) -> dict[str, Any]:
        """Create `jobs` jobs at once; a job's clock stops when its `ranks` pods and its Services exist. Requests
        are this namespace's (other jobs' progress reads go on meanwhile in the operator's own session)."""
        mark = count_requests(self.audit_log, system.user, ns)
        arrivals = Arrivals(self.api, ns, system.job_label)
        created: dict[str, float] = {}

        path = f"/apis/{system.group}/{system.version}/namespaces/{ns}/{system.plural}"

        def create(i: int) -> None:
            _request(self.writer, "POST", path, system.manifest(f"job-{i}", ns, ranks))
            created[f"job-{i}"] = time.monotonic()

        cpu = self.control_plane_cpu()
        start = time.monotonic()
        try:
            # Created at once as raw creates its objects: RAW_THREADS at a time, plain JSON.
            with ThreadPoolExecutor(RAW_THREADS) as pool:
                list(pool.map(create, range(jobs)))
            create_seconds = time.monotonic() - start
            # The times are the watch events' arrivals.
            done = arrivals.wait_complete(
                list(created), ranks, system.services_per_job(ranks), max(120, jobs * 3, ranks * 3), system.name
            )
        finally:
            arrivals.close()
        cpu = self.control_plane_cpu() - cpu
        latencies = [done[n] - created[n] for n in created]
        used = count_requests(self.audit_log, system.user, ns) - mark
        return {
            "jobs": jobs,
            "ranks": ranks,
            "controlPlaneCpuSeconds": round(cpu, 2),
            "createSeconds": round(create_seconds, 3),
            "makespanSeconds": round(max(done.values()) - start, 3),
            "latencySeconds": latency_summary(latencies),
            "requests": dict(sorted(used.items())),
            "requestsPerJob": round(sum(used.values()) / jobs, 1),
        }

    def delete_all(self, system: System, ns: str, timeout: float = 600.0) -> None:
        """Delete every job of `system` in `ns` and wait until the garbage collector has removed its pods. The
        pods are on a node with no kubelet to confirm their graceful deletion: the benchmark confirms it (grace
        period 0), as tests/controlplane's Kubelet does."""
        self.custom.delete_collection_namespaced_custom_object(system.group, system.version, ns, system.plural)

        def gone() -> bool:
            pods = self.core.list_namespaced_pod(ns, label_selector=system.job_label).items
            if any(p.metadata.deletion_timestamp for p in pods):
                self.core.delete_collection_namespaced_pod(ns, label_selector=system.job_label, grace_period_seconds=0)
            return (
                not pods
                and not (
                    self.custom.list_namespaced_custom_object(system.group, system.version, ns, system.plural)["items"]
                )
            )

        wait_for(gone, timeout=timeout, interval=1.0, message=f"{system.name}'s jobs and pods in {ns} deleted")

    def session(
        self,
        system: System,
        pid: int,
        ns_prefix: str,
        jobs: int,
        wide: int,
        steady: Callable[[str, int], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """One turn of a running operator (process `pid`): one job created and deleted (the operator's first
        job loads modules and makes its client: RSS "warm"), N jobs x 2 ranks, 1 job x `wide` ranks, optionally
        the steady state of the N jobs training, then every job deleted. CPU is counted from the first
        create until the last job's children exist."""
        narrow_ns, wide_ns = self.namespace(f"{ns_prefix}-narrow"), self.namespace(f"{ns_prefix}-wide")
        warm_ns = self.namespace(f"{ns_prefix}-warm")
        settle(pid)
        out: dict[str, Any] = {"rssAtRestMiB": round(procstat.usage(pid).rss_bytes / procstat.MIB, 1)}
        self.measure(system, warm_ns, 1)
        self.delete_all(system, warm_ns)
        settle(pid)
        self.quiet()
        out["rssWarmMiB"] = round(procstat.usage(pid).rss_bytes / procstat.MIB, 1)
        before = procstat.usage(pid).cpu_seconds
        out["narrow"] = self.measure(system, narrow_ns, jobs)
        after = procstat.usage(pid)
        out["narrow"]["cpuMsPerJob"] = round((after.cpu_seconds - before) * 1000 / jobs, 1)
        out["rssPeakMiB"] = round(after.peak_rss_bytes / procstat.MIB, 1)
        settle(pid)  # the N jobs' later passes (status patches) would otherwise land in the wide job's run
        self.quiet()
        out["wide"] = self.measure(system, wide_ns, 1, wide)
        out["rssPeakAfterWideMiB"] = round(procstat.usage(pid).peak_rss_bytes / procstat.MIB, 1)
        if steady is not None:  # after the wide job, which then runs as alone as raw's did
            out["steady"] = steady(narrow_ns, jobs)
            out["rssSteadyMiB"] = round(procstat.usage(pid).rss_bytes / procstat.MIB, 1)
            print(f"steady: {json.dumps(out['steady'])}", flush=True)
        for ns in (narrow_ns, wide_ns):
            self.delete_all(system, ns)
        settle(pid)  # the operator's own clean-up after the last deletion event (loops ending, index entries)
        out["rssAfterDeleteMiB"] = round(procstat.usage(pid).rss_bytes / procstat.MIB, 1)
        # A second wave of N jobs, made and deleted: RSS that stays at the first wave's high-water mark is memory
        # kept for reuse (CPython's and malloc's free lists); RSS that grows again would be a leak.
        again_ns = self.namespace(f"{ns_prefix}-again")
        out["again"] = self.measure(system, again_ns, jobs)
        self.delete_all(system, again_ns)
        settle(pid)
        out["rssAfterSecondWaveMiB"] = round(procstat.usage(pid).rss_bytes / procstat.MIB, 1)
        return out

    def raw_turn(self, ns_prefix: str, jobs: int, wide: int) -> dict[str, Any]:
        out = {"narrow": self.raw(jobs, ns=f"{ns_prefix}-narrow")}
        self.quiet()
        out["wide"] = self.raw(1, wide, ns=f"{ns_prefix}-wide")
        self.drop_namespaces([f"{ns_prefix}-narrow", f"{ns_prefix}-wide"])  # no owner: nothing else collects them
        return out

    def drop_namespaces(self, names: list[str]) -> None:
        """Delete the namespaces and wait until they are gone; the pods first, at once (no kubelet confirms a
        graceful deletion here)."""
        for ns in names:
            self.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            self.core.delete_namespace(ns)
        for ns in names:
            wait_for(
                lambda ns=ns: ns not in {n.metadata.name for n in self.core.list_namespace().items},
                timeout=600,
                interval=1.0,
                message=f"namespace {ns} deleted",
            )

    # --- the floor: what any operator must pay ----------------------------------------------------------------
    def floor(self, jobs: int, ranks: int = PODS_PER_JOB, ns: str = "bench-floor") -> dict[str, Any]:
        """N FineTuneJobs created as ours are (the admin's writer, RAW_THREADS at a time, validated by the CRD's
        schema and rules); as each create answers, its children (the objects our operator's first pass plans,
        owned by the job) and ONE status patch (the status that pass writes) are handed to a process of their
        own (floor_writes), which writes them as user `bench-floor`, CREATE_CONCURRENCY at a time, as our
        operator's create pool does. (Written from the benchmark's own process, by one pool or two, the floor
        finished after ours on a loaded machine: benchmarks/README.md.) A job is done when the same watches as
        ours see its last child and its status patch has answered; requests per job are `bench-floor`'s from the
        audit log (the job's create is the user's, as it is for ours and the peer)."""
        assert self.floor_kubeconfig is not None, "install() first"
        ns = self.namespace(ns)
        planned = [first_pass(f"job-{i}", ns, ranks) for i in range(jobs)]  # keys and plans before the clock
        assert all(len([c for c in children if c["kind"] == "Pod"]) == ranks for _, children, _ in planned)
        jobs_path = f"/apis/{OURS.group}/{OURS.version}/namespaces/{ns}/{OURS.plural}"
        user = Kube(self.writer)
        created: dict[str, float] = {}
        patched: dict[str, float] = {}
        spawn = multiprocessing.get_context("spawn")  # no fork of a process with threads
        inbox, outbox = spawn.Queue(), spawn.Queue()
        writer = spawn.Process(target=floor_writes, args=(str(self.floor_kubeconfig), inbox, outbox), daemon=True)
        writer.start()
        try:
            if outbox.get(timeout=120)[0] != "!ready":
                raise RuntimeError("floor: the writer process did not start")

            def create(manifest: dict[str, Any], children: list[dict[str, Any]], status: dict[str, Any]) -> None:
                name = manifest["metadata"]["name"]
                uid = user._json("POST", jobs_path, manifest)["metadata"]["uid"]
                created[name] = time.monotonic()
                inbox.put((ns, name, with_uid(children, uid), with_uid(status, uid)))

            mark = count_requests(self.audit_log, FLOOR_USER, ns)
            arrivals = Arrivals(self.api, ns, OURS.job_label)
            cpu = self.control_plane_cpu()
            start = time.monotonic()
            try:
                with ThreadPoolExecutor(RAW_THREADS) as pool:
                    list(pool.map(lambda p: create(*p), planned))
                inbox.put(None)
                while (answer := outbox.get(timeout=max(120, jobs * 3)))[0] != "!done":
                    if answer[0] == "!error":
                        raise RuntimeError(f"floor: a write failed: {answer[1]}")
                    patched[answer[0]] = answer[1]  # time.monotonic() is the system's, the same in both processes
                seen = arrivals.wait_complete(list(created), ranks, OURS.services_per_job(ranks), 120, "floor")
            finally:
                arrivals.close()
            cpu = self.control_plane_cpu() - cpu
        finally:
            writer.join(timeout=30)
            if writer.is_alive():
                writer.kill()
        done = {n: max(seen[n], patched[n]) for n in created}
        latencies = [done[n] - created[n] for n in created]
        used = count_requests(self.audit_log, FLOOR_USER, ns) - mark
        return {
            "jobs": jobs,
            "ranks": ranks,
            "threads": {"jobs": RAW_THREADS, "writes": CREATE_CONCURRENCY, "writesInOwnProcess": True},
            "controlPlaneCpuSeconds": round(cpu, 2),
            "makespanSeconds": round(max(done.values()) - start, 3),
            "latencySeconds": latency_summary(latencies),
            "requests": dict(sorted(used.items())),
            "requestsPerJob": round(sum(used.values()) / jobs, 1),
        }

    def floor_turn(self, ns_prefix: str, jobs: int, wide: int) -> dict[str, Any]:
        out = {"narrow": self.floor(jobs, ns=f"{ns_prefix}-narrow")}
        self.quiet()
        out["wide"] = self.floor(1, wide, ns=f"{ns_prefix}-wide")
        self.drop_namespaces([f"{ns_prefix}-narrow", f"{ns_prefix}-wide"])  # the jobs, and their children by GC
        return out

    # --- 3. steady state -------------------------------------------------------------------------------------
    def steady(self, node: BenchNode, ns: str, jobs: int, window: float, log_every: float) -> dict[str, Any]:
        """Every pod reported Running; every rank 0's log (served by the node) gets a new progress line every
        `log_every` seconds, so each of the operator's reads finds a change; its requests in `ns` over `window`."""
        kubelet = Kubelet(self.api, ns, finalize_deletions=False)
        keys = []
        for pod in self.core.list_namespaced_pod(ns, label_selector="finetune.dev/job-name").items:
            name = pod.metadata.name
            if name.endswith("-rank-0"):
                keys.append((ns, name, "trainer"))
                node.logs[keys[-1]] = ""
            kubelet.set_status(name, "Running")
        stop = threading.Event()

        def train() -> None:
            step = 0
            while not stop.wait(log_every):
                step += 1
                line = format_line("train", step=step, totalSteps=100_000, loss=round(2.0 - step / 1000, 4)) + "\n"
                for key in keys:
                    node.logs[key] = line  # the tail is all the operator reads

        def all_running() -> bool:
            items = self.custom.list_namespaced_custom_object("finetune.dev", "v1alpha1", ns, "finetunejobs")["items"]
            return sum((j.get("status") or {}).get("phase") == "Running" for j in items) == jobs

        writer = threading.Thread(target=train, daemon=True)
        writer.start()
        try:
            wait_for(all_running, timeout=max(120, jobs * 2), message="every job Running")
            # The Running transitions' passes (a fresh read and a patch each) trail the last one by up to ~20 s at
            # 1,000 jobs: one progress interval lets them finish, so the window sees training alone.
            time.sleep(LEAD_IN_SECONDS)
            mark = count_requests(self.audit_log, OPERATOR_USER, ns)
            time.sleep(window)
            used = count_requests(self.audit_log, OPERATOR_USER, ns) - mark
        finally:
            stop.set()
            writer.join()
        total = sum(used.values())
        return {
            "jobs": jobs,
            "windowSeconds": window,
            "logLineEverySeconds": log_every,
            "requests": dict(sorted(used.items())),
            "requestsPerSecond": round(total / window, 2),
            "requestsPerJobPerMinute": round(total / window * 60 / jobs, 2),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50, help="jobs of 2 ranks created at once")
    ap.add_argument("--wide", type=int, default=64, help="ranks of the one wide job")
    ap.add_argument(
        "--window",
        type=float,
        default=120.0,
        help="seconds of steady-state measurement (our operator, without --peer; 0: none)",
    )
    ap.add_argument("--log-every", type=float, default=5.0, help="seconds between progress lines in every log")
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    ap.add_argument(
        "--keep-work",
        action="store_true",
        help="keep the scratch folder (operator logs, etcd data, audit log) after a successful run",
    )
    peer = ap.add_argument_group("raw, the floor, ours and the Kubeflow peer, interleaved (make bench-peer)")
    peer.add_argument("--peer", action="store_true", help="measure raw, ours and the peer (no steady state)")
    peer.add_argument("--rounds", type=int, default=1, help="interleaved rounds (the order rotates each round)")
    peer.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"which of {','.join(SYSTEMS)} to run (comma-separated)"
    )
    peer.add_argument("--readme", type=Path, help="write the table into this Markdown file's bench-peer block")
    args = ap.parse_args(argv)
    systems = [x for x in args.systems.split(",") if x]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        ap.error(f"--systems: unknown {', '.join(unknown)}; use {', '.join(SYSTEMS)} (any of them)")
    if args.jobs < 1 or args.rounds < 1 or args.wide < 1:
        ap.error("--jobs, --rounds and --wide must be at least 1")
    if args.window < 0 or args.log_every <= 0:
        ap.error("--window must be at least 0 and --log-every above 0")
    if (args.readme or args.rounds != 1 or args.systems != ",".join(SYSTEMS)) and not args.peer:
        ap.error("--rounds, --systems and --readme belong to --peer")
    args.systems = systems if args.peer else ["raw", "ours"]
    if args.peer:
        args.window = 0.0  # each system alone, measured the same way: the peer reads no progress
    return args


def turn_order(systems: list[str], round_index: int) -> list[str]:
    """Round r starts with the r-th system: each one goes first, middle and last equally often."""
    k = round_index % len(systems)
    return systems[k:] + systems[:k]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with scratch("ftjob-bench-", args.keep_work) as work:
        return run(args, work)


def run(args: argparse.Namespace, work: Path) -> int:
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(policy_for_user(OPERATOR_USER, PEER_USER, FLOOR_USER)))
    audit_log = work / "audit.log"
    cluster = bench_cluster(
        work / "cluster",
        [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ],
    )
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    }
    with cluster:
        bench = Bench(cluster, audit_log, work)
        operator_kubeconfig = bench.install()
        node = BenchNode(bench.api, cluster.directory / "pki")
        try:
            results.update(turns(bench, args, operator_kubeconfig, work, node))
        finally:
            node.close()
        results["watches"] = watch_uris(audit_log, OPERATOR_USER)
    print(peer_report.table(results))
    if args.peer:
        print(peer_report.goal(results))
    if args.readme:
        peer_report.write_section(args.readme, peer_report.section(results, peer_report.command(results)))
    write_json(args.json, results)
    return 0


@contextlib.contextmanager
def running(bench: Bench, system: str, operator_kubeconfig: Path, work: Path, tag: str) -> Iterator[int]:
    """A fresh operator of `system` for one turn; yields its pid."""
    if system == "ours":
        with running_operator(operator_kubeconfig, wait_for, work / f"operator-{tag}.log") as op:
            yield op.process.pid
        return
    from ftjob_cluster.peer import PeerProcess

    assert bench.cluster.ctx is not None
    peer_kubeconfig = bench.cluster.ctx.write_kubeconfig("bench-peer", PEER_USER)
    with PeerProcess(peer_kubeconfig, work / f"peer-{tag}", admin_kubeconfig=bench.cluster.kubeconfig) as peer:
        yield peer.pid


def turns(
    bench: Bench, args: argparse.Namespace, operator_kubeconfig: Path, work: Path, node: BenchNode
) -> dict[str, Any]:
    """Every system's turn, interleaved over the rounds; our operator's turn includes the steady state when
    `--window` is set."""
    if "peer" in args.systems:
        from ftjob_cluster.peer import PeerProcess

        bins.ensure_binary("training-operator")  # a first build (minutes) before any clock starts
        PeerProcess(bench.cluster.kubeconfig, work).install()  # its CRD, before any turn
        bench.kubectl(
            "create", "clusterrolebinding", "bench-peer-admin", "--clusterrole=cluster-admin", f"--user={PEER_USER}"
        )
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "jobs": args.jobs,
        "wideRanks": args.wide,
        "kubernetes": bins.K8S_VERSION,
        "peerVersion": bins.PEER_VERSION,
        "loadBefore": round(os.getloadavg()[0], 1),
        "rounds": [],
    }
    for r in range(args.rounds):
        this: dict[str, Any] = {"order": turn_order(args.systems, r)}
        for system in this["order"]:
            prefix = f"bench-{system}-{r}"
            bench.quiet()
            if system == "raw":
                this["raw"] = bench.raw_turn(prefix, args.jobs, args.wide)
            elif system == "floor":
                this["floor"] = bench.floor_turn(prefix, args.jobs, args.wide)
            else:
                steady = None
                if system == "ours" and args.window:

                    def steady(ns: str, jobs: int) -> dict[str, Any]:
                        return bench.steady(node, ns, jobs, args.window, args.log_every)

                with running(bench, system, operator_kubeconfig, work, f"{r}") as pid:
                    this[system] = bench.session(
                        OURS if system == "ours" else PEER, pid, prefix, args.jobs, args.wide, steady
                    )
            this[system]["loadAfter"] = round(os.getloadavg()[0], 1)  # other work on the machine shows here
            print(f"round {r} {system}: {json.dumps(this[system])}", flush=True)
            if args.json:  # what is done so far survives a later failure
                write_json(args.json.with_suffix(".partial.json"), {**out, "rounds": [*out["rounds"], this]})
        out["rounds"].append(this)
    return out


if __name__ == "__main__":
    sys.exit(main())
