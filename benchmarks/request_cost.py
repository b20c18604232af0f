"""What each kind of write costs the control plane: API server + etcd CPU seconds per request.

    python benchmarks/request_cost.py [--requests 200] [--json OUT]

On a LocalCluster (operator_scale.py's, the CRD installed, no operator), `--requests` requests of each kind, one
after another, with the CPU time of kube-apiserver and etcd read from /proc before and after: the children of
the cpu-bert-ja sample as `ftjob render` makes them (Service, ConfigMap, rank pod), an Event, a FineTuneJob
create and a merge patch of its status (what the operator's first pass writes). From these, the control
plane's CPU per 2-rank job for the raw writes (Service + ConfigMap + 2 pods) and for the operator's path
(those + the job + one status patch + one Event): where the API server and the operator share 2 CPUs, that
ratio is a floor under operator_scale.py's makespan ratio (ours : raw) that no operator can go below.

Then what a cheaper CRD would buy (`--no-variants` skips it): the same job create and status patch with the CRD
as shipped, with every CEL rule (x-kubernetes-validations) removed, and with no schema at all (spec and status
x-kubernetes-preserve-unknown-fields), each installed in turn over the last. The API server evaluates every CEL
rule of the object on every write, status writes included (CRD validation ratcheting ignores a failing rule on
an unchanged field, but still evaluates it). Successive runs of the same kind differ by up to 20% here.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchio import scratch, write_json
from kubernetes.client.exceptions import ApiException
from operator_scale import (
    PODS_PER_JOB,
    Bench,
    _request,
    bench_cluster,
    job_manifest,
)

from finetune_operator.admission import validate
from finetune_operator.builders import desired
from finetune_operator.crd import crd as build_crd
from finetune_operator.k8s import Kube
from ftjob_cluster.localcluster import wait_for


def children(ns: str) -> dict[str, dict[str, Any]]:
    """One of each child kind of the sample, without owner (no such job exists here)."""
    job = validate(job_manifest("cost", ns))
    job["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    out = {}
    for obj in desired(job).all():
        obj["metadata"].pop("ownerReferences", None)
        out.setdefault(obj["kind"], obj)
    return out


def event(ns: str, i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"cost.{i}", "namespace": ns},
        "type": "Normal",
        "reason": "Created",
        "message": "created the job's children",
        "source": {"component": "finetune-operator"},
        "involvedObject": {
            "apiVersion": "finetune.dev/v1alpha1",
            "kind": "FineTuneJob",
            "name": f"job-{i}",
            "namespace": ns,
        },
        "count": 1,
    }


def _strip_rules(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("x-kubernetes-validations", None)
        for v in node.values():
            _strip_rules(v)
    elif isinstance(node, list):
        for v in node:
            _strip_rules(v)


def crd_variant(variant: str) -> dict[str, Any]:
    """The CRD as shipped ("shipped"), without its CEL rules ("no CEL rules"), or without a schema ("no schema")."""
    crd = copy.deepcopy(build_crd())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    if variant == "no CEL rules":
        _strip_rules(schema)
    elif variant == "no schema":
        schema.pop("x-kubernetes-validations", None)
        for part in ("spec", "status"):
            schema["properties"][part] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return crd


VARIANTS = ("shipped", "no CEL rules", "no schema")


def status_patch() -> dict[str, Any]:
    return {"status": {"phase": "Pending", "message": "creating the job's children", "restartCount": 0}}


def timed(bench: Bench, n: int, call: Callable[[int], None]) -> dict[str, float]:
    time.sleep(2)  # the previous kind's watch fan-out and scheduling settle first
    cpu, start = bench.control_plane_cpu(), time.monotonic()
    for i in range(n):
        call(i)
    return {
        "cpuMs": round((bench.control_plane_cpu() - cpu) * 1000 / n, 2),
        "wallMs": round((time.monotonic() - start) * 1000 / n, 2),
    }


def job_writes(bench: Bench, ns: str, n: int) -> dict[str, float]:
    """CPU per FineTuneJob create and per status patch, n of each, in `ns`."""
    jobs = f"/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs"
    return {
        "FineTuneJob create": timed(
            bench, n, lambda i: _request(bench.writer, "POST", jobs, job_manifest(f"job-{i}", ns))
        )["cpuMs"],
        "FineTuneJob status patch": timed(
            bench, n, lambda i: _request(bench.writer, "PATCH", f"{jobs}/job-{i}/status", status_patch())
        )["cpuMs"],
    }


def served_variant(bench: Bench, ns: str) -> str:
    """Which variant the API server validates with now, told by a dry-run create of a job that one CEL rule
    refuses (an instance type of another profile) and that carries a field no schema declares (pruned, unless
    spec has no schema)."""
    job = job_manifest("probe", ns)
    job["spec"]["hardware"]["instanceType"] = "p5.48xlarge"
    job["spec"]["probeField"] = 1
    path = f"/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs"
    try:
        answer = json.loads(Kube(bench.writer)._call("POST", path, job, query={"dryRun": "All"}))
    except ApiException as e:
        if e.status == 422:
            return "shipped"
        raise
    return "no schema" if "probeField" in answer["spec"] else "no CEL rules"


def variants(bench: Bench, n: int) -> dict[str, dict[str, float]]:
    """FineTuneJob create and status patch under each CRD variant, in a namespace of its own."""
    out = {}
    for k, variant in enumerate(VARIANTS):
        ns = bench.namespace(f"crd-{k}")
        bench.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd_variant(variant)))
        # The API server swaps in the new schema and validators a moment after the CRD is written.
        wait_for(
            lambda ns=ns, variant=variant: served_variant(bench, ns) == variant,
            timeout=60,
            message=f"the API server validating with the {variant} CRD",
        )
        out[variant] = job_writes(bench, ns, n)
        print(f"CRD {variant}: {out[variant]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200, help="requests of each kind")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-variants", action="store_true", help="skip the CRD variants (shipped, no CEL, no schema)")
    ap.add_argument("--keep-work", action="store_true", help="keep the scratch folder (etcd data, logs) after a run")
    args = ap.parse_args(argv)
    with scratch("ftjob-bench-cost-", args.keep_work) as work:
        return run(args, work)


def run(args: argparse.Namespace, work: Path) -> int:
    n = args.requests
    cluster = bench_cluster(work / "cluster", [])
    per: dict[str, dict[str, float]] = {}
    with cluster:
        bench = Bench(cluster, work / "no-audit.log", work)
        bench.install()
        ns = bench.namespace("cost")
        kids = children(ns)
        jobs = f"/apis/finetune.dev/v1alpha1/namespaces/{ns}/finetunejobs"

        def renamed(obj: dict[str, Any], i: int) -> dict[str, Any]:
            return {**obj, "metadata": {**obj["metadata"], "name": f"{obj['metadata']['name']}-{i}"}}

        kinds: dict[str, Callable[[int], None]] = {
            "Service create": lambda i: _request(
                bench.writer, "POST", f"/api/v1/namespaces/{ns}/services", renamed(kids["Service"], i)
            ),
            "ConfigMap create": lambda i: _request(
                bench.writer, "POST", f"/api/v1/namespaces/{ns}/configmaps", renamed(kids["ConfigMap"], i)
            ),
            "Pod create": lambda i: _request(
                bench.writer, "POST", f"/api/v1/namespaces/{ns}/pods", renamed(kids["Pod"], i)
            ),
            "Event create": lambda i: _request(bench.writer, "POST", f"/api/v1/namespaces/{ns}/events", event(ns, i)),
            "FineTuneJob create": lambda i: _request(bench.writer, "POST", jobs, job_manifest(f"job-{i}", ns)),
            "FineTuneJob status patch": lambda i: _request(
                bench.writer, "PATCH", f"{jobs}/job-{i}/status", status_patch()
            ),
        }
        for kind, call in kinds.items():
            per[kind] = timed(bench, n, call)
            print(f"{kind}: {per[kind]}", flush=True)
        crds = {} if args.no_variants else variants(bench, n)
    raw = per["Service create"]["cpuMs"] + per["ConfigMap create"]["cpuMs"] + PODS_PER_JOB * per["Pod create"]["cpuMs"]
    ours = (
        raw
        + per["FineTuneJob create"]["cpuMs"]
        + per["FineTuneJob status patch"]["cpuMs"]
        + per["Event create"]["cpuMs"]
    )
    doc = {
        "requests": n,
        "cpus": os.cpu_count(),
        "perRequest": per,
        "perTwoRankJobCpuMs": {"raw": round(raw, 1), "operator": round(ours, 1)},
        "floorRatio": round(ours / raw, 2),
        "crdVariantsCpuMs": crds,
    }
    print("| request | API server + etcd CPU | wall (one at a time) |\n|---|---|---|")
    for kind, v in per.items():
        print(f"| {kind} | {v['cpuMs']} ms | {v['wallMs']} ms |")
    print(f"per 2-rank job: raw {raw:.1f} ms, through the operator {ours:.1f} ms: floor ours:raw {ours / raw:.2f}x")
    if crds:
        print("\n| FineTuneJob CRD | create | status patch |\n|---|---|---|")
        for variant, v in crds.items():
            print(f"| {variant} | {v['FineTuneJob create']} ms | {v['FineTuneJob status patch']} ms |")
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
