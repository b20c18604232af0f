"""Estimates as text and JSON, and the leave-one-out check of the calibration (docs/estimate.md's table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .calibration import Calibration, Record, predict
from .predict import Estimate, Row

# Within this of the measured figure, predicted from every other record, a figure passes (docs/estimate.md).
TOLERANCE = 0.25

# Acceptance figures the model is known to miss, with the reason; the test requires each to still miss (so the
# entry goes when the model learns it) and every other acceptance figure to pass.
EXPECTED_MISSES = {
    "h200-bert-base-bf16-compile-b32": (
        "the only compiled run in the launch-bound regime: without it no compiled run shows the compiled step's "
        "floor, so the eager runs' floor (about 43 ms, twice the compiled 23 ms) stands in"
    ),
}


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def fmt_usd(usd: float | None) -> str:
    if usd is None:
        return "-"
    return f"${usd:,.2f}" if usd >= 0.01 else "<$0.01"


def _flops(f: float) -> str:
    return f"{f / 1e9:,.1f} GFLOP" if f >= 1e9 else f"{f / 1e6:,.1f} MFLOP"


def calibration_label(row: Row) -> str:
    if row.prediction is None:
        return "-"
    fit = row.prediction.fit
    if not fit.calibrated:
        return "uncalibrated"
    runs = f"{fit.runs} run{'s' if fit.runs != 1 else ''}"
    return runs if fit.same_model else f"{runs}, other model"


def render_text(est: Estimate) -> str:
    w = est.workload
    lines = [
        f"FineTuneJob {est.job}: {w.model}, {w.precision}{', torch.compile' if w.compile else ''}"
        f"{f', LoRA r={w.lora.r}' if w.lora else ''}",
        f"  {_flops(w.flops_per_sample)} per training sample ({w.tokens_per_sample:g} tokens), "
        f"{w.trained_params / 1e6:,.1f} M trained weights",
    ]
    lines += [f"  {n}" for n in est.notes]
    lines.append(f"  samples per epoch: {est.samples_note}")
    header = [
        "profile",
        "instance",
        "nodes x ranks",
        "device",
        "samples/s",
        "time",
        "$/hour",
        "cost",
        "MFU",
        "calibration",
    ]
    table = [header]
    footnotes: list[str] = []
    for r in est.rows:
        if r.prediction is None:
            sps, time, mfu, cal = "-", "-", "-", f"[{_note(footnotes, r.problem or 'no prediction')}]"
        else:
            p = r.prediction
            sps, time, mfu = f"{p.samples_per_second:,.1f}", fmt_time(r.seconds), f"{p.mfu:.1%}"
            marks = "".join(f"[{_note(footnotes, b)}]" for b in p.fit.basis)
            cal = calibration_label(r) + (f" {marks}" if marks else "")
        price = fmt_usd(r.usd_per_hour) if r.usd_per_hour is not None else "-"
        if r.price_note and r.usd_per_hour is not None:
            price += f" [{_note(footnotes, r.price_note)}]"
        label = f"{r.instance_type or '(resources)'}" + (" *" if r.label else "")
        table.append(
            [
                r.profile,
                label,
                f"{r.nodes} x {r.procs_per_node}",
                r.device or "-",
                sps,
                time,
                price,
                fmt_usd(r.cost),
                mfu,
                cal,
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {4, 5, 6, 7, 8}
    for row in table:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    lines.append("* the job as written; the other rows run it on one node of each instance type (all its devices)")
    lines.append(
        "time: training only, evaluation and checkpoints as the calibration runs had them; Neuron's precompile "
        "(neuron_parallel_compile) and torch.compile's first steps come before it and are not counted"
    )
    if est.prices:
        table_of = est.prices
        lines.append(f"prices: on-demand, {table_of.region}, read {table_of.date} from {table_of.source}")
    for i, text in enumerate(footnotes, 1):
        lines.append(f"[{i}] {text}")
    for profile, itype, why in est.skipped:
        lines.append(f"not possible on {profile} {itype}: {why}")
    return "\n".join(lines) + "\n"


def _note(notes: list[str], text: str) -> int:
    if text not in notes:
        notes.append(text)
    return notes.index(text) + 1


def to_json(est: Estimate) -> dict[str, Any]:
    w = est.workload
    rows = []
    for r in est.rows:
        p = r.prediction
        rows.append(
            {
                "label": r.label or None,
                "profile": r.profile,
                "instanceType": r.instance_type,
                "nodes": r.nodes,
                "procsPerNode": r.procs_per_node,
                "device": r.device,
                "samplesPerSecond": None if p is None else round(p.samples_per_second, 3),
                "stepSeconds": None if p is None else round(p.step_seconds, 6),
                "mfu": None if p is None else round(p.mfu, 4),
                "samples": r.samples,
                "seconds": None if r.seconds is None else round(r.seconds, 1),
                "usdPerHour": r.usd_per_hour,
                "costUsd": None if r.cost is None else round(r.cost, 4),
                "priceNote": r.price_note,
                "problem": r.problem,
                "calibration": None
                if p is None
                else {
                    "runs": p.fit.runs,
                    "calibrated": p.fit.calibrated,
                    "sameModel": p.fit.same_model,
                    "efficiency": round(p.fit.efficiency, 4),
                    "floorSeconds": round(p.fit.floor, 6),
                    "allReduceSecondsPerElement": p.fit.k,
                    "basis": p.fit.basis,
                    "records": list(p.fit.record_ids),
                },
            }
        )
    return {
        "job": est.job,
        "workload": {
            "model": w.model,
            "precision": w.precision,
            "compile": w.compile,
            "lora": None if w.lora is None else {"r": w.lora.r, "targetModules": w.lora.targets},
            "tokensPerSample": w.tokens_per_sample,
            "flopsPerSample": w.flops_per_sample,
            "trainedParams": w.trained_params,
            "samplesPerEpochFrom": est.samples_note,
            "notes": est.notes,
        },
        "timeCovers": "training only: precompile and torch.compile warm-up are not included",
        "prices": None
        if est.prices is None
        else {"date": est.prices.date, "region": est.prices.region, "source": est.prices.source},
        "rows": rows,
        "skipped": [{"profile": p, "instanceType": i, "reason": why} for p, i, why in est.skipped],
    }


# --- leave-one-out ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    record: Record
    predicted: float  # samples/s
    runs: int
    basis: list[str]

    @property
    def error(self) -> float:
        """Relative error of the figure as the source gives it: samples/s, or epoch time (the seed's Xeon runs)."""
        if self.record.samples_per_epoch:
            return self.record.samples_per_second / self.predicted - 1.0
        return self.predicted / self.record.samples_per_second - 1.0

    @property
    def passes(self) -> bool:
        return abs(self.error) <= TOLERANCE


def leave_one_out(cal: Calibration) -> list[Check]:
    """Each acceptance record predicted from every other record."""
    out = []
    for r in cal.records:
        if not r.acceptance:
            continue
        fit = cal.without(r.id).fit(r.workload)
        out.append(Check(r, predict(r.workload, fit).samples_per_second, fit.runs, fit.basis))
    return out


def _figure(r: Record, sps: float) -> str:
    if r.samples_per_epoch:
        return f"{r.samples_per_epoch / sps / 60:.1f} min/epoch"
    return f"{sps:,.1f} samples/s"


def loo_markdown(checks: list[Check]) -> str:
    lines = [
        "| record | hardware | work | measured | predicted without it | error | runs behind it |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        w = c.record.workload
        hw = f"{w.instance_type or w.device}, {w.nodes} x {w.procs_per_node} rank{'s' if w.world > 1 else ''}"
        work = (
            f"{w.model.split('/')[-1]}, {w.precision}{' compiled' if w.compile else ''}, batch {w.batch_per_device}, "
            f"{w.tokens_per_sample:g} tokens"
        )
        verdict = "" if c.passes else (" (expected: see below)" if c.record.id in EXPECTED_MISSES else " **miss**")
        lines.append(
            f"| {c.record.id} | {hw} | {work} | {_figure(c.record, c.record.samples_per_second)} | "
            f"{_figure(c.record, c.predicted)} | {c.error:+.1%}{verdict} | {c.runs} |"
        )
    passed = sum(c.passes for c in checks)
    lines.append("")
    lines.append(f"{passed} of {len(checks)} figures within ±{TOLERANCE:.0%}.")
    for rid, why in EXPECTED_MISSES.items():
        lines.append(f"{rid}: {why}.")
    return "\n".join(lines) + "\n"
