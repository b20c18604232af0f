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

`--peer` (make bench-peer) measures three systems on the same control plane, interleaved over `--rounds`
rounds (the order rotates each round): raw, ours, and the peer, Kubeflow training-operator v1.8.1's
PyTorchJob controller (built from its Go module by tools/cluster, run as a host process, tools/cluster
ftjob_cluster/peer.py) as user `bench-peer` (cluster-admin). Each operator is started fresh for its turn;
one measurement (`Bench.measure`) serves both: N jobs x 2 ranks, then 1 job x `--wide` ranks; makespan and
per-job p50/p95/max until every pod and Service exists, operator CPU per job, RSS at rest / peak / after
every job is deleted, and requests per job from the audit log. `--readme` writes the table (peer_report.py).

Numbers depend on the machine: compare runs on one machine, never against a fixed threshold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The integration tests' helpers: the operator started and the CRD installed exactly as the tests do it.
sys.path.insert(0, str(ROOT / "tests" / "controlplane"))
import peer_report  # noqa: E402
import procstat  # noqa: E402
from auditlog import count_requests, policy_for_user, watch_uris  # noqa: E402
from benchio import write_json  # noqa: E402
from operator_support import Kubelet, install_crd, running_operator  # noqa: E402

from finetune_operator.admission import validate  # noqa: E402
from finetune_operator.builders import desired  # noqa: E402
from finetune_operator.k8s import Kube  # noqa: E402
from finetune_operator.sshkeys import generate_keys  # noqa: E402
from ftjob_cluster import bins  # noqa: E402
from ftjob_cluster.localcluster import (  # noqa: E402
    Etcd,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
    LocalCluster,
    wait_for,
)
from ftjob_cluster.testing import make_kubectl  # noqa: E402

OPERATOR_USER = "bench-operator"
PEER_USER = "bench-peer"
RAW_THREADS = 8
POLL_SECONDS = 0.2  # how often the measurement lists a namespace's pods and Services


SAMPLE = ROOT / "manifests" / "samples" / "cpu-bert-ja.yaml"
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
        container = {"name": "pytorch", "image": "finetune-operator/bench-peer:none", "command": ["torchrun"],
                     "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}  # fmt: skip
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [container]}}}

    specs = {"Master": replicas(1), **({"Worker": replicas(ranks - 1)} if ranks > 1 else {})}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"pytorchReplicaSpecs": specs}}  # fmt: skip


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


OURS = System("ours", "finetune.dev", "v1alpha1", "finetunejobs", job_manifest, "finetune.dev/job-name",
              OPERATOR_USER, lambda ranks: 1)  # fmt: skip
PEER = System("peer", "kubeflow.org", "v1", "pytorchjobs", pytorchjob_manifest, "training.kubeflow.org/job-name",
              PEER_USER, lambda ranks: ranks)  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def settle(pid: int, busy: float = 0.05, window: float = 1.0, timeout: float = 60.0) -> None:
    """Wait until process `pid` uses under `busy` of a CPU over `window` seconds (a fresh operator finishes its
    start-up work after it reports healthy), so that neither start-up nor clean-up lands in a measurement."""
    deadline = time.monotonic() + timeout
    last = procstat.usage(pid).cpu_seconds
    while time.monotonic() < deadline:
        time.sleep(window)
        now = procstat.usage(pid).cpu_seconds
        if now - last < busy * window:
            return
        last = now


