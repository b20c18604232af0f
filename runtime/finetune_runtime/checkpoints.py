"""Checkpoint selection: resume from the newest COMPLETE checkpoint, never from a half-written one.

HF Trainer writes `checkpoint-<step>/` file by file; a pod killed mid-save leaves a directory that looks like a
checkpoint but cannot be resumed. The runtime writes a marker file once the Trainer reports the save finished
(`on_save`), and only directories with the marker and the Trainer's state count as complete.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

COMPLETE_MARKER = "FTJOB_COMPLETE"
TRAINER_STATE = "trainer_state.json"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
# A checkpoint's weights: the full model's, or a peft adapter's (causal-lm with task.lora saves only those).
_WEIGHTS = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def checkpoint_step(path: Path) -> int | None:
    m = _CKPT_RE.match(path.name)
    return int(m.group(1)) if m else None


def is_complete(path: Path) -> bool:
    return (
        path.is_dir()
        and (path / COMPLETE_MARKER).is_file()
        and (path / TRAINER_STATE).is_file()
        and any((path / w).is_file() for w in _WEIGHTS)
    )


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if (s := checkpoint_step(p)) is not None and p.is_dir()]
    return sorted(found)


def newest_complete(root: Path) -> Path | None:
    complete = [p for _, p in list_checkpoints(root) if is_complete(p)]
    return complete[-1] if complete else None


def incomplete(root: Path) -> list[Path]:
    return [p for _, p in list_checkpoints(root) if not is_complete(p)]


def finished_training(path: Path) -> bool:
    """The checkpoint was saved at the run's last step (the pod died after training, before the final
    artefacts): resuming it would make HF Trainer take one step past max_steps."""
    try:
        state = json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return bool(state.get("max_steps")) and int(state.get("global_step", 0)) >= int(state["max_steps"])


def mark_complete(path: Path) -> None:
    (path / COMPLETE_MARKER).write_text("ok\n", encoding="utf-8")


def remove_incomplete(root: Path) -> list[Path]:
    """Delete partial checkpoints (rank 0 at start): the Trainer would otherwise reuse or rotate them."""
    gone = incomplete(root)
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone
