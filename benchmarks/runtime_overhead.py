"""Our runtime vs a bare Hugging Face Trainer script (bare_trainer.py): same data, tiny model, hyperparameters.

    python benchmarks/runtime_overhead.py [--pairs 5] [--epochs 10] [--quick] [--json OUT]

Runs A/B interleaved (runtime, bare, runtime, bare, ...) after one untimed warm-up of each, so load changes on
a shared machine hit both sides alike. Each run is one CPU process (no torchrun) started fresh, timed from the
parent's clock on the lines each prints at Trainer logs with a loss (the runtime's progress lines, the bare
script's `BENCH-STEP` lines), which fire on the same steps (logging_first_step, then every logEverySteps):
- time to first step: process start -> the step-1 line (imports, tokenizer, data, model, Trainer);
- samples/s: (last logged step - 1) x batch / the time between the step-1 line and the last logged step's line.
  Per-epoch evaluation and checkpoints fall inside that window on both sides.
The runtime's tokenised-dataset cache is warm after the warm-up (as on any run after a job's first); the bare
script tokenises every time (400 rows: a fraction of a second).

Then the demo job's time to the first step as its pod runs it in the cpu image and as `ftjob run` runs it, each
against the same without bytecode, interleaved (first_step.py; --no-first-step skips it, --no-image keeps only
the `ftjob run` sides).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import first_step
from benchio import write_json

from finetune_runtime.progress import parse_line

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "jobs" / "demo-ja-config.json"


@dataclass(frozen=True)
class RunResult:
    side: str  # "runtime" or "bare"
    seconds_to_first_step: float
    samples_per_second: float
    wall_seconds: float
    steps: int


def step_of(line: str) -> int | None:
    """The training step a timing line reports (a runtime `train` progress line or a bare `BENCH-STEP`)."""
    if line.startswith("BENCH-STEP "):
        return int(line.split()[1])
    doc = parse_line(line)
    if doc is not None and doc.get("event") == "train" and isinstance(doc.get("step"), int):
        return int(doc["step"])
    return None


def result_from_lines(side: str, timed: list[tuple[float, str]], wall: float, batch: int) -> RunResult:
    """timed: (seconds since process start, line). Needs the step-1 line and at least one later one."""
    steps = [(t, s) for t, line in timed if (s := step_of(line)) is not None]
    if len(steps) < 2 or steps[0][1] != 1:
        raise ValueError(f"{side}: expected a step-1 line and a later step line, got steps {[s for _, s in steps]}")
    (t1, s1), (tn, sn) = steps[0], steps[-1]
    return RunResult(side, round(t1, 3), round((sn - s1) * batch / (tn - t1), 2), round(wall, 2), sn)


def summarize(results: list[RunResult]) -> dict[str, Any]:
    """Medians per side, the ratio of the medians (runtime / bare) and each pair's own ratio."""
    by = {side: [r for r in results if r.side == side] for side in ("runtime", "bare")}
    med = {
        side: {
            "samplesPerSecond": round(statistics.median(r.samples_per_second for r in rs), 2),
            "secondsToFirstStep": round(statistics.median(r.seconds_to_first_step for r in rs), 2),
        }
        for side, rs in by.items()
    }
    pairs = [
        round(a.samples_per_second / b.samples_per_second, 3) for a, b in zip(by["runtime"], by["bare"], strict=True)
    ]
    return {
        "median": med,
        "samplesPerSecondRatio": round(med["runtime"]["samplesPerSecond"] / med["bare"]["samplesPerSecond"], 3),
        "firstStepDelaySeconds": round(med["runtime"]["secondsToFirstStep"] - med["bare"]["secondsToFirstStep"], 3),
        "pairRatios": pairs,
        # The interleaved pairs' own ratios, their median: robust to load that drifts between pairs (one slow
        # run moves the ratio of medians of the two sides more than it moves this).
        "pairRatioMedian": round(statistics.median(pairs), 3),
    }


