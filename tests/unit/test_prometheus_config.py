"""The scrape jobs made from a ServiceMonitor (tools/cluster/ftjob_cluster/prometheus.py) follow prometheus-operator's
selection rules: the Service must match the selector and the namespace selector and have the named port.
tests/controlplane/test_dashboard_queries.py scrapes the real operator with the static job, tests/e2e/test_monitoring.py
the in-cluster operator pods with the discovered one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ftjob_cluster.prometheus import PrometheusError, discovered_scrape_configs, scrape_configs_from_service_monitor

MONITOR: dict[str, Any] = {
    "metadata": {"name": "op", "namespace": "mon"},
    "spec": {
        "selector": {"matchLabels": {"app": "op"}},
        "namespaceSelector": {"matchNames": ["mon"]},
        "endpoints": [{"port": "metrics", "path": "/m", "interval": "5s", "honorLabels": True}],
    },
}
SERVICE: dict[str, Any] = {
    "metadata": {"name": "op-metrics", "namespace": "mon", "labels": {"app": "op", "extra": "x"}},
    "spec": {"ports": [{"name": "metrics", "port": 9100}]},
}


def test_a_selected_service_becomes_a_static_target_with_the_endpoints_settings() -> None:
    (job,) = scrape_configs_from_service_monitor(MONITOR, [SERVICE])
    assert job == {
        "job_name": "serviceMonitor/mon/op/0",
        "metrics_path": "/m",
        "scheme": "http",
        "honor_labels": True,
        "scrape_interval": "5s",
        "static_configs": [
            {
                "targets": ["127.0.0.1:9100"],
                "labels": {"namespace": "mon", "service": "op-metrics", "endpoint": "metrics", "job": "op-metrics"},
            }
        ],
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["metadata"]["labels"].update(app="other"), "selects none"),
        (lambda s: s["metadata"].update(namespace="elsewhere"), "selects none"),
        (lambda s: s["spec"]["ports"][0].update(name="http"), "no port named 'metrics'"),
    ],
)
def test_a_service_the_monitor_would_not_scrape_is_refused(change: Any, message: str) -> None:
    service = copy.deepcopy(SERVICE)
    change(service)
    with pytest.raises(PrometheusError, match=message):
        scrape_configs_from_service_monitor(MONITOR, [service])


def test_the_discovered_job_keeps_the_selected_services_named_port_as_prometheus_operator_does(tmp_path: Any) -> None:
    monitor = copy.deepcopy(MONITOR)
    monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "op"
    (job,) = discovered_scrape_configs(monitor, tmp_path / "kubeconfig")
    assert (job["job_name"], job["metrics_path"], job["honor_labels"], job["scrape_interval"]) == (
        "serviceMonitor/mon/op/0",
        "/m",
        True,
        "5s",
    )
    assert job["kubernetes_sd_configs"] == [
        {"role": "endpoints", "kubeconfig_file": str(tmp_path / "kubeconfig"), "namespaces": {"names": ["mon"]}}
    ]
    keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keeps == [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_service_label_app", "__meta_kubernetes_service_labelpresent_app"],
            "regex": "(op);true",
        },
        {
            "action": "keep",
            "source_labels": [
                "__meta_kubernetes_service_label_app_kubernetes_io_name",
                "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name",
            ],
            "regex": "(op);true",
        },
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": "metrics"},
    ]
    targets = {r["target_label"]: r for r in job["relabel_configs"] if "target_label" in r}
    assert targets["namespace"]["source_labels"] == ["__meta_kubernetes_namespace"]
    assert targets["job"]["source_labels"] == ["__meta_kubernetes_service_name"]
    assert targets["endpoint"]["replacement"] == "metrics"
    assert targets["pod"]["source_labels"] == ["__meta_kubernetes_pod_name"]


def test_a_monitor_of_any_namespace_discovers_in_every_namespace(tmp_path: Any) -> None:
    monitor = copy.deepcopy(MONITOR)
    monitor["spec"]["namespaceSelector"] = {"any": True}
    (job,) = discovered_scrape_configs(monitor, tmp_path / "kubeconfig")
    assert "namespaces" not in job["kubernetes_sd_configs"][0]
