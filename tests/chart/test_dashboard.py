"""The chart's Grafana dashboard: shipped in a ConfigMap for the sidecar when switched on, and every query in it
names only metrics (and labels) that the operator exports, read from the real prometheus_client registry that
its /metrics endpoint serves."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from chartlib import CHART, NAMESPACE, Renderer, Values, find, one
from dashboards import queries
from prometheus_client import REGISTRY

from finetune_operator import metrics

DASHBOARD = CHART / "dashboards" / "finetune-operator.json"
CONFIGMAP = "finetune-operator-dashboard"

# PromQL words that are not metric names (operators, modifiers, grouping) and literals.
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "atan2",
}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}")


def _strip(expr: str) -> str:
    """The expression without Grafana variables, strings and range/subquery brackets."""
    expr = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_]\w*", "", expr)
    expr = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    return re.sub(r"\[[^\]]*\]", "", expr)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are not functions, keywords, label names
    inside a selector's braces or a grouping clause."""
    rest = _GROUPING.sub(" ", re.sub(r"\{[^}]*\}", " ", _strip(expr)))
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", rest):
        if m.group(2) is None and m.group(1) not in _KEYWORDS:
            names.add(m.group(1))
    return names


def label_names(expr: str) -> set[str]:
    """Label names the expression matches on (selectors) or groups by."""
    stripped = _strip(expr)
    out = {
        m.group(1)
        for sel in _SELECTOR.finditer(stripped)
        for m in re.finditer(r"([A-Za-z_]\w*)\s*(=~|!~|!=|=)", sel.group(2))
    }
    for m in _GROUPING.finditer(stripped):
        out |= {w.strip() for w in m.group(2).split(",") if w.strip()}
    return out


def test_the_parser_finds_foreign_metrics_and_labels() -> None:
    """The check below cannot pass vacuously: a query of another exporter's metric is seen as such."""
    expr = 'sum by (mode) (rate(node_cpu_seconds_total{job="node", mode!="idle"}[$__rate_interval])) > bool 0'
    assert metric_names(expr) == {"node_cpu_seconds_total"}
    assert label_names(expr) == {"job", "mode"}


def exported_labels() -> dict[str, set[str]]:
    """Sample name -> label names, as /metrics shows them with one training job, one transition and one failure."""
    metrics.set_job_progress(
        "ns",
        "j",
        {"event": "train", "step": 1, "totalSteps": 4, "samplesPerSecond": 2.0},
        {"tokensPerSecond": 100.0, "mfu": 0.2},
    )
    metrics.TRANSITIONS.labels(phase="Running", reason="Started")
    metrics.JOB_FAILURES.labels(namespace="ns", reason="OOMKilled")
    try:
        return {
            s.name: set(s.labels)
            for fam in REGISTRY.collect()
            for s in fam.samples
            if s.name.startswith("finetune_operator_")
        }
    finally:
        metrics.clear_job("ns", "j")


def test_every_query_names_only_metrics_the_operator_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = metrics.exported_names()
    labels = exported_labels()
    assert set(labels) == exported
    found = list(queries(dashboard))
    assert len(found) >= 8
    used: set[str] = set()
    for q in found:
        where, expr, read = q.where, q.expr, {q.label} if q.label else set()
        names = metric_names(expr)
        assert names, f"{where}: names no metric: {expr}"
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported by the operator: {expr}"
        known = set().union(*(labels[n] for n in names))
        missing = (label_names(expr) | read) - known
        assert not missing, f"{where}: labels {sorted(missing)} are not on {sorted(names)}: {expr}"
        used |= names
    # Every per-job gauge is on the dashboard: progress and throughput are what it is for; so are the pass
    # durations and the failures.
    assert {g.describe()[0].name for g in metrics.JOB_GAUGES} <= used
    assert {"finetune_operator_reconcile_duration_seconds_bucket", "finetune_operator_job_failures_total"} <= used


def test_dashboard_is_shipped_for_the_sidecar_when_enabled(render: Renderer) -> None:
    assert find(render(), "ConfigMap", CONFIGMAP) == []  # off by default
    cm = one(render(Values().grafana_dashboard()), "ConfigMap", CONFIGMAP, NAMESPACE)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["finetune-operator.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_label_namespace_and_annotations_are_configurable(render: Renderer) -> None:
    values = Values().grafana_dashboard(
        label="grafana.com/dashboard",
        labelValue="training",
        namespace="monitoring",
        annotations={"grafana_folder": "Training"},
    )
    cm = one(render(values), "ConfigMap", CONFIGMAP, "monitoring")
    assert cm["metadata"]["labels"]["grafana.com/dashboard"] == "training"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Training"}


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"labelValue": 1}, "/grafanaDashboard/labelValue"),
        ({"label": "not a label"}, "/grafanaDashboard/label"),
        ({"namespace": "Monitoring"}, "/grafanaDashboard/namespace"),
        ({"enabled": "true"}, "/grafanaDashboard/enabled"),
        ({"folder": "Training"}, "/grafanaDashboard"),
    ],
)
def test_bad_dashboard_values_are_rejected(render: Renderer, values: dict[str, Any], path: str) -> None:
    result = render.run(Values().grafana_dashboard(**values))
    assert result.returncode != 0 and path in result.stderr, result.stderr
