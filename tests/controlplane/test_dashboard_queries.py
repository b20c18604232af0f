"""Every query of the shipped Grafana dashboard, evaluated by a real Prometheus that scrapes the real operator while
a job trains.

Prometheus (built from its Go module, ftjob_cluster.prometheus) scrapes the operator's /metrics with the scrape job
a prometheus-operator would make from the chart's ServiceMonitor (rendered by helm with serviceMonitor.enabled; a
static target stands in for the endpoints discovery, see ftjob_cluster/prometheus.py). One job trains (its rank 0's
progress lines served by a simulated node, as in test_operator.py) and another fails at its deadline, so the
per-job gauges, the transitions, the pass durations and the failures all have series. Each panel target and each
variable query, with Grafana's variables substituted, must return series; a few values are checked too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Cluster
from dashboards import ROOT, dashboards, queries, substitute, variables
from kubernetes import client
from operator_support import (
    Kubelet,
    NodeLogs,
    RunningOperator,
    install_crd,
    job_yaml,
    running_operator,
    status,
    two_rank_job,
)

from finetune_runtime.progress import format_line
from ftjob_cluster import bins
from ftjob_cluster.prometheus import Prometheus, prometheus_config, scrape_configs_from_service_monitor

CHART = ROOT / "charts" / "finetune-operator"
RELEASE_NAMESPACE = "finetune-operator"
SCRAPE_INTERVAL_S = 1
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval): its shortest value.
RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL_S}s"


# What a runtime train line says of throughput: samples/s, tokens, the mean padded length and the model's numbers
# (the tiny BERT's), so that the tokens/s and MFU gauges have series too.
TRAINING = {
    "samplesPerSecond": 35.2,
    "tokensPerSecond": 1800.0,
    "paddedTokensPerSecond": 2100.0,
    "paddedTokensPerSample": 60.0,
    "precision": "fp32",
    "model": {
        "layers": 2,
        "attentionWidth": 64,
        "trainableMatmulParams": 69760,
        "frozenMatmulParams": 0,
        "trainableParams": 179_714,
    },
}


def chart_scrape_configs(metrics_port: int) -> list[dict[str, Any]]:
    """The scrape jobs for the chart's ServiceMonitor and metrics Service, rendered by the pinned helm with the
    monitor on, a 1 s interval (the chart's default is 30 s) and the port the operator under test serves."""
    out = subprocess.run(
        [
            str(bins.ensure_binary("helm")),
            "template",
            "finetune-operator",
            str(CHART),
            "-n",
            RELEASE_NAMESPACE,
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            f"metrics.serviceMonitor.interval={SCRAPE_INTERVAL_S}s",
            "--set",
            f"metrics.serviceMonitor.scrapeTimeout={SCRAPE_INTERVAL_S}s",
            "--set",
            f"metrics.port={metrics_port}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    objs = [o for o in yaml.safe_load_all(out) if o]
    (monitor,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    services = [o for o in objs if o["kind"] == "Service"]
    return scrape_configs_from_service_monitor(monitor, services)


@pytest.fixture(scope="module")
def operator(
    kubectl: Any, kubeconfig: Path, wait_for: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningOperator]:
    install_crd(kubectl, wait_for)
    with running_operator(kubeconfig, wait_for, tmp_path_factory.mktemp("operator") / "operator.log") as op:
        yield op


@pytest.fixture(scope="module")
def prometheus(operator: RunningOperator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    port = int(operator.metrics_url.rsplit(":", 1)[1].split("/", 1)[0])
    config = prometheus_config(chart_scrape_configs(port), evaluation_interval=f"{SCRAPE_INTERVAL_S}s")
    with Prometheus(tmp_path_factory.mktemp("prometheus"), config) as prom:
        yield prom


def _wait_phase(kube_api: Any, ns: str, name: str, phase: str, wait_for: Any) -> None:
    wait_for(lambda: status(kube_api, ns, name).get("phase") == phase, timeout=90, message=f"{name} {phase}")


def _running(kubelet: Kubelet, name: str, wait_for: Any, node: NodeLogs | None = None) -> list[str]:
    """Both rank pods reported Running (rank 0 first bound to `node`, which serves its log)."""
    pods: list[str] = wait_for(
        lambda: len(p := [x.metadata.name for x in kubelet.live_pods(name)]) == 2 and sorted(p),
        timeout=60,
        message=f"2 pods of {name}",
    )
    if node is not None:
        node.bind(kubelet.ns, f"{name}-rank-0")
    for pod in pods:
        kubelet.set_status(pod, "Running")
    return pods


def test_the_scrape_job_is_the_service_monitors(operator: RunningOperator) -> None:
    """What the chart's ServiceMonitor says reaches Prometheus: path, interval, timeout, honour labels, the metrics
    Service's port and the labels prometheus-operator gives the target."""
    port = int(operator.metrics_url.rsplit(":", 1)[1].split("/", 1)[0])
    (job,) = chart_scrape_configs(port)
    assert job["job_name"] == f"serviceMonitor/{RELEASE_NAMESPACE}/finetune-operator/0"
    assert (job["metrics_path"], job["scheme"], job["honor_labels"]) == ("/metrics", "http", True)
    assert (job["scrape_interval"], job["scrape_timeout"]) == ("1s", "1s")
    (static,) = job["static_configs"]
    assert static["targets"] == [f"127.0.0.1:{port}"]
    assert static["labels"] == {
        "namespace": RELEASE_NAMESPACE,
        "service": "finetune-operator-metrics",
        "endpoint": "metrics",
        "job": "finetune-operator-metrics",
    }


def test_every_dashboard_query_returns_series_while_a_job_trains(
    prometheus: Prometheus,
    kubectl: Any,
    kube_api: client.ApiClient,
    namespace: str,
    cluster: Cluster,
    wait_for: Any,
) -> None:
    if cluster.pki is None:
        pytest.skip("needs the LocalCluster's CA to serve a node's logs (an external cluster has real kubelets)")
    wait_for(
        lambda: [t["health"] for t in prometheus.targets()] == ["up"],
        timeout=60,
        message=f"the operator scraped (targets: {prometheus.targets()})",
    )
    kubelet = Kubelet(kube_api, namespace)
    node = NodeLogs(kube_api, cluster.pki, f"dash-{namespace}"[:63])
    try:
        kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(two_rank_job("train")))
        kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(two_rank_job("late", activeDeadlineSeconds=3)))
        key = (namespace, "train-rank-0", "trainer")
        node.logs[key] = format_line("train", step=120, totalSteps=500, loss=0.41, **TRAINING) + "\n"
        _running(kubelet, "train", wait_for, node)
        _running(kubelet, "late", wait_for)
        _wait_phase(kube_api, namespace, "late", "Failed", wait_for)
        selector = f'{{namespace="{namespace}", job_name="train"}}'

        def step() -> float | None:
            result = prometheus.query(f"finetune_operator_job_step{selector}")
            return float(result[0]["value"][1]) if result else None

        # The operator reads rank 0's log every 30 s (pacing.PROGRESS_EVERY_S): one interval plus slack.
        wait_for(lambda: step() == 120, timeout=90, message=f"step 120 scraped (now {step()})")
        node.logs[key] += format_line("train", step=250, totalSteps=500, loss=0.3, **TRAINING) + "\n"
        wait_for(lambda: step() == 250, timeout=90, message=f"step 250 scraped (now {step()})")
        wait_for(
            lambda: prometheus.query(f'finetune_operator_job_failures_total{{namespace="{namespace}"}}'),
            timeout=30,
            message="the failed job's series scraped",
        )

        values = {"namespace": namespace, "job": "train", "__rate_interval": RATE_INTERVAL, "datasource": "prom"}
        checked = 0
        for name, dashboard in dashboards().items():
            for q in queries(dashboard):
                assert variables(q.expr) <= values.keys(), f"{name} {q.where}: unknown variables in {q.expr}"
                expr = substitute(q.expr, values)
                if q.label is not None:
                    listed = prometheus.label_values(q.label, expr)
                    assert {"namespace": namespace, "job_name": "train"}[q.label] in listed, (q.where, listed)
                else:
                    assert prometheus.query(expr), f"{name} {q.where}: no series for {expr}"
                checked += 1
        assert checked >= 14

        # A few answers, beyond "some series": the job's own numbers, and the failure by namespace and reason.
        (progress,) = prometheus.query(f"finetune_operator_job_progress_ratio{selector}")
        assert float(progress["value"][1]) == 0.5
        (tokens,) = prometheus.query(f"finetune_operator_job_tokens_per_second{selector}")
        assert float(tokens["value"][1]) == 1800.0
        (mfu,) = prometheus.query(f"finetune_operator_job_mfu_ratio{selector}")
        assert 0 < float(mfu["value"][1]) < 1
        failures = prometheus.query(f'finetune_operator_job_failures_total{{namespace="{namespace}"}}')
        assert [(f["metric"]["reason"], f["value"][1]) for f in failures] == [("DeadlineExceeded", "1")]
        left = prometheus.query(
            f"(finetune_operator_job_total_steps{selector} - finetune_operator_job_step{selector})"
            f" / deriv(finetune_operator_job_step{selector}[10m]) > 0"
        )
        assert left and float(left[0]["value"][1]) > 0
        assert prometheus.query("sum(finetune_operator_reconcile_duration_seconds_count)")[0]["value"][1] != "0"
    finally:
        kubelet.stop()
        node.close()
