"""Calibration records from FineTuneJobs that ran: a Succeeded job's spec and its status.throughput (what its rank 0
measured, the operator keeps it after the job ends) describe one measured run, in the record format of
docs/estimate.md. `ftjob estimate --calibration-from-cluster` reads them from the cluster; `--calibration FILE`
reads them from a saved `kubectl get ftj -o yaml` (a record outlives its job only so: deleting the job, by hand or
by ttlSecondsAfterFinished, deletes its status).

FineTuneJob dicts in, records out (raw ones in the documented format, which calibration.parse_record reads like any
other); `load_calibration` also reads the record files and the job lists `ftjob estimate --calibration` names.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..admission import validate
from ..api.validation import InvalidSpec
from ..builders.layout import resolve
from ..constants import KIND
from .calibration import Record, parse_record, parse_records, shipped_records
from .predict import dataset_id
from .workload import rank_share

RUN_ORIGIN = "a FineTuneJob of "  # Record.origin of a job's record: then the file's path, or "the cluster"


def is_jobs(doc: Any) -> bool:
    """A FineTuneJob, or a list of them (`kubectl get ftj -o yaml`: kind List)."""
    if not isinstance(doc, Mapping):
        return False
    if doc.get("kind") == KIND:
        return True
    items = doc.get("items")
    return isinstance(items, list) and all(isinstance(i, Mapping) and i.get("kind", KIND) == KIND for i in items)


def jobs_of(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(doc)] if doc.get("kind") == KIND else [dict(i, kind=KIND) for i in doc.get("items") or []]


def record_from_job(job: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the job's record, None), or (None, why it is not one)."""
    meta = job.get("metadata") or {}
    ref = f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"
    status = job.get("status") or {}
    if status.get("phase") != "Succeeded":
        return None, f"{ref}: not Succeeded"
    measured = status.get("throughput") or {}
    spec = job.get("spec") or {}
    if spec.get("command") or not spec.get("task"):
        return None, f"{ref}: a spec.command job (the estimate models the runtime's tasks)"
    sps = measured.get("meanSamplesPerSecond") or measured.get("samplesPerSecond")
    tokens = measured.get("paddedTokensPerSample")
    if not isinstance(sps, int | float) or sps <= 0 or not isinstance(tokens, int | float) or tokens <= 0:
        return None, f"{ref}: status.throughput has no samples/s and padded tokens per sample"
    try:
        valid = validate({k: v for k, v in job.items() if k != "status"})
    except InvalidSpec as e:
        return None, f"{ref}: invalid spec ({'; '.join(str(x) for x in e.errors)})"
    task, training = valid["spec"]["task"], valid["spec"].get("training") or {}
    layout = resolve(valid)
    kind, per_rank = rank_share(layout)
    if kind is None:
        return None, f"{ref}: profile {layout.profile.name} has no throughput data for its device"
    which = "meanSamplesPerSecond" if measured.get("meanSamplesPerSecond") else "samplesPerSecond"
    record: dict[str, Any] = {
        "id": f"{ref} ({meta.get('uid', 'no uid')})",
        "source": f"status.throughput of FineTuneJob {ref} (uid {meta.get('uid')}), {which}",
        "date": str(status.get("completionTime") or "")[:10] or None,
        "note": "measured by the runtime's rank 0 over the run, evaluation and checkpoints inside",
        "profile": layout.profile.name,
        "instanceType": layout.instance.name if layout.instance else None,
        "device": kind.name,
        "nodes": layout.nodes,
        "procsPerNode": layout.procs_per_node,
        "devicesPerRank": per_rank,
        "precision": measured.get("precision") or training.get("precision", "fp32"),
        "compile": bool(training.get("compile", False)) and layout.profile.backend != "neuron",
        "task": task["type"],
        "model": task["model"],
        "dataset": dataset_id(task),
        "maxLength": int(task.get("maxLength", 128)),
        "tokensPerSample": float(tokens),
        "batchSizePerDevice": int(training.get("batchSizePerDevice", 8)),
        "gradientAccumulationSteps": int(training.get("gradientAccumulationSteps", 1)),
        "samplesPerSecond": float(sps),
    }
    lora = task.get("lora")
    if lora:
        record["lora"] = {"r": int(lora.get("r", 8)), "targetModules": lora.get("targetModules")}
    numbers = measured.get("model")
    if isinstance(numbers, Mapping):
        record["modelNumbers"] = dict(numbers)  # used where the model's config.json is not at hand
    return {k: v for k, v in record.items() if v is not None}, None


def records_from_jobs(jobs: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Records of the Succeeded jobs with measured throughput, and why each other job gave none."""
    records, skipped = [], []
    for job in jobs:
        rec, why = record_from_job(job)
        if rec is not None:
            records.append(rec)
        elif why is not None:
            skipped.append(why)
    return records, skipped


def records_of_jobs(jobs: Iterable[Mapping[str, Any]], where: str) -> tuple[list[Record], list[str]]:
    """Parsed records of the jobs that ran (a record that cannot calibrate, e.g. on a device without a public
    peak, is skipped with its reason like a job that gave none)."""
    raw, skipped = records_from_jobs(jobs)
    out = []
    for r in raw:
        try:
            out.append(parse_record(r, where, RUN_ORIGIN + where))
        except ValueError as e:
            skipped.append(str(e))
    return out, skipped


def load_calibration(
    paths: Iterable[str | Path] = (), jobs: Iterable[Mapping[str, Any]] = (), shipped: bool = True
) -> tuple[list[Record], list[str]]:
    """The shipped records, each file's (YAML or JSON records, or FineTuneJobs: one, or a list as `kubectl get ftj
    -o yaml` prints; '-' reads stdin) and those of `jobs` (read from a cluster); a later record replaces an earlier
    one of the same id. Also the reasons jobs gave no record."""
    by_id = {r.id: r for r in (shipped_records() if shipped else [])}
    skipped: list[str] = []
    for path in paths:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not YAML or JSON: {e}") from None
        if is_jobs(doc):
            recs, why = records_of_jobs(jobs_of(doc), str(path))
            skipped += why
        else:
            recs = parse_records(doc, str(path), str(path))
        by_id.update((r.id, r) for r in recs)
    recs, why = records_of_jobs(jobs, "the cluster")
    skipped += why
    by_id.update((r.id, r) for r in recs)
    return list(by_id.values()), skipped
