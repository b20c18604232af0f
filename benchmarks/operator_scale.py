"""Operator at scale against a real control plane, next to the raw API server doing the same writes.

    python benchmarks/operator_scale.py --jobs 50 [--json OUT]

Starts its own LocalCluster (tools/cluster: etcd + kube-apiserver + controller-manager + scheduler, no kubelet)
with an audit log that records every request of one user, `bench-operator`, the identity `ftjob operator` runs
as here (bound to the operator's real ClusterRoles from manifests/rbac/rbac.yaml). Then:

1. raw: the children `ftjob render` predicts for N jobs are created straight through the API (the same Python
   client the operator uses, 8 threads): the ceiling for getting these objects into this API server.
2. operator: N FineTuneJobs are created at once; the clock stops for a job when all its children exist.
   Latency per job (p50/p95/max), makespan, and the operator's requests by verb from the audit log.
3. steady: every pod is reported Running (as a kubelet would) and placed on a node whose kubelet endpoint serves
   rank 0's log (tests' NodeLogs: the API server proxies `pods/log` to it with its real kubelet client), and a
   new progress line is appended to every job's log every `--log-every` seconds, so every read finds a change.
   The operator's request rate is measured over a window: the per-job cost of a training job.
4. wide: one job of `--ranks` ranks (64), raw and operator: time until all its children exist, and requests.
5. delete: every job is deleted and its pods removed; the operator's RSS once its loops and indexes let go.
The operator's CPU seconds and RSS (current and peak, VmHWM) come from /proc at each step.

Numbers depend on the machine: compare runs on one machine, never against a fixed threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The integration tests' helpers: the operator started and the CRD installed exactly as the tests do it.
sys.path.insert(0, str(ROOT / "tests" / "controlplane"))
from auditlog import count_requests, policy_for_user, watch_uris  # noqa: E402
from operator_support import Kubelet, NodeLogs, install_crd, running_operator  # noqa: E402

from finetune_operator.admission import validate  # noqa: E402
from finetune_operator.builders import desired  # noqa: E402
from finetune_operator.k8s import Kube  # noqa: E402
from finetune_operator.sshkeys import generate_keys  # noqa: E402
from finetune_runtime.progress import format_line  # noqa: E402
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
RAW_THREADS = 8


SAMPLE = ROOT / "manifests" / "samples" / "cpu-bert-ja.yaml"
PODS_PER_JOB = 2  # the sample: 2 pods x 1 process, torchrun (checked against the builders in raw())


def job_manifest(name: str, namespace: str) -> dict[str, Any]:
    """The cpu-bert-ja sample (a Service, a ConfigMap and two rank pods: the common shape) under a new name."""
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text(encoding="utf-8"))
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"]["output"]["path"] = f"bench/{name}"
    return job


def wide_manifest(name: str, namespace: str, ranks: int) -> dict[str, Any]:
    """The sample with `ranks` pods (torchrun, one process each): 1 Service, 1 ConfigMap and `ranks` pods."""
    job = job_manifest(name, namespace)
    job["spec"]["hardware"]["nodes"] = ranks
    return job


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds (user + system, all threads) and RSS / peak RSS (VmHWM) in MiB of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of proc(5))
    mem = {k: int(v.split()[0]) / 1024 for k, v in (line.split(":", 1) for line in
           Path(f"/proc/{pid}/status").read_text().splitlines()) if k in ("VmRSS", "VmHWM")}  # fmt: skip
    return {"cpuSeconds": round(cpu, 2), "rssMiB": round(mem["VmRSS"], 1), "peakRssMiB": round(mem["VmHWM"], 1)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


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
    def raw(self, jobs: int, ranks: int | None = None) -> dict[str, Any]:
        """`jobs` copies of the sample, or (`ranks`) one job of that many ranks."""
        ns = self.namespace("bench-raw" if ranks is None else "bench-raw-wide")
        objs: list[dict[str, Any]] = []
        for i in range(jobs):
            manifest = job_manifest(f"raw-{i}", ns) if ranks is None else wide_manifest(f"raw-{i}", ns, ranks)
            job = validate(manifest)
            job["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
            children = desired(job, ssh_keys=generate_keys(f"raw-{i}"))
            want = PODS_PER_JOB if ranks is None else ranks
            assert len(children.pods) == want, f"{SAMPLE.name} no longer makes {want} pods"
            for obj in children.all():
                obj["metadata"].pop("ownerReferences", None)  # no such owner exists; GC would remove them
                objs.append(obj)
        kube = Kube(client.ApiClient(self.api.configuration))  # the operator's own create path

        start = time.monotonic()
        with ThreadPoolExecutor(RAW_THREADS) as pool:
            list(pool.map(kube.create, objs))
        seconds = time.monotonic() - start
        return {"objects": len(objs), "seconds": round(seconds, 3), "objectsPerSecond": round(len(objs) / seconds, 1),
                "threads": RAW_THREADS}  # fmt: skip

    # --- 2. operator ---------------------------------------------------------------------------------------
    def operator(self, jobs: int, pid: int, ranks: int | None = None) -> tuple[dict[str, Any], str]:
        """`jobs` copies of the sample, or (`ranks`) one job of that many ranks."""
        ns = self.namespace("bench-op" if ranks is None else "bench-op-wide")
        pods_per_job = PODS_PER_JOB if ranks is None else ranks
        # This namespace's requests only: the jobs of an earlier step keep reading their logs meanwhile.
        mark = count_requests(self.audit_log, OPERATOR_USER, ns)
        before = proc_stats(pid)
        created: dict[str, float] = {}
        start = time.monotonic()
        for i in range(jobs):
            name = f"job-{i}"
            manifest = job_manifest(name, ns) if ranks is None else wide_manifest(name, ns, ranks)
            self.custom.create_namespaced_custom_object("finetune.dev", "v1alpha1", ns, "finetunejobs", manifest)
            created[name] = time.monotonic()
        done: dict[str, float] = {}
        deadline = time.monotonic() + max(120, jobs * 3)
        while len(done) < jobs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(done)}/{jobs} jobs got their children in time")
            per_job: Counter[str] = Counter()
            for pod in self.core.list_namespaced_pod(ns, label_selector="finetune.dev/job-name").items:
                per_job[pod.metadata.labels["finetune.dev/job-name"]] += 1
            services = {s.metadata.name for s in self.core.list_namespaced_service(ns).items}
            now = time.monotonic()
            for name, count in per_job.items():
                if name not in done and count == pods_per_job and name in services:
                    done[name] = now
            time.sleep(0.2)
        after = proc_stats(pid)
        latencies = [done[n] - created[n] for n in created]
        used = count_requests(self.audit_log, OPERATOR_USER, ns) - mark
        result = {
            "jobs": jobs,
            "createSeconds": round(max(created.values()) - start, 3),
            "makespanSeconds": round(max(done.values()) - start, 3),
            "latencySeconds": {"p50": round(statistics.median(latencies), 3),
                               "p95": round(percentile(latencies, 0.95), 3), "max": round(max(latencies), 3)},
            "requests": dict(sorted(used.items())),
            "requestsPerJob": round(sum(used.values()) / jobs, 1),
            # Until the last job's children exist (the poll's 0.2 s granularity included).
            "cpuMsPerJob": round((after["cpuSeconds"] - before["cpuSeconds"]) * 1000 / jobs, 1),
            "process": after,
        }  # fmt: skip
        return result, ns

    # --- 3. steady state -------------------------------------------------------------------------------------
    def steady(self, ns: str, jobs: int, window: float, log_every: float) -> dict[str, Any]:
        kubelet = Kubelet(self.api, ns, finalize_deletions=False)
        node = NodeLogs(self.api, self.cluster.directory / "pki", "bench-node")
        # Only the rank-0 pods go there (a binding ignores taints): the scheduler places nothing else.
        self.core.patch_node("bench-node", {"spec": {"taints": [{"key": "bench", "effect": "NoSchedule"}]}})
        keys = []
        for pod in self.core.list_namespaced_pod(ns, label_selector="finetune.dev/job-name").items:
            name = pod.metadata.name
            if name.endswith("-rank-0"):
                try:
                    node.bind(ns, name)
                except client.ApiException as e:
                    if e.status != 409:  # the scheduler placed it there first (the only node)
                        raise
                keys.append((ns, name, "trainer"))
                node.logs[keys[-1]] = ""
            kubelet.set_status(name, "Running")
        stop = threading.Event()

        def train() -> None:  # every job's rank 0 logs a new step every log_every seconds
            step = 0
            while not stop.wait(log_every):
                step += 1
                line = format_line("train", step=step, totalSteps=100_000, loss=round(2.0 - step / 1000, 4)) + "\n"
                for key in keys:
                    node.logs[key] = line  # the tail is all the operator reads

        def all_running() -> bool:
            items = self.custom.list_namespaced_custom_object("finetune.dev", "v1alpha1", ns, "finetunejobs")["items"]
            return sum((j.get("status") or {}).get("phase") == "Running" for j in items) == jobs

        wait_for(all_running, timeout=max(120, jobs * 2), message="every job Running")
        writer = threading.Thread(target=train, daemon=True)
        writer.start()
        time.sleep(2)  # let the passes the Running transition triggered finish
        mark = count_requests(self.audit_log, OPERATOR_USER)
        time.sleep(window)
        used = count_requests(self.audit_log, OPERATOR_USER) - mark
        stop.set()
        writer.join()
        node.close()
        total = sum(used.values())
        return {"jobs": jobs, "windowSeconds": window, "logLineEverySeconds": log_every,
                "requests": dict(sorted(used.items())), "requestsPerSecond": round(total / window, 2),
                "requestsPerJobPerMinute": round(total / window * 60 / jobs, 1)}  # fmt: skip


    # --- 5. delete -------------------------------------------------------------------------------------------
    def delete(self, namespaces: list[str], pid: int, settle: float) -> dict[str, Any]:
        """Delete every job, then their pods at once (no kubelet finishes a graceful deletion here); RSS once
        the operator's daemons have stopped and `settle` seconds have passed."""
        for ns in namespaces:
            self.custom.delete_collection_namespaced_custom_object("finetune.dev", "v1alpha1", ns, "finetunejobs")

        def gone() -> bool:
            try:
                return all(not self.custom.list_namespaced_custom_object("finetune.dev", "v1alpha1", ns,
                                                                         "finetunejobs")["items"] for ns in namespaces)
            except Exception:  # a LIST cut short under load: ask again
                return False

        wait_for(gone, timeout=300, message="every FineTuneJob deleted (finalizers released)")
        for ns in namespaces:
            self.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        time.sleep(settle)
        return proc_stats(pid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--window", type=float, default=120.0, help="seconds of steady-state measurement")
    ap.add_argument("--log-every", type=float, default=5.0, help="seconds between progress lines in every log")
    ap.add_argument("--ranks", type=int, default=64, help="ranks of the one wide job (0: skip it)")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after deletion before the last RSS")
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ftjob-bench-"))
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(policy_for_user(OPERATOR_USER)))
    audit_log = work / "audit.log"
    apiserver = KubeApiserver([f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}",
                               "--audit-log-format=json", "--audit-log-mode=blocking"])  # fmt: skip
    cluster = LocalCluster(work / "cluster", [Etcd(), apiserver, KubeControllerManager(), KubeScheduler()])
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "platform": platform.platform()}}  # fmt: skip
    with cluster:
        bench = Bench(cluster, audit_log, work)
        operator_kubeconfig = bench.install()
        results["raw"] = bench.raw(args.jobs)
        print(f"raw: {results['raw']}", flush=True)
        if args.ranks:
            results["rawWide"] = bench.raw(1, args.ranks)
            print(f"raw wide: {results['rawWide']}", flush=True)
        with running_operator(operator_kubeconfig, wait_for, work / "operator.log") as op:
            pid = op.process.pid
            time.sleep(2)
            results["rest"] = proc_stats(pid)
            print(f"operator at rest: {results['rest']}", flush=True)
            results["operator"], ns = bench.operator(args.jobs, pid)
            print(f"operator: {results['operator']}", flush=True)
            results["steady"] = bench.steady(ns, args.jobs, args.window, args.log_every)
            print(f"steady: {results['steady']}", flush=True)
            namespaces = [ns]
            if args.ranks:
                results["wide"], wide_ns = bench.operator(1, pid, args.ranks)
                namespaces.append(wide_ns)
                print(f"operator wide: {results['wide']}", flush=True)
            results["peak"] = proc_stats(pid)
            results["deleted"] = bench.delete(namespaces, pid, args.settle)
            print(f"operator after deletion: {results['deleted']}", flush=True)
            results["watches"] = watch_uris(audit_log, OPERATOR_USER)
    print(report(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


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
        f"| operator, steady state (all Running, every log changing): requests/s | {st['requestsPerSecond']} |",
        f"| ... per job per minute | {st['requestsPerJobPerMinute']} |",
        f"| operator CPU per job until its children exist | {op['cpuMsPerJob']} ms |",
        f"| operator RSS at rest / peak / after deletion | {r['rest']['rssMiB']} / {r['peak']['peakRssMiB']} / "
        f"{r['deleted']['rssMiB']} MiB |",
        *([f"| 1 job x {r['rawWide']['objects'] - 2} ranks: raw / operator, all children | "
           f"{r['rawWide']['seconds']} / {r['wide']['makespanSeconds']} s |",
           f"| ... operator requests until then | {r['wide']['requestsPerJob']} |"] if "wide" in r else []),
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
