"""The table of `operator_scale.py --peer` (raw, ours and the Kubeflow peer on one control plane) and its place in
benchmarks/README.md. Pure: results in, Markdown out (unit-tested in tests/unit/test_bench_peer.py)."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BEGIN = "<!-- bench-peer:begin (written by benchmarks/operator_scale.py --peer --readme) -->"
END = "<!-- bench-peer:end -->"

Getter = Callable[[dict[str, Any]], float | None]  # None: not measured in this turn (older results, no steady)


def _values(rounds: list[dict[str, Any]], system: str, get: Getter) -> list[float]:
    return [v for r in rounds if system in r and (v := get(r[system])) is not None]


def _median(rounds: list[dict[str, Any]], system: str, get: Getter) -> float | None:
    values = _values(rounds, system, get)
    return statistics.median(values) if values else None


def _spread(rounds: list[dict[str, Any]], system: str, get: Getter, fmt: str) -> str:
    """The median, and the range across rounds when they differ."""
    values = _values(rounds, system, get)
    if not values:
        return "–"
    med = fmt.format(statistics.median(values))
    if min(values) == max(values):
        return med
    return f"{med} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def ratio(a: float | None, b: float | None) -> str:
    """`a:b` as a factor ("2.9×"); a dash where either side is missing or b is zero."""
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}×"


def table(results: dict[str, Any]) -> str:
    """Markdown: one row per quantity, columns ours, peer, raw and the ratios ours:raw and ours:peer (medians
    over the interleaved rounds; a range in brackets when there were several)."""
    rounds: list[dict[str, Any]] = results["rounds"]
    jobs, wide = results["jobs"], results["wideRanks"]
    rows: list[tuple[str, Getter, Getter | None, str]] = [
        # (label, value of ours and of the peer, value of raw or None, format)
        (
            f"{jobs} jobs × 2 ranks: makespan to every pod and Service (raw: seen by the same watch)",
            lambda s: s["narrow"]["makespanSeconds"],
            lambda r: r["narrow"].get("watchedSeconds"),
            "{:.2f} s",
        ),
        (
            f"{jobs} jobs × 2 ranks: makespan (raw: until its last create returned)",
            lambda s: s["narrow"]["makespanSeconds"],
            lambda r: r["narrow"]["seconds"],
            "{:.2f} s",
        ),
        (
            f"{jobs} jobs: API server + etcd CPU until then",
            lambda s: s["narrow"].get("controlPlaneCpuSeconds"),
            lambda r: r["narrow"].get("controlPlaneCpuSeconds"),
            "{:.1f} s",
        ),
        (f"{jobs} jobs: per-job latency p50", lambda s: s["narrow"]["latencySeconds"]["p50"], None, "{:.2f} s"),
        (f"{jobs} jobs: per-job latency p95", lambda s: s["narrow"]["latencySeconds"]["p95"], None, "{:.2f} s"),
        (f"{jobs} jobs: per-job latency max", lambda s: s["narrow"]["latencySeconds"]["max"], None, "{:.2f} s"),
        (
            f"1 job × {wide} ranks: every child (raw: seen by the same watch)",
            lambda s: s["wide"]["makespanSeconds"],
            lambda r: r["wide"].get("watchedSeconds"),
            "{:.2f} s",
        ),
        (
            f"1 job × {wide} ranks: every child (raw: until its last create returned)",
            lambda s: s["wide"]["makespanSeconds"],
            lambda r: r["wide"]["seconds"],
            "{:.2f} s",
        ),
        (
            "operator CPU per 2-rank job (until its children exist)",
            lambda s: s["narrow"]["cpuMsPerJob"],
            None,
            "{:.0f} ms",
        ),
        ("operator RSS at rest", lambda s: s["rssAtRestMiB"], None, "{:.0f} MiB"),
        (
            "operator RSS warm (one job made and deleted: modules, client, pools)",
            lambda s: s.get("rssWarmMiB"),
            None,
            "{:.0f} MiB",
        ),
        (f"operator RSS peak (start + the {jobs}-job run)", lambda s: s["rssPeakMiB"], None, "{:.0f} MiB"),
        (
            f"operator RSS with the {jobs} jobs Running, after the steady window",
            lambda s: s.get("rssSteadyMiB"),
            None,
            "{:.0f} MiB",
        ),
        ("operator RSS after every job is deleted", lambda s: s["rssAfterDeleteMiB"], None, "{:.0f} MiB"),
        (
            f"operator RSS after a second wave of {jobs} jobs, made and deleted",
            lambda s: s.get("rssAfterSecondWaveMiB"),
            None,
            "{:.0f} MiB",
        ),
        (
            "API requests per job until its children exist, 2 ranks",
            lambda s: s["narrow"]["requestsPerJob"],
            lambda r: r["narrow"]["perJob"],
            "{:.1f}",
        ),
        (
            f"API requests per job until its children exist, {wide} ranks",
            lambda s: s["wide"]["requestsPerJob"],
            lambda r: r["wide"]["perJob"],
            "{:.0f}",
        ),
        (
            f"steady, {jobs} jobs training (every log changing): requests per job per minute",
            lambda s: (s.get("steady") or {}).get("requestsPerJobPerMinute"),
            None,
            "{:.2f}",
        ),
        (
            f"steady, {jobs} jobs training: the operator's requests per second",
            lambda s: (s.get("steady") or {}).get("requestsPerSecond"),
            None,
            "{:.2f}",
        ),
    ]
    out = ["| workload | ours | peer | raw | ours:raw | ours:peer |", "|---|---|---|---|---|---|"]
    for label, get, get_raw, fmt in rows:
        ours = _median(rounds, "ours", get)
        peer = _median(rounds, "peer", get)
        raw = _median(rounds, "raw", get_raw) if get_raw else None
        raw_cell = _spread(rounds, "raw", get_raw, fmt) if get_raw else "–"
        if ours is None and peer is None and raw is None:
            continue  # not measured in this run (the steady state: our operator only, without --peer)
        cells = [
            _spread(rounds, "ours", get, fmt),
            _spread(rounds, "peer", get, fmt),
            raw_cell,
            ratio(ours, raw),
            ratio(ours, peer),
        ]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _loads(results: dict[str, Any]) -> str:
    loads = [
        turn["loadAfter"]
        for rnd in results["rounds"]
        for turn in rnd.values()
        if isinstance(turn, dict) and "loadAfter" in turn
    ]
    return f" and {min(loads)}–{max(loads)} after the turns" if loads else ""


def section(results: dict[str, Any], command: str) -> str:
    """The README block: what ran, the table, and how to reproduce it."""
    m, r = results["machine"], results
    date = f"{r['date']}: " if r.get("date") else ""
    head = (
        f"{date}{len(r['rounds'])} round(s) of raw, ours and peer interleaved (the order rotates "
        f"each round) on one LocalCluster (Kubernetes {r['kubernetes']}), {m['cpus']} CPUs, load average "
        f"{r['loadBefore']} before it{_loads(r)}; Kubeflow training-operator {r['peerVersion']}."
    )
    return "\n".join([BEGIN, head, "", table(results), "", f"Reproduce: `{command}`", END])


def command(results: dict[str, Any]) -> str:
    """The make command that repeats the run these results come from."""
    return f"make bench-peer BENCH_PEER_JOBS={results['jobs']} BENCH_PEER_ROUNDS={len(results['rounds'])}"


def write_section(readme: Path, block: str) -> None:
    """Replace the block between BEGIN and END in `readme`, or append it (after a heading) the first time."""
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        text = before + block + after
    else:
        heading = "## Results: raw, ours and the Kubeflow peer (`make bench-peer`)"
        text = text.rstrip("\n") + f"\n\n{heading}\n{block}\n"
    readme.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    # Re-render a saved run: python benchmarks/peer_report.py RESULTS.json [README.md]
    saved = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    if len(sys.argv) > 2:
        write_section(Path(sys.argv[2]), section(saved, command(saved)))
    print(table(saved))
