"""The table of `operator_scale.py --peer` (raw, the floor, ours and the Kubeflow peer on one control plane), its
goal line and its place in benchmarks/README.md. Pure: results in, Markdown out (unit-tested in
tests/unit/test_bench_peer.py)."""

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

# The goal (issue 26): ours within this factor of the floor, and ahead of the peer, on makespan, CPU and requests.
FLOOR_GOAL = 1.3
FULL_JOBS = 200  # mk/bench.mk's BENCH_PEER_JOBS: a run with fewer jobs says so in the README


def _get(get: Getter, turn: dict[str, Any]) -> float | None:
    """`get` of one system's turn; None where that system has no such quantity (the floor has no operator
    process, so no operator CPU or RSS; raw has its own keys)."""
    try:
        return get(turn)
    except KeyError:
        return None


def _values(rounds: list[dict[str, Any]], system: str, get: Getter) -> list[float]:
    return [v for r in rounds if system in r and (v := _get(get, r[system])) is not None]


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


def _total_cpu(s: dict[str, Any]) -> float:
    """API server + etcd + the operator process, CPU seconds for the N-job run: what the system cost the machine."""
    narrow = s["narrow"]
    return float(narrow["controlPlaneCpuSeconds"]) + narrow["cpuMsPerJob"] * narrow["jobs"] / 1000


