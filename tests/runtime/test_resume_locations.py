"""A multi-process CPU resume under transformers 4.x: its Trainer loads the optimizer state with
map_location=args.device, an indexed CPU device, which torch alone refuses (resume.accept_indexed_cpu_locations)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, torch
from finetune_runtime import resume
path = sys.argv[1]
torch.save({"state": torch.arange(4.0)}, path)
def load():
    return torch.load(path, map_location=torch.device("cpu", 0), weights_only=True)["state"]
if sys.argv[2] == "with":
    resume.accept_indexed_cpu_locations()
    resume.accept_indexed_cpu_locations()  # once per process, however often resumed
    got = load()
    assert got.device.type == "cpu" and got.tolist() == [0.0, 1.0, 2.0, 3.0], got
    print("restored")
else:
    try:
        load()
    except RuntimeError as e:
        print("refused:", e)
"""


def _run(tmp_path: Path, mode: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "optimizer.pt"), mode],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_torch_alone_refuses_an_indexed_cpu_location_and_the_runtime_accepts_it(tmp_path: Path) -> None:
    assert "refused: don't know how to restore data location" in _run(tmp_path, "without")
    assert "restored" in _run(tmp_path, "with")
