"""Prometheus metrics of the operator, served on --metrics-port (/metrics).

The per-job gauges come from status.progress (rank 0's progress lines, progress.py) and exist only while a job
trains: controller.JobLoop sets them when it reads progress and clears them when the job leaves Running, is
deleted, or its loop stops, so a finished job leaves no stale series behind. The chart's Grafana dashboard
(charts/finetune-operator/dashboards/) queries these names; tests/chart checks it against `exported_names()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, start_http_server
from prometheus_client.metrics import MetricWrapperBase

RECONCILES = Counter("finetune_operator_reconciles_total", "Reconcile passes completed")
RECONCILE_ERRORS = Counter("finetune_operator_reconcile_errors_total", "Reconcile passes that raised")
TRANSITIONS = Counter(
    "finetune_operator_job_transitions_total", "Job phase transitions", labelnames=("phase", "reason")
)

# The job's namespace and name. `job_name`, not `job`: Prometheus gives every series a `job` label of its own (the
# scrape job) and would rename ours to `exported_job`; kube-state-metrics names Jobs the same way. `namespace`
# would clash with the target's namespace label too, so the chart's ServiceMonitor sets honorLabels.
JOB_LABELS = ("namespace", "job_name")
JOB_PROGRESS = Gauge(
    "finetune_operator_job_progress_ratio", "Training steps done / total steps of a training job (0-1)", JOB_LABELS
)
JOB_STEP = Gauge("finetune_operator_job_step", "Newest training step reported by a training job's rank 0", JOB_LABELS)
JOB_TOTAL_STEPS = Gauge("finetune_operator_job_total_steps", "Total training steps of a training job", JOB_LABELS)
JOB_SAMPLES_PER_SECOND = Gauge(
    "finetune_operator_job_samples_per_second",
    "Training throughput of a job over all its ranks, in samples/s, between its last two progress lines",
    JOB_LABELS,
)
JOB_GAUGES = (JOB_PROGRESS, JOB_STEP, JOB_TOTAL_STEPS, JOB_SAMPLES_PER_SECOND)
COLLECTORS: tuple[MetricWrapperBase, ...] = (RECONCILES, RECONCILE_ERRORS, TRANSITIONS, *JOB_GAUGES)


def set_job_progress(namespace: str, job: str, progress: Mapping[str, Any]) -> None:
    """The gauges of one training job from its status.progress; a precompile trial run is not training."""
    if progress.get("event") == "precompile":
        clear_job(namespace, job)
        return
    step, total, sps = progress.get("step"), progress.get("totalSteps"), progress.get("samplesPerSecond")
    if isinstance(step, int):
        JOB_STEP.labels(namespace, job).set(step)
    if isinstance(total, int) and total > 0:
        JOB_TOTAL_STEPS.labels(namespace, job).set(total)
        if isinstance(step, int):
            JOB_PROGRESS.labels(namespace, job).set(min(1.0, step / total))
    if isinstance(sps, int | float):
        JOB_SAMPLES_PER_SECOND.labels(namespace, job).set(sps)


def clear_job(namespace: str, job: str) -> None:
    """Drops every series of the job (no-op for those it never had)."""
    for gauge in JOB_GAUGES:
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, job)


def exported_names() -> set[str]:
    """The sample names /metrics carries for our collectors (counters as `<name>_total` and `<name>_created`)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum"),
        "summary": ("", "_count", "_sum"),
    }
    return {m.name + s for c in COLLECTORS for m in c.describe() for s in suffixes[m.type]}


def start_metrics_server(port: int) -> None:
    start_http_server(port)
