"""The shared compile cache: time to the first training step of a job whose precompile trial finds the cache
cold, then of the same job again on the now-warm cache (what two consecutive jobs on one compileCache claim
see; tests/e2e checks the order on a real node, this measures the size).

    python benchmarks/compile_cache.py [--pairs 2] [--quick] [--json OUT]

Each pair is two `ftjob run`s of the Japanese sample job (tiny BERT, 1 process, training.compile and
compileCache.precompile, as on a cluster) with one workdir (so one cache) and two outputs. Clock: from starting
`ftjob run` to rank 0's first `train` progress line in its log. Also reported: the trial's own report
(status.compileCache on a cluster: warm, graphs from the cache / compiled, trial seconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from benchio import write_json

from finetune_runtime.progress import parse_line

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "jobs" / "demo-ja-sentiment.yaml"
FTJOB = str(Path(sys.executable).with_name("ftjob"))


def job_doc(trial_steps: int) -> dict[str, Any]:
    doc = yaml.safe_load(JOB.read_text(encoding="utf-8"))
    spec = doc["spec"]
    spec["hardware"]["procsPerNode"] = 1
    spec["training"].update({"maxSteps": 4, "logEverySteps": 1, "compile": True, "checkpointEverySteps": 50})
    spec["compileCache"] = {"precompile": True, "precompileSteps": trial_steps}
    spec["task"]["model"] = str(ROOT / spec["task"]["model"])
    spec["task"]["dataset"]["path"] = str(ROOT / spec["task"]["dataset"]["path"])
    return dict(doc)


def records(path: Path, event: str) -> list[dict[str, Any]]:
    """The `event` progress records in a log (the runtime's own parser; torchrun's prefixes are skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = parse_line(line)
        except ValueError:  # a line cut off mid-write while the run goes on
            continue
        if rec is not None and rec.get("event") == event:
            out.append(rec)
    return out


def run_once(job: Path, work: Path, output: Path, timeout: float) -> dict[str, Any]:
    """One `ftjob run`; the seconds until rank 0's first training step, and the trial's cache report."""
    train_log = work / "logs" / "train-node0.log"
    train_log.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [FTJOB, "run", "-f", str(job), "--workdir", str(work), "--output", str(output), "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first: float | None = None
    while proc.poll() is None and time.perf_counter() - start < timeout:
        if first is None and records(train_log, "train"):
            first = time.perf_counter() - start
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
        raise RuntimeError(f"ftjob run did not finish within {timeout} s")
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"ftjob run exited {proc.returncode}:\n{err[-3000:]}")
    first = first if first is not None else (time.perf_counter() - start if records(train_log, "train") else None)
    trial = [r for r in records(work / "logs" / "precompile-node0.log", "precompile") if r.get("complete")]
    return {
        "firstStepSeconds": round(first, 1) if first is not None else None,
        "totalSeconds": round(time.perf_counter() - start, 1),
        "cache": trial[-1].get("cache") if trial else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2, help="cold/warm pairs, each on a fresh cache (default 2)")
    ap.add_argument("--trial-steps", type=int, default=2, help="compileCache.precompileSteps (default 2)")
    ap.add_argument("--quick", action="store_true", help="1 pair (make bench QUICK=1)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    pairs = 1 if args.quick else args.pairs
    if pairs < 1 or args.trial_steps < 1:
        ap.error("--pairs and --trial-steps must be at least 1")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-cc-") as tmp:
        job = Path(tmp) / "job.yaml"
        job.write_text(yaml.safe_dump(job_doc(args.trial_steps), allow_unicode=True), encoding="utf-8")
        for pair in range(pairs):
            work = Path(tmp) / f"pair{pair}"
            for side in ("cold", "warm"):
                r = run_once(job, work, work / f"out-{side}", args.timeout)
                runs.append({"pair": pair, "side": side, **r})
                print(f"pair {pair} {side}: first step after {r['firstStepSeconds']} s, cache {r['cache']}", flush=True)

    def med(side: str) -> float:
        return float(statistics.median(r["firstStepSeconds"] for r in runs if r["side"] == side))

    cold, warm = med("cold"), med("warm")
    doc = {
        "config": {
            "pairs": pairs,
            "trialSteps": args.trial_steps,
            "cpus": os.cpu_count(),
            "loadAverage": os.getloadavg(),
        },
        "runs": runs,
        "coldFirstStepSeconds": cold,
        "warmFirstStepSeconds": warm,
        "savedSeconds": round(cold - warm, 1),
        "speedup": round(cold / warm, 2) if warm else None,
    }
    print("| compile cache | first training step after (median) |\n|---|---|")
    print(f"| cold (the trial compiles) | {cold:.1f} s |\n| warm (every graph from the cache) | {warm:.1f} s |")
    print(f"| saved | {doc['savedSeconds']} s ({doc['speedup']}x) |")
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
