"""The scrape job made from a ServiceMonitor (tools/cluster/ftjob_cluster/prometheus.py) follows prometheus-operator's
selection rules: the Service must match the selector and the namespace selector and have the named port.
tests/controlplane/test_dashboard_queries.py scrapes the real operator with it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ftjob_cluster.prometheus import PrometheusError, scrape_configs_from_service_monitor

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