def table(results: dict[str, Any]) -> str:
    """Markdown: one row per quantity, columns ours, floor, peer, raw and the ratios ours:floor (the headline),
    ours:peer and ours:raw (medians over the interleaved rounds; a range in brackets when there were several).
    The floor and the operators share a getter; raw has its own (its keys differ)."""
    rounds: list[dict[str, Any]] = results["rounds"]
    jobs, wide = results["jobs"], results["wideRanks"]
    rows: list[tuple[str, Getter, Getter | None, str]] = [
        # (label, value of ours, the floor and the peer, value of raw or None, format)
        (
            f"{jobs} jobs × 2 ranks: makespan to every pod and Service (floor: and its status patch; raw: seen by "
            "the same watch)",
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
        (f"{jobs} jobs: API server + etcd + operator CPU until then", _total_cpu, None, "{:.1f} s"),
        (f"{jobs} jobs: per-job latency p50", lambda s: s["narrow"]["latencySeconds"]["p50"], None, "{:.2f} s"),
        (f"{jobs} jobs: per-job latency p95", lambda s: s["narrow"]["latencySeconds"]["p95"], None, "{:.2f} s"),
        (f"{jobs} jobs: per-job latency max", lambda s: s["narrow"]["latencySeconds"]["max"], None, "{:.2f} s"),
        (
            f"1 job × {wide} ranks: every child (floor: and its status patch; raw: seen by the same watch)",
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
            "API requests per job until its children exist, 2 ranks (not the job's own create)",
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
    out = [
        "| workload | ours | floor | peer | raw | **ours:floor** | ours:peer | ours:raw |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, get, get_raw, fmt in rows:
        ours, floor, peer = (_median(rounds, s, get) for s in ("ours", "floor", "peer"))
        raw = _median(rounds, "raw", get_raw) if get_raw else None
        if ours is None and floor is None and peer is None and raw is None:
            continue  # not measured in this run (the steady state: our operator only, without --peer)
        cells = [
            _spread(rounds, "ours", get, fmt),
            _spread(rounds, "floor", get, fmt),
            _spread(rounds, "peer", get, fmt),
            _spread(rounds, "raw", get_raw, fmt) if get_raw else "–",
            ratio(ours, floor),
            ratio(ours, peer),
            ratio(ours, raw),
        ]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _makespan(s: dict[str, Any]) -> float:
    return float(s["narrow"]["makespanSeconds"])


def _plane_cpu(s: dict[str, Any]) -> float:
    return float(s["narrow"]["controlPlaneCpuSeconds"])


def _requests(s: dict[str, Any]) -> float:
    return float(s["narrow"]["requestsPerJob"])


def _operator_cpu(s: dict[str, Any]) -> float:
    return float(s["narrow"]["cpuMsPerJob"])


def _against(
    rounds: list[dict[str, Any]], other: str, quantities: list[tuple[str, Getter]], within: Callable[[float], bool]
) -> tuple[bool | None, str]:
    """Whether ours:`other` is `within` the goal for every quantity (None: a side was not measured in this run),
    and the ratios, each marked where it is not."""
    parts, met = [], True
    for name, get in quantities:
        ours, theirs = _median(rounds, "ours", get), _median(rounds, other, get)
        if ours is None or theirs is None or theirs == 0:
            return None, f"ours or the {other} not measured in this run"
        ok = within(ours / theirs)
        met = met and ok
        parts.append(f"{name} {ours / theirs:.2f}×" + ("" if ok else " (**missed**)"))
    return met, ", ".join(parts)


def goal(results: dict[str, Any]) -> str:
    """Whether this run met the goal: ours ≤ FLOOR_GOAL × the floor, and ahead of (below) the peer, on the N-job
    run's makespan, CPU and API requests per job (medians over the rounds). Against the floor the CPU is the
    control plane's (the floor has no operator process); against the peer it is the control plane's plus the
    operator's, and the operator process alone is named beside it, ahead or behind."""
    rounds: list[dict[str, Any]] = results["rounds"]
    floor_met, floor_text = _against(
        rounds,
        "floor",
        [("makespan", _makespan), ("API server + etcd CPU", _plane_cpu), ("requests per job", _requests)],
        lambda r: r <= FLOOR_GOAL,
    )
    peer_met, peer_text = _against(
        rounds,
        "peer",
        [("makespan", _makespan), ("API server + etcd + operator CPU", _total_cpu), ("requests per job", _requests)],
        lambda r: r < 1.0,
    )
    ours_op, peer_op = _median(rounds, "ours", _operator_cpu), _median(rounds, "peer", _operator_cpu)
    if ours_op is not None and peer_op:
        side = "ahead" if ours_op < peer_op else "behind"
        peer_text += f"; the operator process alone uses {ratio(ours_op, peer_op)} the peer's CPU per job: {side}"
    verdict = {True: "**met**", False: "**not met**", None: "**not measured**"}
    met = floor_met is True and peer_met is True
    lines = [
        f"- Goal: ours ≤ {FLOOR_GOAL}× the floor on the {results['jobs']}-job run's makespan, API server + etcd "
        f"CPU and API requests per job: {verdict[floor_met]} ({floor_text}).",
        f"- Goal: ours ahead of the peer on makespan, CPU and requests per job: {verdict[peer_met]} ({peer_text}).",
        f"- This run {'met' if met else 'did not meet'} the goal.",
    ]
    ours_span, floor_span = _median(rounds, "ours", _makespan), _median(rounds, "floor", _makespan)
    if ours_span is not None and floor_span is not None and ours_span < floor_span:
        lines.insert(
            1,
            "- Ours finished before the floor: in this run the floor's makespan was no lower bound (its writes were "
            "limited by something ours does not share); read the makespan ratio with that in mind.",
        )
    return "\n".join(lines)


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
    systems = r["rounds"][0]["order"] if r["rounds"] else []
    names = ", ".join(systems[:-1]) + f" and {systems[-1]}" if len(systems) > 1 else "".join(systems)
    head = (
        f"{date}{len(r['rounds'])} round(s) of {names} interleaved (the order rotates "
        f"each round) on one LocalCluster (Kubernetes {r['kubernetes']}), {m['cpus']} CPUs, load average "
        f"{r['loadBefore']} before it{_loads(r)}; Kubeflow training-operator {r['peerVersion']}."
    )
    if r["jobs"] < FULL_JOBS:
        head += f" A shorter run than the default: {r['jobs']} jobs instead of {FULL_JOBS}."
    return "\n".join([BEGIN, head, "", table(results), "", goal(results), "", f"Reproduce: `{command}`", END])


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
        heading = "## Results: raw, the floor, ours and the Kubeflow peer (`make bench-peer`)"
        text = text.rstrip("\n") + f"\n\n{heading}\n{block}\n"
    readme.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    # Re-render a saved run: python benchmarks/peer_report.py RESULTS.json [README.md]
    saved = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    if len(sys.argv) > 2:
        write_section(Path(sys.argv[2]), section(saved, command(saved)))
    print(table(saved))