class Bench:
    def __init__(self, cluster: LocalCluster, audit_log: Path, workdir: Path) -> None:
        self.cluster = cluster
        self.audit_log = audit_log
        self.workdir = workdir
        self.api = config.new_client_from_config(str(cluster.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.kubectl = make_kubectl(bins.ensure_binary("kubectl"), cluster.kubeconfig)

    def install(self) -> Path:
        install_crd(self.kubectl, wait_for)
        self.kubectl("apply", "-f", str(ROOT / "manifests" / "rbac" / "rbac.yaml"))
        for role in ("finetune-operator", "finetune-operator-cluster"):
            self.kubectl("create", "clusterrolebinding", f"bench-{role}", f"--clusterrole={role}",
                         f"--user={OPERATOR_USER}")  # fmt: skip
        assert self.cluster.ctx is not None
        return self.cluster.ctx.write_kubeconfig("bench-operator", OPERATOR_USER)

    def namespace(self, name: str) -> str:
        self.core.create_namespace({"metadata": {"name": name}})

        def has_default_account() -> bool:  # pods are refused until the controller-manager makes it
            return any(a.metadata.name == "default" for a in self.core.list_namespaced_service_account(name).items)

        wait_for(has_default_account, timeout=60, message=f"service account {name}/default")
        return name

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
        kube = Kube(client.ApiClient(self.api.configuration))  # the operator's own create path

        start = time.monotonic()
        with ThreadPoolExecutor(RAW_THREADS) as pool:
            list(pool.map(kube.create, objs))
        seconds = time.monotonic() - start
        return {"objects": len(objs), "seconds": round(seconds, 3), "objectsPerSecond": round(len(objs) / seconds, 1),
                "threads": RAW_THREADS, "perJob": len(objs) / jobs}  # fmt: skip

    # --- 2. an operator: ours or the peer, one code path -------------------------------------------------------
    def operator(self, jobs: int) -> tuple[dict[str, Any], str]:
        ns = self.namespace("bench-op")
        return self.measure(OURS, ns, jobs), ns

    def measure(self, system: System, ns: str, jobs: int, ranks: int = PODS_PER_JOB) -> dict[str, Any]:
        """Create `jobs` jobs at once; a job's clock stops when its `ranks` pods and its Services exist."""
        mark = count_requests(self.audit_log, system.user)
        created: dict[str, float] = {}
        start = time.monotonic()
        for i in range(jobs):
            name = f"job-{i}"
            self.custom.create_namespaced_custom_object(system.group, system.version, ns, system.plural,
                                                        system.manifest(name, ns, ranks))  # fmt: skip
            created[name] = time.monotonic()
        done: dict[str, float] = {}
        deadline = time.monotonic() + max(120, jobs * 3, ranks * 3)
        want_services = system.services_per_job(ranks)
        while len(done) < jobs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system.name}: only {len(done)}/{jobs} jobs got their children in time")
            pods: Counter[str] = Counter()
            services: Counter[str] = Counter()
            for pod in self.core.list_namespaced_pod(ns, label_selector=system.job_label).items:
                pods[pod.metadata.labels[system.job_label]] += 1
            for svc in self.core.list_namespaced_service(ns, label_selector=system.job_label).items:
                services[svc.metadata.labels[system.job_label]] += 1
            now = time.monotonic()
            for name, count in pods.items():
                if name not in done and count == ranks and services[name] == want_services:
                    done[name] = now
            time.sleep(POLL_SECONDS)
        latencies = [done[n] - created[n] for n in created]
        used = count_requests(self.audit_log, system.user) - mark
        return {
            "jobs": jobs,
            "ranks": ranks,
            "createSeconds": round(max(created.values()) - start, 3),
            "makespanSeconds": round(max(done.values()) - start, 3),
            "latencySeconds": {"p50": round(statistics.median(latencies), 3),
                               "p95": round(percentile(latencies, 0.95), 3), "max": round(max(latencies), 3)},
            "requests": dict(sorted(used.items())),
            "requestsPerJob": round(sum(used.values()) / jobs, 1),
        }  # fmt: skip

    def delete_all(self, system: System, ns: str, timeout: float = 300.0) -> None:
        """Delete every job of `system` in `ns` and wait until the garbage collector has removed its pods."""
        self.custom.delete_collection_namespaced_custom_object(system.group, system.version, ns, system.plural)

        def gone() -> bool:
            return not self.core.list_namespaced_pod(ns, label_selector=system.job_label).items and not (
                self.custom.list_namespaced_custom_object(system.group, system.version, ns, system.plural)["items"])

        wait_for(gone, timeout=timeout, interval=1.0, message=f"{system.name}'s jobs and pods in {ns} deleted")

    def session(self, system: System, pid: int, ns_prefix: str, jobs: int, wide: int) -> dict[str, Any]:
        """One turn of a running operator (process `pid`): N jobs x 2 ranks, 1 job x `wide` ranks, then every
        job deleted. CPU is counted from the first create until the last job's children exist."""
        narrow_ns, wide_ns = self.namespace(f"{ns_prefix}-narrow"), self.namespace(f"{ns_prefix}-wide")
        settle(pid)
        out: dict[str, Any] = {"rssAtRestMiB": round(procstat.usage(pid).rss_bytes / procstat.MIB, 1)}
        before = procstat.usage(pid).cpu_seconds
        out["narrow"] = self.measure(system, narrow_ns, jobs)
        after = procstat.usage(pid)
        out["narrow"]["cpuMsPerJob"] = round((after.cpu_seconds - before) * 1000 / jobs, 1)
        out["rssPeakMiB"] = round(after.peak_rss_bytes / procstat.MIB, 1)
        settle(pid)  # the N jobs' later passes (status patches) would otherwise count as the wide job's requests
        out["wide"] = self.measure(system, wide_ns, 1, wide)
        out["rssPeakAfterWideMiB"] = round(procstat.usage(pid).peak_rss_bytes / procstat.MIB, 1)
        for ns in (narrow_ns, wide_ns):
            self.delete_all(system, ns)
        settle(pid)  # the operator's own clean-up after the last deletion event (finalizers, index entries)
        out["rssAfterDeleteMiB"] = round(procstat.usage(pid).rss_bytes / procstat.MIB, 1)
        return out

    def raw_turn(self, ns_prefix: str, jobs: int, wide: int) -> dict[str, Any]:
        out = {"narrow": self.raw(jobs, ns=f"{ns_prefix}-narrow"), "wide": self.raw(1, wide, ns=f"{ns_prefix}-wide")}
        for ns in (f"{ns_prefix}-narrow", f"{ns_prefix}-wide"):  # no owner: nothing collects them
            self.kubectl("delete", "pods,services,configmaps,secrets", "--all", "-n", ns, timeout=600)
        return out

    # --- 3. steady state -------------------------------------------------------------------------------------
    def steady(self, ns: str, jobs: int, window: float) -> dict[str, Any]:
        kubelet = Kubelet(self.api, ns, finalize_deletions=False)
        for pod in self.core.list_namespaced_pod(ns, label_selector="finetune.dev/job-name").items:
            kubelet.set_status(pod.metadata.name, "Running")

        def all_running() -> bool:
            items = self.custom.list_namespaced_custom_object("finetune.dev", "v1alpha1", ns, "finetunejobs")["items"]
            return sum((j.get("status") or {}).get("phase") == "Running" for j in items) == jobs

        wait_for(all_running, timeout=max(120, jobs * 2), message="every job Running")
        time.sleep(2)  # let the passes the Running transition triggered finish
        mark = count_requests(self.audit_log, OPERATOR_USER)
        time.sleep(window)
        used = count_requests(self.audit_log, OPERATOR_USER) - mark
        total = sum(used.values())
        return {"jobs": jobs, "windowSeconds": window, "requests": dict(sorted(used.items())),
                "requestsPerSecond": round(total / window, 2),
                "requestsPerJobPerMinute": round(total / window * 60 / jobs, 1)}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50, help="jobs of 2 ranks created at once")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of steady-state measurement")
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    peer = ap.add_argument_group("raw, ours and the Kubeflow peer, interleaved (make bench-peer)")
    peer.add_argument("--peer", action="store_true", help="measure raw, ours and the peer instead of raw, ours, steady")
    peer.add_argument("--rounds", type=int, default=1, help="interleaved rounds (the order rotates each round)")
    peer.add_argument("--wide", type=int, default=64, help="ranks of the one wide job")
    peer.add_argument("--systems", default="raw,ours,peer", help="which of raw,ours,peer to run (comma-separated)")
    peer.add_argument("--readme", type=Path, help="write the table into this Markdown file's bench-peer block")
    args = ap.parse_args(argv)
    systems = [x for x in args.systems.split(",") if x]
    unknown = sorted(set(systems) - {"raw", "ours", "peer"})
    if unknown:
        ap.error(f"--systems: unknown {', '.join(unknown)}; use raw, ours and/or peer")
    if args.jobs < 1 or args.rounds < 1 or args.wide < 1:
        ap.error("--jobs, --rounds and --wide must be at least 1")
    if (args.readme or args.rounds != 1 or args.systems != "raw,ours,peer") and not args.peer:
        ap.error("--rounds, --systems and --readme belong to --peer")
    args.systems = systems
    return args


