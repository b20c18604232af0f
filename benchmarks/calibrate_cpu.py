"""Calibration records for `ftjob estimate` from `ftjob run`s of the demo job on this machine.

    python benchmarks/calibrate_cpu.py [--procs 2] [--batch-sizes 8,16,32] [--epochs 24] [--repeats 3] [--out FILE]

Runs examples/jobs/demo-ja-sentiment.yaml (tiny BERT, the ja reviews, torchrun + gloo) through `ftjob run` once per
(ranks, per-device batch) variant and repeat, the variants interleaved so that load changes on a shared machine hit
each alike. The default keeps the demo's two ranks of one thread each: one rank with two OpenMP threads on this
loaded 2-core machine (load average near 20) fell to about 5 samples/s against about 290 for two ranks, its
threads waiting on each other whenever another process held a core.

Each run's samples/s is its samples over its time from the first `train` progress line to the last (each line
reports the samples/s of the steps since the one before; the first line covers the first step alone and is left
out): the runtime's own figure, so per-epoch evaluation and checkpoints are inside it, as in every job. Runs train
for --epochs (24, four times the demo's 6: the same steps, more of them) because the progress lines of one run
swung by 2x on this shared machine, and a short run has only two or three of them. The record keeps the median over
repeats and every repeat's figure.

Tokens per sample: the task pads each batch to its longest row (dynamic padding), so a sample costs the padded
length, not maxLength. It is the expected longest tokenised review in a random batch of the per-device size, drawn
20,000 times (seeded) from the training rows the job keeps (labelMap applied).

Prints the records as YAML (docs/estimate.md, "Calibration records"); --out writes them to a file that
`ftjob estimate --calibration FILE` reads.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "jobs" / "demo-ja-sentiment.yaml"
DRAWS = 20_000


def train_windows(log: Path) -> list[tuple[int, float]]:
    """(steps since the previous line, samplesPerSecond) of every `train` progress line of a rank-0 log, in order."""
    from finetune_operator.progress import parse_line

    out: list[tuple[int, float]] = []
    last = 0
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        rec = parse_line(line)
        if rec and rec.get("event") == "train" and isinstance(rec.get("samplesPerSecond"), int | float):
            out.append((int(rec["step"]) - last, float(rec["samplesPerSecond"])))
            last = int(rec["step"])
    return out


def run_rate(windows: list[tuple[int, float]]) -> float:
    """One run's samples/s over its (steps, samples/s) windows after the first: total samples / total time."""
    if len(windows) < 2:
        raise SystemExit(f"need at least two train progress lines, got {windows}")
    later = windows[1:]
    return sum(n for n, _ in later) / sum(n / rate for n, rate in later)


def padded_tokens(job: dict[str, Any], batch: int, seed: int = 0) -> float:
    """Expected length of the longest row of a random batch (dynamic padding), capped at maxLength."""
    from transformers import AutoTokenizer

    task = job["spec"]["task"]
    ds = task["dataset"]
    tok = AutoTokenizer.from_pretrained(str(ROOT / task["model"]))
    keep = {str(k) for k in ds.get("labelMap", {})}
    rows = [json.loads(line) for line in (ROOT / ds["path"] / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if not keep or str(r[ds["labelColumn"]]) in keep]
    cap = int(task.get("maxLength", 128))
    lengths = [min(cap, len(tok(r[ds["textColumn"]])["input_ids"])) for r in rows]
    rng = random.Random(seed)
    return round(statistics.fmean(max(rng.sample(lengths, batch)) for _ in range(DRAWS)), 1)


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} vCPUs, {platform.system()} {platform.release()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", default="2", help="ranks per run (comma-separated)")
    ap.add_argument("--batch-sizes", default="8,16,32", help="per-device batch sizes (comma-separated)")
    ap.add_argument("--epochs", type=float, default=24, help="training epochs per run (the demo has 6)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default="_out/calibrate-cpu")
    ap.add_argument("--out", help="write the records here (YAML) as well")
    args = ap.parse_args(argv)

    base = yaml.safe_load(JOB.read_text(encoding="utf-8"))
    variants = [(int(p), int(b)) for p in args.procs.split(",") for b in args.batch_sizes.split(",")]
    rates: dict[tuple[int, int], list[float]] = {v: [] for v in variants}
    loads: list[float] = [os.getloadavg()[0]]
    work = Path(args.workdir)
    ftjob = str(Path(sys.executable).parent / "ftjob")
    started = time.monotonic()
    for rep in range(args.repeats):
        for procs, batch in variants:
            job = copy.deepcopy(base)
            job["spec"]["hardware"]["procsPerNode"] = procs
            job["spec"]["training"]["batchSizePerDevice"] = batch
            job["spec"]["training"]["epochs"] = args.epochs
            wd = work / f"p{procs}-b{batch}-r{rep}"
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                yaml.safe_dump(job, f, allow_unicode=True)
            try:
                subprocess.run([ftjob, "run", "-f", f.name, "--workdir", str(wd), "-q"], cwd=ROOT, check=True)
            finally:
                os.unlink(f.name)
            rate = run_rate(train_windows(wd / "logs" / "train-node0.log"))
            rates[(procs, batch)].append(rate)
            loads.append(os.getloadavg()[0])
            print(f"ranks {procs} batch {batch} repeat {rep}: {rate:.1f} samples/s", file=sys.stderr, flush=True)

    model_cfg = json.loads((ROOT / base["spec"]["task"]["model"] / "config.json").read_text(encoding="utf-8"))
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    records = []
    for (procs, batch), got in rates.items():
        records.append(
            {
                "id": f"cpu-demo-ja-{procs}rank-b{batch}",
                "date": today,
                "source": "measured here: python benchmarks/calibrate_cpu.py "
                "(ftjob run of examples/jobs/demo-ja-sentiment.yaml)",
                "machine": f"{machine()}; load average {min(loads):.1f}-{max(loads):.1f} during the runs",
                "profile": "cpu",
                "nodes": 1,
                "procsPerNode": procs,
                "devicesPerRank": max(1, (os.cpu_count() or 1) // procs),
                "precision": "fp32",
                "compile": False,
                "task": "text-classification",
                "model": base["spec"]["task"]["model"],
                "modelConfig": copy.deepcopy(model_cfg),  # no YAML aliases between records
                "dataset": base["spec"]["task"]["dataset"]["path"],
                "maxLength": int(base["spec"]["task"].get("maxLength", 128)),
                "tokensPerSample": padded_tokens(base, batch),
                "batchSizePerDevice": batch,
                "samplesPerSecond": round(statistics.median(got), 1),
                "repeats": [round(r, 1) for r in got],
                "note": f"the demo job with batchSizePerDevice {batch} and {args.epochs:g} epochs (the demo has 6); "
                "samples/s is the median of the repeats, each the run's samples over its time after the first step",
            }
        )
    text = yaml.safe_dump(records, sort_keys=False, allow_unicode=True, width=120)
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    print(f"{len(records)} records in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
