"""status.throughput: what rank 0's progress lines say about speed, and the model FLOPs and MFU derived from them.

Pure: the job's hardware context (`Context`, from its layout and its profile's `throughput:` data) and the folded
status.progress in, a dict out. The runtime reports what it measures and counts (samples/s, tokens/s padded and
not, the mean padded length of a sample, and the model's matmul weights and attention shape as it loaded the
model); the operator adds what only it knows, the peaks of the job's devices, and computes FLOPs with the one
formula `ftjob estimate` uses (estimate/flops.py; docs/architecture.md says why it lives here). Nothing is made
up: a `spec.command` job gets only what its own lines give (a script may print samplesPerSecond alone), and MFU
exists only where FLOPs per sample, samples/s and a public peak for the precision in use all do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .api.schema import PRECISIONS
from .builders.layout import Layout
from .estimate.flops import Counts, flops_per_token
from .estimate.workload import rank_share

# Fields of rank 0's lines copied as they are (numbers only); progress.py keeps them in status.progress.
RATES = (
    "samplesPerSecond",
    "meanSamplesPerSecond",
    "tokensPerSecond",
    "paddedTokensPerSecond",
    "paddedTokensPerSample",
)
# The `model` object of a runtime line -> Counts (estimate/flops.py) and status.throughput.model.
MODEL_KEYS = {
    "layers": "layers",
    "attentionWidth": "attention_width",
    "trainableMatmulParams": "trainable_matmul",
    "frozenMatmulParams": "frozen_matmul",
}


@dataclass(frozen=True)
class Context:
    """What the operator knows of a job's hardware: its device kind, how many of them the job holds (ranks ×
    devices per rank), the device's peak FLOP/s by precision, and the precision the runtime trains in (None for a
    `spec.command` job: only its own lines can say)."""

    device: str | None
    devices: float
    peaks: Mapping[str, float | None] = field(default_factory=dict)
    precision: str | None = None

    @classmethod
    def of(cls, job: Mapping[str, Any], layout: Layout) -> Context:
        spec = job["spec"]
        kind, per_rank = rank_share(layout)
        precision = None if spec.get("command") else str((spec.get("training") or {}).get("precision") or "fp32")
        if kind is None:
            return cls(None, layout.world_size * per_rank, {}, precision)
        return cls(kind.name, layout.world_size * per_rank, {p: kind.peak_flops(p) for p in PRECISIONS}, precision)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


def counts(model: Any) -> Counts | None:
    """The runtime's `model` object as the FLOPs formula's numbers; None unless every one is a whole number."""
    if not isinstance(model, Mapping):
        return None
    values = {}
    for key, attr in MODEL_KEYS.items():
        v = model.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return None
        values[attr] = v
    return Counts(**values)


def of(ctx: Context, progress: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """status.throughput from the folded status.progress; None while nothing was measured (or in a precompile
    trial, whose steps are not training)."""
    if not progress or progress.get("event") == "precompile":
        return None
    out: dict[str, Any] = {}
    for key in RATES:
        v = _number(progress.get(key))
        if v is not None:
            out[key] = v
    if "samplesPerSecond" not in out and "tokensPerSecond" not in out and "paddedTokensPerSecond" not in out:
        return None
    model = counts(progress.get("model"))
    flops = _number(progress.get("flopsPerSample"))  # a job's own command may give it outright
    tokens = out.get("paddedTokensPerSample")
    if flops is None and model is not None and tokens:
        flops = flops_per_token(model, tokens) * tokens
    if model is not None:
        raw = progress["model"]
        out["model"] = {k: raw[k] for k in (*MODEL_KEYS, "trainableParams") if isinstance(raw.get(k), int)}
    if flops:
        out["flopsPerSample"] = float(f"{flops:.6g}")
    said = progress.get("precision")
    precision = said if said in PRECISIONS else ctx.precision
    if precision:
        out["precision"] = precision
    if ctx.device:
        out["device"] = ctx.device
        out["devices"] = ctx.devices
    peak = ctx.peaks.get(precision) if precision else None
    sps = out.get("samplesPerSecond")
    if peak and flops and sps and ctx.devices > 0:
        total = peak * ctx.devices
        out["peakFlopsPerSecond"] = total
        out["mfu"] = float(f"{sps * flops / total:.4g}")
    out["summary"] = summarize(out)
    return out


def _rate(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _percent(ratio: float) -> str:
    pct = 100 * ratio
    return f"{pct:.0f}%" if pct >= 10 else f"{pct:.2g}%"


def summarize(t: Mapping[str, Any]) -> str:
    """The THROUGHPUT column: '149 samples/s, MFU 31%' (what exists of it)."""
    parts = []
    if isinstance(t.get("samplesPerSecond"), int | float):
        parts.append(f"{_rate(t['samplesPerSecond'])} samples/s")
    else:
        tps = t.get("tokensPerSecond", t.get("paddedTokensPerSecond"))
        if isinstance(tps, int | float):
            parts.append(f"{_rate(tps)} tokens/s")
    if isinstance(t.get("mfu"), int | float):
        parts.append(f"MFU {_percent(t['mfu'])}")
    return ", ".join(parts)