def run_once(side: str, config: Path, work: Path, n: int, batch: int, timeout: float) -> RunResult:
    out = work / f"{side}-{n}"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": str(os.cpu_count() or 1),
        "PYTHONUNBUFFERED": "1",
        "HF_HOME": str(work / "hf"),
    }
    if side == "runtime":
        cmd = [sys.executable, "-m", "finetune_runtime", "worker"]
        env |= {
            "FTJOB_BACKEND": "cpu",
            "FTJOB_CONFIG": str(config),
            "FTJOB_OUTPUT_DIR": str(out),
            "FTJOB_CACHE_DIR": str(work / "runtime-cache"),
        }
    else:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "bare_trainer.py"), str(config), str(out)]
    timed: list[tuple[float, str]] = []
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        timed.append((time.monotonic() - start, line.rstrip("\n")))
        if time.monotonic() - start > timeout:
            proc.kill()
            break
    rc = proc.wait()
    wall = time.monotonic() - start
    if rc != 0:
        tail = "\n".join(line for _, line in timed[-30:])
        raise RuntimeError(f"{side} run {n} exited {rc}:\n{tail}")
    return result_from_lines(side, timed, wall, batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5, help="timed runtime/bare pairs (default 5)")
    ap.add_argument(
        "--epochs",
        type=int,
        default=10,
        help="epochs per run (13 steps each on the sample; a quiet 2-core machine runs ~45 steps/s)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1 pair of 1 epoch, no warm-up: the runtime's dataset cache is cold (make bench QUICK=1)",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--first-step-rounds", type=int, default=3, help="rounds of first_step.py (default 3)")
    ap.add_argument("--image", default=first_step.DEFAULT_IMAGE, help="the cpu image first_step.py runs")
    ap.add_argument("--compare-image", help="a second image first_step.py measures (e.g. one built before a change)")
    ap.add_argument("--no-image", action="store_true", help="first_step.py without docker: `ftjob run` sides only")
    ap.add_argument("--no-first-step", action="store_true", help="skip first_step.py")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    pairs, epochs = (1, 1) if args.quick else (args.pairs, args.epochs)
    cfg = json.loads(CONFIG.read_text(encoding="utf-8"))
    cfg["training"]["epochs"] = epochs
    batch = int(cfg["training"]["batchSizePerDevice"])
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        work = Path(tmp)
        config = work / "config.json"
        config.write_text(json.dumps(cfg), encoding="utf-8")
        for side in () if args.quick else ("runtime", "bare"):  # warm-up: the dataset cache, the page cache
            print(f"warm-up {side}: {asdict(run_once(side, config, work, 0, batch, args.timeout))}", flush=True)
        for n in range(1, pairs + 1):
            for side in ("runtime", "bare"):
                r = run_once(side, config, work, n, batch, args.timeout)
                results.append(r)
                print(f"pair {n} {side}: {asdict(r)}", flush=True)
    summary = summarize(results)
    doc = {
        "config": {
            "pairs": pairs,
            "epochs": epochs,
            "batchSize": batch,
            "model": cfg["task"]["model"],
            "warmUp": not args.quick,
            "cpus": os.cpu_count(),
            "loadAverage": os.getloadavg(),
        },
        "runs": [asdict(r) for r in results],
        **summary,
    }
    med = summary["median"]
    print("| | runtime | bare Trainer | runtime : bare |\n|---|---|---|---|")
    print(
        f"| train samples/s (median) | {med['runtime']['samplesPerSecond']} | {med['bare']['samplesPerSecond']} "
        f"| {summary['samplesPerSecondRatio']} (median of the pairs' ratios {summary['pairRatioMedian']}) |"
    )
    print(
        f"| time to first step, s (median) | {med['runtime']['secondsToFirstStep']} "
        f"| {med['bare']['secondsToFirstStep']} | {summary['firstStepDelaySeconds']:+} s |"
    )
    if not args.no_first_step:
        image = None if args.no_image else args.image
        compare = None if args.no_image else args.compare_image
        rounds = 1 if args.quick else args.first_step_rounds
        doc["firstStep"] = first_step.measure(rounds, not args.quick, image, compare, args.timeout)
        print(first_step.table(doc["firstStep"]))
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