def turn_order(systems: list[str], round_index: int) -> list[str]:
    """Round r starts with the r-th system: each one goes first, middle and last equally often."""
    k = round_index % len(systems)
    return systems[k:] + systems[:k]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ftjob-bench-"))
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(policy_for_user(OPERATOR_USER, PEER_USER)))
    audit_log = work / "audit.log"
    apiserver = KubeApiserver([f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}",
                               "--audit-log-format=json", "--audit-log-mode=blocking"])  # fmt: skip
    cluster = LocalCluster(work / "cluster", [Etcd(), apiserver, KubeControllerManager(), KubeScheduler()])
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "platform": platform.platform()}}  # fmt: skip
    with cluster:
        bench = Bench(cluster, audit_log, work)
        operator_kubeconfig = bench.install()
        if args.peer:
            results.update(peer_mode(bench, args, operator_kubeconfig, work))
        else:
            results["raw"] = bench.raw(args.jobs)
            print(f"raw: {results['raw']}", flush=True)
            with running_operator(operator_kubeconfig, wait_for, work / "operator.log"):
                results["operator"], ns = bench.operator(args.jobs)
                print(f"operator: {results['operator']}", flush=True)
                results["steady"] = bench.steady(ns, args.jobs, args.window)
                print(f"steady: {results['steady']}", flush=True)
                results["watches"] = watch_uris(audit_log, OPERATOR_USER)
    if args.peer:
        print(peer_report.table(results))
        if args.readme:
            peer_report.write_section(args.readme, peer_report.section(results, peer_report.command(results)))
    else:
        print(report(results))
    write_json(args.json, results)
    print(f"logs and audit log: {work}")
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


