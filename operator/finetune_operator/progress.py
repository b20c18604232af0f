"""The runtime's FTJOB_PROGRESS lines -> status.progress (and the Progress column of `kubectl get ftj`).

Used by the operator (on rank 0's log tail) and by `ftjob run` (on the local stdout) alike.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from .constants import PROGRESS_PREFIX

# JSON has no NaN or Infinity, but Python's json reads (and writes) them. A diverged loss must never reach the
# status (the API server stores JSON) or the summary: such values are dropped, as if the line had left them out.
_NONFINITE = object()


def _float(text: str) -> Any:
    value = float(text)  # '1e999' parses to inf
    return value if math.isfinite(value) else _NONFINITE


_DECODER = json.JSONDecoder(parse_constant=lambda _: _NONFINITE, parse_float=_float)


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items() if v is not _NONFINITE}
    if isinstance(value, list):
        return [_finite(v) for v in value if v is not _NONFINITE]
    return value


_KEEP = (
    "event",
    "step",
    "totalSteps",
    "epoch",
    "loss",
    "samplesPerSecond",
    "etaSeconds",
    "learningRate",
    "time",
    "summaryMetric",
    # what status.throughput is derived from (throughput.py): rates, the mean padded length of a sample, the
    # precision the runtime trains in, the model's numbers as rank 0 counted them (or a command's own FLOPs)
    "meanSamplesPerSecond",
    "tokensPerSecond",
    "paddedTokensPerSecond",
    "paddedTokensPerSample",
    "precision",
    "model",
    "flopsPerSample",
)


def parse_line(line: str) -> dict[str, Any] | None:
    """One progress record, or None for any other line (torchrun/mpirun prefix lines with '[rank]: ' etc.)."""
    idx = line.find(PROGRESS_PREFIX)
    if idx < 0:
        return None
    try:
        # raw_decode: text after the object (another rank's output joined onto the line) is ignored.
        data, _ = _DECODER.raw_decode(line[idx + len(PROGRESS_PREFIX) :].lstrip())
    except json.JSONDecodeError:
        return None
    return _finite(data) if isinstance(data, dict) else None


def fold(records: list[dict[str, Any]], previous: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Latest state from a sequence of records: newest step counters, newest eval metrics kept alongside."""
    state = dict(previous or {})
    seen = False
    for rec in records:
        seen = True
        for k in _KEEP:
            if k in rec and rec[k] is not None:
                state[k] = rec[k]
        if rec.get("metrics"):
            state["metrics"] = rec["metrics"]
        if (first := time_to_first_step(rec)) is not None:
            state["timeToFirstStepSeconds"] = first
    if not seen:
        return previous
    state["summary"] = summarize(state)
    return state


def time_to_first_step(rec: dict[str, Any]) -> float | None:
    """Seconds from the start of the process that launched rank 0 (`startedAt`: the pod's main process, or `ftjob
    run`) to the end of rank 0's first training step (`firstStepAt`), as a train line reports them
    (docs/runtime.md, "Time to the first step"); None when the line does not carry both, or they make no sense."""
    if rec.get("event") != "train":
        return None
    try:
        started = datetime.fromisoformat(str(rec["startedAt"]))
        first = datetime.fromisoformat(str(rec["firstStepAt"]))
        seconds = (first - started).total_seconds()
    except (KeyError, TypeError, ValueError):  # absent, malformed, or one naive and one aware
        return None
    return round(seconds, 2) if seconds >= 0 else None


def from_text(text: str, previous: dict[str, Any] | None = None) -> dict[str, Any] | None:
    return fold([r for r in (parse_line(x) for x in text.splitlines()) if r is not None], previous)


def _duration(seconds: float) -> str:
    s = int(max(0, seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def summary_metric(p: dict[str, Any]) -> str | None:
    """'perplexity 3.2': the metric the runtime names as its task's headline (summaryMetric: the task plugin's
    first metric), when the newest eval reported it. Lines without summaryMetric (a job's own command may print
    progress lines) show the alphabetically first metric: the same one whatever order the object came in."""
    metrics = {
        k: v for k, v in (p.get("metrics") or {}).items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    key = p.get("summaryMetric")
    if not isinstance(key, str):
        key = min(metrics, default=None)
    return f"{key} {metrics[key]:.3g}" if key in metrics else None


def summarize(p: dict[str, Any]) -> str:
    """Short text for the printer column, e.g. '120/500 (24%) loss 0.41 ETA 1m36s'."""
    event = p.get("event")
    step, total = p.get("step"), p.get("totalSteps")
    parts: list[str] = []
    if event == "precompile":
        parts.append("precompiling")
    if isinstance(step, int) and isinstance(total, int) and total > 0:
        parts.append(f"{step}/{total} ({100 * step // total}%)")
    if isinstance(p.get("loss"), int | float) and event != "done":
        parts.append(f"loss {p['loss']:.3g}")
    headline = summary_metric(p)
    if headline:
        parts.append(headline)
    if event == "done":
        parts.append("done")
    elif isinstance(p.get("etaSeconds"), int | float):
        parts.append(f"ETA {_duration(p['etaSeconds'])}")
    return " ".join(parts)
