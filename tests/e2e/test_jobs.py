"""Seed jobs end to end on the real nodes: `kubectl apply -f` a FineTuneJob, the operator (a pod installed by
Helm, in-cluster credentials) renders pods that the kubelets run from the locally built cpu image. The torchrun
and MPI jobs ask for whole nodes (hardware.instanceType) and so run one rank pod on each of the two nodes:
their rendezvous, collectives and ssh cross from one node's network namespace to the other's."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Kubectl
from conftest import NodeCluster

from finetune_operator.api.schema import CACHE_FOLDER
from finetune_operator.progress import parse_line
from ftjob_cluster.localcluster import wait_for

JOBS = Path(__file__).resolve().parent / "jobs"
# First runs import the model and tokenizer on 2 shared cores: minutes, not seconds.
JOB_TIMEOUT = 900.0


def _ftj(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("-n", ns, "get", "ftj", name, "-o", "json").stdout))


def _finished(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    job = _ftj(kubectl, ns, name)
    return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None


def _diagnose(kubectl: Kubectl, ns: str) -> str:
    pods = kubectl("-n", ns, "get", "pods", "-o", "wide", check=False).stdout
    events = kubectl("-n", ns, "get", "events", "--sort-by=.lastTimestamp", check=False).stdout[-3000:]
    logs = []
    for pod in kubectl("-n", ns, "get", "pods", "-o", "name", check=False).stdout.split():
        for previous in ("--previous=false", "--previous=true"):
            out = kubectl("-n", ns, "logs", pod, "--all-containers", previous, "--tail=40", check=False)
            if out.stdout.strip():
                logs.append(f"--- {pod} {previous}\n{out.stdout[-4000:]}")
    return f"pods:\n{pods}\nevents:\n{events}\nlogs:\n" + "\n".join(logs)


def _run_to_end(
    kubectl: Kubectl, ns: str, name: str, watch: Callable[[], None] | None = None, seen: Callable[[], str] | None = None
) -> dict[str, Any]:
    """Poll until job `name` is Succeeded or Failed (calling `watch` at each poll); on timeout fail the test
    with the namespace's pods, events and logs (and what `seen` says)."""

    def done() -> dict[str, Any] | None:
        if watch is not None:
            watch()
        return _finished(kubectl, ns, name)

    try:
        job: dict[str, Any] = wait_for(done, timeout=JOB_TIMEOUT, interval=2.0, message=f"{name} to finish")
    except TimeoutError:
        pytest.fail(f"job did not finish:\n{_diagnose(kubectl, ns)}" + (f"\n{seen()}" if seen else ""))
    return job


def _check_throughput(job: dict[str, Any]) -> None:
    """status.throughput of a runtime job that ran: rates, the model's numbers as counted in the pod, FLOPs, MFU."""
    t = job["status"].get("throughput") or {}
    assert t.get("samplesPerSecond", 0) > 0 and 0 < t.get("tokensPerSecond", 0) <= t.get("paddedTokensPerSecond", 0), t
    assert t.get("flopsPerSample", 0) > 0 and t["model"]["layers"] == 2 and t["precision"] == "fp32", t
    assert t["mfu"] == pytest.approx(t["samplesPerSecond"] * t["flopsPerSample"] / t["peakFlopsPerSecond"], rel=1e-3)
    assert t["summary"].endswith("%") and " samples/s, MFU " in t["summary"], t


