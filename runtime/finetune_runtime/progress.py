"""Progress lines (runtime -> operator), format fixed by docs/architecture.md.

`FTJOB_PROGRESS {json}` on stdout, global rank 0 only. The operator keeps the newest line it reads from the
rank-0 pod's log, so each line must be complete on its own (one `print` with flush, compact JSON).
"""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

PREFIX = "FTJOB_PROGRESS "
EVENTS = ("precompile", "train", "eval", "checkpoint", "done")

# Trainer bookkeeping keys that are not model metrics; kept out of the "metrics" objects.
_NON_METRIC_KEYS = {"runtime", "samples_per_second", "steps_per_second", "epoch", "step"}


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_line(event: str, **fields: Any) -> str:
    """One progress line. `event` first, then fields in the order given; None values are left out."""
    if event not in EVENTS:
        raise ValueError(f"unknown progress event {event!r}; expected one of {EVENTS}")
    payload: dict[str, Any] = {"event": event}
    for k, v in fields.items():
        if v is None:
            continue
        payload[k] = _clean(v)
    return PREFIX + json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def parse_line(line: str) -> dict[str, Any] | None:
    """Inverse of format_line for one log line (None when the line is not a progress line)."""
    idx = line.find(PREFIX)
    if idx < 0:
        return None
    data = json.loads(line[idx + len(PREFIX) :], parse_constant=_reject_constant, parse_float=_finite_float)
    return data if isinstance(data, dict) else None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"progress lines carry no {name}: JSON has no NaN or Infinity")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"progress lines carry finite numbers only, got {text}")
    return value


def clean_metrics(metrics: dict[str, Any], prefix: str = "eval_") -> dict[str, float]:
    """`{"eval_accuracy": .9, "eval_runtime": 3}` -> `{"accuracy": .9}` (model metrics only, finite floats)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        name = k[len(prefix) :] if k.startswith(prefix) else k
        if name in _NON_METRIC_KEYS or not isinstance(v, int | float) or isinstance(v, bool):
            continue
        if math.isfinite(float(v)):
            out[name] = round(float(v), 6)
    return out


def _clean(v: Any) -> Any:
    # JSON has no NaN/inf; a diverged loss is reported as null rather than breaking the operator's parser.
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


class ProgressEmitter:
    """Prints progress lines when this process is global rank 0; silent elsewhere."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream
        self.started = time.monotonic()

    def emit(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        stream = self.stream or sys.stdout
        # One write per line: under mpirun every rank's output shares the launcher's stdout, and with
        # PYTHONUNBUFFERED print() writes the text and its newline separately, so another rank's bytes
        # could land inside the line.
        stream.write(format_line(event, **fields) + "\n")
        stream.flush()
