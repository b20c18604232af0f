"""Checkpoint selection: resume from the newest COMPLETE checkpoint of THIS job, never from a half-written one or
another job's.

HF Trainer writes `checkpoint-<step>/` file by file; a pod killed mid-save leaves a directory that looks like a
checkpoint but cannot be resumed. Once the Trainer reports the save finished (`on_save`), the runtime writes a
marker file that records the job's uid and every file the save wrote. A checkpoint counts as complete when its
marker is there and every file it lists still is (so no weight-file names are needed here: a LoRA checkpoint holds
adapter weights, a full one the model's). A checkpoint whose marker names another uid was written by another job
(a deleted job of the same name, or any other): the runtime never resumes from it unless the spec names it
(`output.resumeFrom`, resume.py).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

COMPLETE_MARKER = "FTJOB_COMPLETE"
TRAINER_STATE = "trainer_state.json"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(path: Path) -> int | None:
    m = _CKPT_RE.match(path.name)
    return int(m.group(1)) if m else None


def parse_marker(text: str) -> dict[str, object]:
    """A marker's record; {} for the plain-text marker of an older runtime (no uid, no file list)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def marker_uid_of(text: str) -> str | None:
    uid = parse_marker(text).get("uid")
    return uid if isinstance(uid, str) else None


def _marker(path: Path) -> dict[str, object] | None:
    try:
        return parse_marker((path / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except OSError:
        return None


def marker_uid(path: Path) -> str | None:
    """The uid of the job that wrote the checkpoint (None: no marker, or one without a uid)."""
    uid = (_marker(path) or {}).get("uid")
    return uid if isinstance(uid, str) else None


def is_complete(path: Path) -> bool:
    marker = _marker(path)
    if marker is None or not (path / TRAINER_STATE).is_file():
        return False
    files = marker.get("files")
    if not isinstance(files, list):  # an older runtime's marker lists nothing: the Trainer's state must do
        return True
    return all(isinstance(f, str) and (path / f).is_file() for f in files)


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if (s := checkpoint_step(p)) is not None and p.is_dir()]
    return sorted(found)


def newest_complete(root: Path, uid: str | None = None) -> Path | None:
    """The newest complete checkpoint under root; with `uid`, only one that job wrote."""
    complete = [p for _, p in list_checkpoints(root) if is_complete(p) and (uid is None or marker_uid(p) == uid)]
    return complete[-1] if complete else None


def foreign(root: Path, uid: str) -> list[Path]:
    """Complete checkpoints under root that another job (or an older runtime, without a uid) wrote."""
    return [p for _, p in list_checkpoints(root) if is_complete(p) and marker_uid(p) != uid]


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


def mark_complete(path: Path, uid: str) -> None:
    """Written last, once the save finished: the job's uid and the files the save wrote."""
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)
    doc = {"uid": uid, "files": files}
    (path / COMPLETE_MARKER).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def remove_incomplete(root: Path) -> list[Path]:
    """Delete partial checkpoints (rank 0 at start): the Trainer would otherwise reuse or rotate them."""
    gone = incomplete(root)
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone
