"""The start of a run: the clock that times it to its first training step, and what its workers leave unimported.

The clock (status.progress.timeToFirstStepSeconds, docs/runtime.md "Time to the first step") starts when the
process that launches rank 0 was created: the pod's main process (`ftjob-runtime launch` on the rank-0 pod,
`ftjob-runtime mpirun` on the launcher pod) or `ftjob run`. That process records its start in FTJOB_STARTED_AT
for the processes it starts; a worker started without it (by hand, by a test) counts from its own start. Rank 0
reports that time and the end of its first training step on its `train` progress lines (callbacks.py).

Unimported: transformers and accelerate import some optional packages whenever they are installed, whether or
not a job uses them (transformers.trainer_utils imports peft, and peft in turn model code of its own; accelerate's
config module imports boto3). The images install both, peft for causal-lm's LoRA and boto3 for S3 locations. A
worker whose job uses neither marks them absent before transformers loads (`hide`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from finetune_runtime.config import TaskConfig

# Unix time (seconds, decimal) at which the process that launched this run was created; read by the workers.
STARTED_AT_VAR = "FTJOB_STARTED_AT"


def process_start(pid: int | str = "self", proc: Path = Path("/proc")) -> float | None:
    """Unix time at which process `pid` was created, as the kernel recorded it: /proc/<pid>/stat's starttime
    (clock ticks after boot) against /proc/uptime, both at 10 ms resolution, so the interpreter's own start-up
    counts too. None without /proc (or when the process is gone)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        uptime = float((proc / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    now = time.time()
    # Field 2 (comm) may hold spaces and parentheses: fields 3... follow the last ')'; starttime is field 22.
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def mark_start(env: MutableMapping[str, str] = os.environ) -> float:
    """For a launcher: FTJOB_STARTED_AT, set to this process's start unless an outer launcher set it already
    (`ftjob run` starts `ftjob-runtime launch`); the processes it starts inherit it."""
    if (given := _parse(env.get(STARTED_AT_VAR))) is not None:
        return given
    started = process_start() or time.time()
    env[STARTED_AT_VAR] = f"{started:.3f}"
    return started


def started_at(env: Mapping[str, str] = os.environ) -> float:
    """When the run started: FTJOB_STARTED_AT from the launcher, else this process's own start."""
    given = _parse(env.get(STARTED_AT_VAR))
    return given if given is not None else (process_start() or time.time())


def _parse(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def iso_utc(t: float) -> str:
    """Unix time as the progress lines carry it: ISO 8601, UTC, milliseconds (2026-12-04T19:33:40.123Z)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def unused_packages(task: TaskConfig, env: Mapping[str, str]) -> tuple[str, ...]:
    """The optional packages this job never imports, from its config and env alone (before any task module or
    transformers loads): peft unless LoRA is asked for (task.lora, or a local task.model that is an adapter,
    which transformers loads through peft); boto3 unless a location is on S3 (FTJOB_OUTPUT_URL, an s3://
    FTJOB_RESUME_FROM)."""
    unused: list[str] = []
    adapter = Path(task.model, "adapter_config.json")
    if task.raw.get("lora") is None and not adapter.is_file():
        unused.append("peft")
    if not env.get("FTJOB_OUTPUT_URL") and not env.get("FTJOB_RESUME_FROM", "").startswith("s3://"):
        unused.append("boto3")
    return tuple(unused)


def hide(packages: tuple[str, ...], modules: MutableMapping[str, Any] = sys.modules) -> tuple[str, ...]:
    """Make `packages` look not installed to this process: a None entry in sys.modules makes
    importlib.util.find_spec (which transformers' and accelerate's availability checks call) return None and an
    `import` raise ImportError. Packages already imported are left alone; returns the ones hidden."""
    hidden = tuple(p for p in packages if p not in modules)
    for p in hidden:
        modules[p] = None
    return hidden
