"""How fast the pure builders turn a FineTuneJob into its children (validate + desired), per sample.

    python benchmarks/render.py [--seconds 2] [--json OUT]

This is the CPU cost of one reconcile pass before any API call; the operator pays it per job per pass."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from benchio import write_json

from finetune_operator.admission import validate
from finetune_operator.builders import desired
from finetune_operator.sshkeys import generate_keys

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"


def render_once(raw: dict[str, Any], keys: Any) -> int:
    job = validate(raw)
    job["metadata"].setdefault("uid", "00000000-0000-0000-0000-000000000000")
    return len(desired(job, ssh_keys=keys).all())


def measure(path: Path, seconds: float) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["metadata"].setdefault("namespace", "default")
    keys = generate_keys(raw["metadata"]["name"])
    objects = render_once(raw, keys)  # warm-up; also the object count
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        render_once(raw, keys)
        n += 1
    return {
        "sample": path.stem,
        "objects": objects,
        "rendersPerSecond": round(n / elapsed, 1),
        "microsecondsPerRender": round(elapsed / n * 1e6, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=2.0, help="time spent per sample")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [measure(p, args.seconds) for p in sorted(SAMPLES.glob("*.yaml"))]
    print("| sample | objects | renders/s | µs/render |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['sample']} | {r['objects']} | {r['rendersPerSecond']} | {r['microsecondsPerRender']} |")
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
