"""Prometheus metrics of the operator, served on --metrics-port (/metrics).

Operator-wide series: full reconcile passes (a count, errors, and a histogram of their duration labelled only by
outcome, so its cardinality does not grow with the number of jobs), phase transitions, and job failures by
namespace and reason (both bounded: namespaces are few, reasons are the operator's own constants), and whether
this process is the one that acts (leader election).

The per-job gauges come from status.progress and status.throughput (rank 0's progress lines, progress.py and
throughput.py) and exist only while a job trains: controller.JobLoop sets them when it reads progress and clears
them when the job leaves Running, is deleted, or its loop stops, so a finished job leaves no stale series behind.
The chart's Grafana dashboard (charts/finetune-operator/dashboards/) queries these names; tests/chart checks it
against `exported_names()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

RECONCILES = Counter("finetune_operator_reconciles_total", "Reconcile passes completed")
RECONCILE_ERRORS = Counter("finetune_operator_reconcile_errors_total", "Reconcile passes that raised")
TRANSITIONS = Counter(
    "finetune_operator_job_transitions_total", "Job phase transitions", labelnames=("phase", "reason")
)
# controller.JobLoop._full_pass observes each pass: read the job, plan, apply (API calls included). `result` is
# "success" or "error" (the pass raised). Buckets from 5 ms (a pass that changes nothing) to a minute (a pass
# creating many children against a slow API server).
RECONCILE_DURATION = Histogram(
    "finetune_operator_reconcile_duration_seconds",
    "Seconds one full reconcile pass of a job took (read, plan, apply)",
    labelnames=("result",),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
PASS_RESULTS = ("success", "error")
for _result in PASS_RESULTS:  # both series exist from the start, so rates and ratios never lack one
    RECONCILE_DURATION.labels(result=_result)
# A job entering phase Failed, by its namespace and status.reason (OOMKilled, BackoffLimitExceeded,
# DeadlineExceeded, InvalidSpec, ...): counted by count_failure() where the controller writes that phase.
JOB_FAILURES = Counter(
    "finetune_operator_job_failures_total",
    "Jobs that entered phase Failed, by the job's namespace and status.reason",
    labelnames=("namespace", "reason"),
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
# From status.throughput (throughput.py): set only where the job's lines give them (a spec.command job's may not)
# and, for MFU, where its device has a public peak at the precision in use.
JOB_TOKENS_PER_SECOND = Gauge(
    "finetune_operator_job_tokens_per_second",
    "Non-padding tokens/s of a training job over all its ranks, between its last two progress lines",
    JOB_LABELS,
)
JOB_MFU = Gauge(
    "finetune_operator_job_mfu_ratio",
    "Model FLOPs utilisation of a training job (0-1): model FLOPs/s over the dense peak of its devices at its "
    "precision",
    JOB_LABELS,
)
JOB_GAUGES = (JOB_PROGRESS, JOB_STEP, JOB_TOTAL_STEPS, JOB_SAMPLES_PER_SECOND, JOB_TOKENS_PER_SECOND, JOB_MFU)
# 1 while this process acts: it holds the leader Lease (leader.Elector), or runs without leader election; 0
# while it stands by. Over the replicas of one operator the sum is 1 (0 during a failover).
LEADER = Gauge("finetune_operator_leader", "1 while this operator process acts (holds the leader Lease), 0 on standby")
COLLECTORS: tuple[MetricWrapperBase, ...] = (
    LEADER,
    RECONCILES,
    RECONCILE_ERRORS,
    RECONCILE_DURATION,
    TRANSITIONS,
    JOB_FAILURES,
    *JOB_GAUGES,
)


def observe_pass(seconds: float, failed: bool) -> None:
    """One full reconcile pass took `seconds`; `failed` when it raised."""
    RECONCILE_DURATION.labels(result="error" if failed else "success").observe(seconds)


def count_failure(namespace: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Counts the job as failed when this status write takes it into Failed (a write that keeps it Failed, as
    every later pass of a failed job does, counts nothing)."""
    if new.get("phase") == "Failed" and old.get("phase") != "Failed":
        JOB_FAILURES.labels(namespace=namespace, reason=str(new.get("reason") or "Failed")).inc()


def set_job_progress(
    namespace: str, job: str, progress: Mapping[str, Any], throughput: Mapping[str, Any] | None = None
) -> None:
    """The gauges of one training job from its status.progress and status.throughput; a precompile trial run is
    not training. A figure the status lacks leaves its gauge without a series (none is made up)."""
    if progress.get("event") == "precompile":
        clear_job(namespace, job)
        return
    for gauge, key in ((JOB_TOKENS_PER_SECOND, "tokensPerSecond"), (JOB_MFU, "mfu")):
        value = (throughput or {}).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            gauge.labels(namespace, job).set(value)
        else:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, job)
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
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum"),
    }
    return {m.name + s for c in COLLECTORS for m in c.describe() for s in suffixes[m.type]}


def start_metrics_server(port: int) -> None:
    start_http_server(port)
