"""hack/gpu-check.sh, the runtime's nvidia path check for GPU machines, run here the only way it can: with
PROFILE=cpu. Its job rewriting, the source-tree `ftjob-runtime` shim, the two `ftjob run` trainings and the
report are real; CUDA and NCCL are what a GPU machine adds (benchmarks/README.md, docs/runtime.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_both_samples_with_the_profile_it_is_given(tmp_path: Path) -> None:
    env = {**os.environ, "PROFILE": "cpu", "PRECISION": "fp32", "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run([str(ROOT / "hack" / "gpu-check.sh")], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for sample in ("squad-mini-mpi", "instruct-mini-lora"):
        job = yaml.safe_load((tmp_path / f"{sample}.yaml").read_text())
        assert job["spec"]["hardware"] == {"profile": "cpu", "nodes": 1, "procsPerNode": 1}
        assert "launcher" not in job["spec"] and job["spec"]["training"]["precision"] == "fp32"
        assert f"{sample}: ok in" in proc.stdout
    assert len(re.findall(r"training on cpu(:0)?, fp32, process group gloo", proc.stdout)) == 2
    assert "'backend': 'cpu'" in proc.stdout
