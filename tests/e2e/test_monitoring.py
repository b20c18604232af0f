"""Every query of the shipped Grafana dashboard, evaluated by a real Prometheus that scrapes the in-cluster operator
while a real job trains on the two nodes.

Prometheus (built from its Go module with Kubernetes service discovery, ftjob_cluster.prometheus) runs on this host with
the scrape job a prometheus-operator makes from the ServiceMonitor of the chart the session released (pulled from its
registry and rendered by helm for its release with serviceMonitor.enabled and a 1 s interval): it discovers the metrics
Service's endpoints through the API server, with the cluster's kubeconfig (its server, CA and credentials), and scrapes
the operator pod at its pod IP (this host routes to both nodes' pod networks), as a kube-prometheus-stack in the cluster
would. ja-long trains (the runtime's own progress lines, which the operator reads from rank 0's log every 30 s) and a
second job fails at its deadline, so the per-job gauges, the transitions, the pass durations and the failures all have
series. Each panel target and each variable query, with Grafana's variables substituted, must return series; a few
values are checked too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Kubectl
from conftest import OPERATOR_NS, RELEASE_NAME, NodeCluster, Release, helm
from dashboards import dashboards, queries, substitute, variables

from ftjob_cluster.localcluster import wait_for
from ftjob_cluster.prometheus import Prometheus, discovered_scrape_configs, prometheus_config

JOBS = Path(__file__).resolve().parent / "jobs"
JOB = "ja-long"
LATE = "late"
JOB_TIMEOUT = 1200.0
SCRAPE_INTERVAL_S = 1
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval): its shortest value.
RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL_S}s"
METRICS_SERVICE = f"{RELEASE_NAME}-finetune-operator-metrics"


def service_monitor(node_cluster: NodeCluster, release: Release) -> dict[str, Any]:
    """The ServiceMonitor of the session's released chart (pulled from the registry), rendered by the pinned helm for
    the session's release with the monitor on and a 1 s interval (the chart's default is 30 s)."""
    out = helm(
        node_cluster,
        release,
        "template",
        RELEASE_NAME,
        *release.helm_args(),
        "-n",
        OPERATOR_NS,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        f"metrics.serviceMonitor.interval={SCRAPE_INTERVAL_S}s",
        "--set",
        f"metrics.serviceMonitor.scrapeTimeout={SCRAPE_INTERVAL_S}s",
    ).stdout
    (monitor,) = [o for o in yaml.safe_load_all(out) if o and o["kind"] == "ServiceMonitor"]
    return dict(monitor)


@pytest.fixture
def prometheus(node_cluster: NodeCluster, release: Release, operator: str, tmp_path: Path) -> Iterator[Prometheus]:
    configs = discovered_scrape_configs(service_monitor(node_cluster, release), node_cluster.kubeconfig)
    config = prometheus_config(configs, evaluation_interval=f"{SCRAPE_INTERVAL_S}s")
    with Prometheus(tmp_path / "prometheus", config) as prom:
        yield prom


def _operator_pods(kubectl: Kubectl) -> dict[str, str]:
    """Name -> pod IP of the release's running operator pods."""
    selector = f"app.kubernetes.io/name=finetune-operator,app.kubernetes.io/instance={RELEASE_NAME}"
    pods = json.loads(kubectl("-n", OPERATOR_NS, "get", "pods", "-l", selector, "-o", "json").stdout)["items"]
    return {
        p["metadata"]["name"]: p["status"].get("podIP", "")
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def _phase(kubectl: Kubectl, ns: str, name: str) -> str | None:
    job = json.loads(kubectl("-n", ns, "get", "ftj", name, "-o", "json").stdout)
    return job.get("status", {}).get("phase")


def _training_job() -> str:
    """ja-long with 10000 steps: it must still train after two of the operator's progress reads (30 s apart) and
    Prometheus' scrapes of them, however slow this machine is; the test ends it by deleting its namespace."""
    job = yaml.safe_load((JOBS / f"{JOB}.yaml").read_text())
    job["spec"]["training"]["maxSteps"] = 10000
    return json.dumps(job)


def _late_job() -> str:
    """ja-long under another name and output path, with a 5 s activeDeadlineSeconds: it fails DeadlineExceeded."""
    job = yaml.safe_load((JOBS / f"{JOB}.yaml").read_text())
    job["metadata"]["name"] = LATE
    job["spec"]["output"]["path"] = LATE
    job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 5
    return json.dumps(job)


def test_prometheus_discovers_and_scrapes_the_operator_pod_as_the_service_monitor_says(
    prometheus: Prometheus, kubectl: Kubectl
) -> None:
    """The target comes from the API server (the Endpoints of the metrics Service), is the operator pod's IP and
    port, and carries the labels prometheus-operator's relabelling gives it."""
    pods = _operator_pods(kubectl)

    def scraped() -> list[dict[str, Any]] | None:
        targets = prometheus.targets()
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = wait_for(scraped, timeout=120, interval=1.0, message=f"the operator scraped ({prometheus.targets()})")
    assert isinstance(targets, list)
    assert {t["labels"]["pod"] for t in targets} == set(pods), (targets, pods)
    for t in targets:
        assert t["scrapePool"] == f"serviceMonitor/{OPERATOR_NS}/{RELEASE_NAME}-finetune-operator/0"
        assert t["discoveredLabels"]["__meta_kubernetes_service_name"] == METRICS_SERVICE
        assert t["scrapeUrl"] == f"http://{pods[t['labels']['pod']]}:8080/metrics", t
        assert {k: t["labels"][k] for k in ("namespace", "service", "endpoint", "job", "container")} == {
            "namespace": OPERATOR_NS,
            "service": METRICS_SERVICE,
            "endpoint": "metrics",
            "job": METRICS_SERVICE,
            "container": "operator",
        }, t["labels"]


def test_every_dashboard_query_returns_series_while_a_job_trains(
    prometheus: Prometheus, kubectl: Kubectl, job_namespace: tuple[str, Path]
) -> None:
    ns, _ = job_namespace
    kubectl("-n", ns, "apply", "-f", "-", input=_training_job())
    kubectl("-n", ns, "apply", "-f", "-", input=_late_job())
    wait_for(lambda: _phase(kubectl, ns, LATE) == "Failed", timeout=300, interval=2.0, message=f"{LATE} Failed")
    values = {"namespace": ns, "job": JOB, "__rate_interval": RATE_INTERVAL, "datasource": "prom"}
    checks = [(name, q) for name, dashboard in dashboards().items() for q in queries(dashboard)]
    assert len(checks) >= 14, checks
    for name, q in checks:
        assert variables(q.expr) <= values.keys(), f"{name} {q.where}: unknown variables in {q.expr}"
    empty: list[str] = []

    def every_query_answers() -> bool:
        """True once each query returns series (each variable lists the job's namespace and name); `empty` says
        which do not yet. The time left needs two different steps scraped: two of the operator's progress reads."""
        empty.clear()
        for name, q in checks:
            expr = substitute(q.expr, values)
            if q.label is not None:
                if {"namespace": ns, "job_name": JOB}[q.label] not in prometheus.label_values(q.label, expr):
                    empty.append(f"{name} {q.where}: {expr}")
            elif not prometheus.query(expr):
                empty.append(f"{name} {q.where}: {expr}")
        return not empty

    try:
        wait_for(every_query_answers, timeout=JOB_TIMEOUT, interval=5.0, message="every dashboard query answered")
    except TimeoutError:
        pytest.fail(f"no series for {empty}; {JOB} is {_phase(kubectl, ns, JOB)}")
    assert _phase(kubectl, ns, JOB) == "Running", "the job ended before every query answered"

    # A few answers, beyond "some series": the job's own numbers, and the failure by namespace and reason.
    selector = f'{{namespace="{ns}", job_name="{JOB}"}}'
    (progress,) = prometheus.query(f"finetune_operator_job_progress_ratio{selector}")
    assert 0 < float(progress["value"][1]) < 1
    (tokens,) = prometheus.query(f"finetune_operator_job_tokens_per_second{selector}")
    assert float(tokens["value"][1]) > 0
    (mfu,) = prometheus.query(f"finetune_operator_job_mfu_ratio{selector}")
    assert 0 < float(mfu["value"][1]) < 1
    failures = prometheus.query(f'finetune_operator_job_failures_total{{namespace="{ns}"}}')
    assert [(f["metric"]["reason"], f["value"][1]) for f in failures] == [("DeadlineExceeded", "1")], failures
    assert prometheus.query("sum(finetune_operator_reconcile_duration_seconds_count)")[0]["value"][1] != "0"
