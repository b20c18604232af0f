"""Writes the generated sections of docs/estimate.md: an example run (`ftjob estimate` on the trn1 sample), the
peak table (from the profiles' throughput data) and the leave-one-out check of the shipped calibration records
(`ftjob estimate --leave-one-out`).

    python hack/estimate_doc.py          # rewrite the sections
    python hack/estimate_doc.py --check  # exit 1 when they are stale (what tests/unit/test_estimate_doc.py asserts)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from finetune_operator import profiles
from finetune_operator.api.schema import PRECISIONS
from finetune_operator.estimate import Calibration, leave_one_out, loo_markdown, shipped_records

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "estimate.md"


def peaks_markdown() -> str:
    lines = [
        "| profile | device (one rank's unit) | precision | dense peak TFLOP/s | source |",
        "|---|---|---|---|---|",
    ]
    for p in profiles.load_all().values():
        tp = p.throughput
        if tp is None:
            continue
        for dev in tp.devices.values():
            for prec in PRECISIONS:
                peak = dev.peaks[prec]
                value = "none" if peak.tflops is None else f"{peak.tflops:g}"
                lines.append(f"| {p.name} | {dev.name} ({tp.unit}) | {prec} | {value} | {peak.source} |")
    return "\n".join(lines) + "\n"


EXAMPLE = "manifests/samples/trn1-bert-ja-2core-bf16.yaml"


def example_text() -> str:
    """`ftjob estimate -f EXAMPLE` as the shipped data give it, in a code block."""
    import yaml

    from finetune_operator.admission import validate
    from finetune_operator.estimate import estimate, load_prices, render_text

    job = validate(yaml.safe_load((ROOT / EXAMPLE).read_text(encoding="utf-8")))
    est = estimate(job, Calibration(shipped_records()), load_prices(None), cwd=ROOT)
    return "```\n" + render_text(est) + "```\n"


def sections() -> dict[str, str]:
    return {
        "estimate-example": example_text(),
        "estimate-peaks": peaks_markdown(),
        "estimate-loo": loo_markdown(leave_one_out(Calibration(shipped_records()))),
    }


def render(text: str) -> str:
    for name, body in sections().items():
        pattern = re.compile(rf"(<!-- {name}:begin[^>]*-->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{DOC}: no <!-- {name}:begin --> ... <!-- {name}:end --> section")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    current = DOC.read_text(encoding="utf-8")
    wanted = render(current)
    if "--check" in argv:
        if wanted != current:
            print(f"{DOC} is stale: run python hack/estimate_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