def peer_mode(bench: Bench, args: argparse.Namespace, operator_kubeconfig: Path, work: Path) -> dict[str, Any]:
    if "peer" in args.systems:
        from ftjob_cluster.peer import PeerProcess

        bins.ensure_binary("training-operator")  # a first build (minutes) before any clock starts
        PeerProcess(bench.cluster.kubeconfig, work).install()  # its CRD, before any turn
        bench.kubectl("create", "clusterrolebinding", "bench-peer-admin", "--clusterrole=cluster-admin",
                      f"--user={PEER_USER}")  # fmt: skip
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "jobs": args.jobs, "wideRanks": args.wide,
                           "kubernetes": bins.K8S_VERSION,
                           "peerVersion": bins.PEER_VERSION, "loadBefore": round(os.getloadavg()[0], 1),
                           "rounds": []}  # fmt: skip
    for r in range(args.rounds):
        this: dict[str, Any] = {"order": turn_order(args.systems, r)}
        for system in this["order"]:
            prefix = f"bench-{system}-{r}"
            if system == "raw":
                this["raw"] = bench.raw_turn(prefix, args.jobs, args.wide)
            else:
                with running(bench, system, operator_kubeconfig, work, f"{r}") as pid:
                    this[system] = bench.session(OURS if system == "ours" else PEER, pid, prefix, args.jobs,
                                                 args.wide)  # fmt: skip
            this[system]["loadAfter"] = round(os.getloadavg()[0], 1)  # other work on the machine shows here
            print(f"round {r} {system}: {json.dumps(this[system])}", flush=True)
            if args.json:  # what is done so far survives a later failure
                write_json(args.json.with_suffix(".partial.json"), {**out, "rounds": [*out["rounds"], this]})
        out["rounds"].append(this)
    return out


def report(r: dict[str, Any]) -> str:
    raw, op, st = r["raw"], r["operator"], r["steady"]
    lat = op["latencySeconds"]
    return "\n".join([
        f"| {op['jobs']} jobs, {r['machine']['cpus']} CPUs | value |",
        "|---|---|",
        f"| raw API: children created ({raw['objects']} objects, {raw['threads']} threads) | "
        f"{raw['seconds']} s ({raw['objectsPerSecond']} objects/s) |",
        f"| operator: all jobs' children created (makespan) | {op['makespanSeconds']} s |",
        f"| operator: job created -> children exist, p50 / p95 / max | {lat['p50']} / {lat['p95']} / {lat['max']} s |",
        f"| operator: API requests per job until then | {op['requestsPerJob']} |",
        f"| operator, steady state (all Running): requests/s | {st['requestsPerSecond']} |",
        f"| ... per job per minute | {st['requestsPerJobPerMinute']} |",
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
