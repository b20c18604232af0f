"""Prometheus metrics of the operator, served on --metrics-port (/metrics)."""

from __future__ import annotations

from prometheus_client import Counter, start_http_server

RECONCILES = Counter("finetune_operator_reconciles_total", "Reconcile passes completed")
RECONCILE_ERRORS = Counter("finetune_operator_reconcile_errors_total", "Reconcile passes that raised")
TRANSITIONS = Counter(
    "finetune_operator_job_transitions_total", "Job phase transitions", labelnames=("phase", "reason")
)


def start_metrics_server(port: int) -> None:
    start_http_server(port)