def test_operator_runs_in_cluster_with_service_account(kubectl: Kubectl, operator: str) -> None:
    pod = json.loads(kubectl("-n", operator, "get", "pods", "-o", "json").stdout)["items"][0]
    spec = pod["spec"]
    assert spec["serviceAccountName"] != "default"
    assert pod["status"]["phase"] == "Running"
    # In-cluster config: no mounted kubeconfig, the API server through the `kubernetes` Service.
    mounts = [m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])]
    assert not any("kubeconfig" in m for m in mounts), mounts
    ns = json.loads(kubectl("get", "ns", operator, "-o", "json").stdout)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def _nodes_of(kubectl: Kubectl, ns: str, pods: set[str]) -> dict[str, str]:
    """Pod name -> the node it was bound to, for the pods of `pods` that exist."""
    items = json.loads(kubectl("-n", ns, "get", "pods", "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in items if p["metadata"]["name"] in pods}


def test_torchrun_ja_sentiment_two_pods(
    kubectl: Kubectl, job_namespace: tuple[str, Path], node_cluster: NodeCluster
) -> None:
    ns, host = job_namespace
    kubectl("-n", ns, "apply", "-f", str(JOBS / "ja-sentiment-torchrun.yaml"))
    progress: list[str] = []

    def watch() -> None:
        line = kubectl("-n", ns, "get", "ftj", "ja-sentiment", "--no-headers", check=False).stdout.strip()
        if line and line not in progress:
            progress.append(line)

    job = _run_to_end(kubectl, ns, "ja-sentiment", watch, seen=lambda: f"progress seen: {progress}")
    assert job["status"]["phase"] == "Succeeded", f"{job['status']}\n{_diagnose(kubectl, ns)}"
    # `kubectl get ftj` showed progress that came from rank 0's real container log (a step count).
    assert any("/" in line.split()[4] for line in progress if len(line.split()) > 5), progress
    # ... and its THROUGHPUT column samples/s and MFU: the runtime's tokens and model numbers, the cpu profile's
    # peak, the FLOPs by the estimate's formula.
    assert any(" samples/s, MFU " in line for line in progress), progress
    _check_throughput(job)
    # Two rank pods ran and rendezvoused through the headless Service's DNS name.
    pods = json.loads(kubectl("-n", ns, "get", "pods", "-o", "json").stdout)["items"]
    ranks = [p for p in pods if p["metadata"]["name"].startswith("ja-sentiment-rank-")]
    assert len(ranks) == 2, [p["metadata"]["name"] for p in pods]
    # One rank per node (the operator's anti-affinity for whole-node pods), so rank 1 reached rank 0 across nodes.
    assert sorted(p["spec"]["nodeName"] for p in ranks) == sorted(node_cluster.nodes), [p["spec"] for p in ranks]
    env = {e["name"]: e.get("value", "") for e in ranks[1]["spec"]["containers"][0].get("env", [])}
    assert env["FTJOB_MASTER_ADDR"] == f"ja-sentiment-rank-0.ja-sentiment.{ns}.svc", env
    assert all(p["status"]["phase"] == "Succeeded" for p in ranks), [p["status"] for p in ranks]
    # The saved model, read from the volume on this host, loads in a transformers pipeline and predicts.
    model = host / "ja-sentiment" / ns / "ja-sentiment" / "model"  # output.path/<namespace>/<job> of the claim
    assert (model / "config.json").exists(), sorted(str(p) for p in (host / "ja-sentiment").rglob("*"))[:50]
    from transformers import pipeline

    clf = pipeline("text-classification", model=str(model))
    out = clf(["この商品は本当に素晴らしいです。"])
    assert out[0]["label"] in ("negative", "positive"), out


# Found by this tier (the simulated-node tier cannot see it): under a real kubelet the pods' HOME is an emptyDir
# owned by root and 0777 (fsGroup gives group 1000 only), which uid 1000 may not chmod; sshd then runs without
# StrictModes (sshd.secure_parent) instead of every worker exiting 1.
def test_mpi_mpich_squad_launcher_and_two_workers(
    kubectl: Kubectl, job_namespace: tuple[str, Path], node_cluster: NodeCluster
) -> None:
    ns, host = job_namespace
    kubectl("-n", ns, "apply", "-f", str(JOBS / "squad-mpich.yaml"))
    running: set[str] = set()  # workers are deleted once the launcher is done (cleanPodPolicy Running)
    workers = {"squad-mpi-worker-0", "squad-mpi-worker-1"}
    placed: dict[str, str] = {}  # worker -> node, read while they exist

    def watch() -> None:
        out = kubectl("-n", ns, "get", "pods", "--field-selector=status.phase=Running", "-o", "name", check=False)
        running.update(n.removeprefix("pod/") for n in out.stdout.split())
        placed.update({k: v for k, v in _nodes_of(kubectl, ns, workers).items() if v})

    job = _run_to_end(kubectl, ns, "squad-mpi", watch)
    assert job["status"]["phase"] == "Succeeded", f"{job['status']}\n{_diagnose(kubectl, ns)}"
    # rank 0's lines reach the launcher's log through mpirun; the final pass reads them
    columns = kubectl("-n", ns, "get", "ftj", "squad-mpi").stdout.splitlines()
    assert "THROUGHPUT" in columns[0] and " samples/s, MFU " in columns[1], columns
    _check_throughput(job)
    assert {"squad-mpi-launcher", *workers} <= running, running
    # One sshd worker per node: mpirun's proxies and the ranks' collectives crossed between the nodes.
    assert sorted(placed.values()) == sorted(node_cluster.nodes), placed
    metrics = list((host / "squad-mpi").rglob("*metrics*.json"))
    assert metrics, sorted(str(p) for p in (host / "squad-mpi").rglob("*"))[:50]


# A plain torch.distributed script: nothing of ours in it; torchrun (reading PET_*) sets RANK, WORLD_SIZE...
ALL_REDUCE = """\
import json, os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(), "group": os.environ["GROUP_RANK"],
       "master": os.environ["MASTER_ADDR"]}
open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w").write(json.dumps(out))
dist.destroy_process_group()
"""


def test_bare_torchrun_command_forms_one_world_across_two_pods(
    kubectl: Kubectl, job_namespace: tuple[str, Path]
) -> None:
    """`command: [torchrun, script]` with no flags, as in a PyTorchJob: without the PET_* variables each pod
    would train a world of its own (rank 0 of 1); with them both pods join one world through rank 0's DNS name."""
    ns, host = job_namespace
    scripts = host / CACHE_FOLDER / "scripts"  # /cache/scripts in the pods (the compile-cache claim's folder)
    scripts.mkdir(mode=0o777)
    (scripts / "all_reduce.py").write_text(ALL_REDUCE)
    (scripts / "all_reduce.py").chmod(0o644)
    kubectl("-n", ns, "apply", "-f", str(JOBS / "bare-torchrun.yaml"))
    job = _run_to_end(kubectl, ns, "bare-torchrun")
    assert job["status"]["phase"] == "Succeeded", f"{job['status']}\n{_diagnose(kubectl, ns)}"
    out = host / "bare-torchrun" / ns / "bare-torchrun"
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda x: x["rank"])
    assert [(x["rank"], x["world"], x["sum"]) for x in ranks] == [(0, 2, 3.0), (1, 2, 3.0)], ranks
    assert {x["group"] for x in ranks} == {"0", "1"}, ranks  # one torchrun agent per pod, node rank from PET_*
    assert {x["master"] for x in ranks} == {f"bare-torchrun-rank-0.bare-torchrun.{ns}.svc"}, ranks


def _first_step_after_start(kubectl: Kubectl, ns: str, pod: str) -> float:
    """Seconds from the pod's precompile trial starting to rank 0's first training step (its progress line)."""
    doc = json.loads(kubectl("-n", ns, "get", "pod", pod, "-o", "json").stdout)
    trial = next(s for s in doc["status"]["initContainerStatuses"] if s["name"] == "precompile")
    started = datetime.fromisoformat(trial["state"]["terminated"]["startedAt"].replace("Z", "+00:00"))
    for line in kubectl("-n", ns, "logs", pod, "-c", "trainer").stdout.splitlines():
        rec = parse_line(line)
        if rec and rec.get("event") == "train" and rec.get("step", 0) >= 1:
            return (datetime.fromisoformat(rec["time"].replace("Z", "+00:00")) - started).total_seconds()
    raise AssertionError(f"no training step in {pod}'s log")


def test_compile_cache_shared_by_two_jobs_is_warm_for_the_second(
    kubectl: Kubectl, job_namespace: tuple[str, Path]
) -> None:
    """Two consecutive jobs on one compile-cache claim, each with a precompile trial: the first compiles, the
    second's trial finds every graph in the cache. status.compileCache says so (from the trial's termination
    message), and the second reaches its first training step sooner. By how much: `make bench` (compile-cache)."""
    ns, _ = job_namespace
    doc = yaml.safe_load((JOBS / "ja-precompile.yaml").read_text())
    reports, delays = {}, {}
    for name in ("cold-cache", "warm-cache"):
        doc["metadata"]["name"] = name
        kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(doc))
        job = _run_to_end(kubectl, ns, name)
        assert job["status"]["phase"] == "Succeeded", f"{job['status']}\n{_diagnose(kubectl, ns)}"
        reports[name] = job["status"].get("compileCache")
        delays[name] = _first_step_after_start(kubectl, ns, f"{name}-rank-0")
    cold, warm = reports["cold-cache"], reports["warm-cache"]
    assert cold and cold["warm"] is False and cold["graphMisses"] > 0, reports
    assert warm and warm["warm"] is True and warm["graphMisses"] == 0 and warm["graphHits"] > 0, reports
    assert warm["entriesBefore"] >= cold["entriesAfter"] > 0, reports
    events = kubectl("-n", ns, "get", "events", "--field-selector=involvedObject.name=warm-cache", "-o", "json")
    assert any(e["reason"] == "CompileCache" and "warm" in e["message"] for e in json.loads(events.stdout)["items"]), (
        events.stdout[-2000:]
    )
    assert delays["warm-cache"] < delays["cold-cache"], delays
