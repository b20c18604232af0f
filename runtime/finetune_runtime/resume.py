"""Where training resumes from: this job's newest complete checkpoint, else the one `output.resumeFrom` names.

A job resumes by itself only from checkpoints that carry its uid (checkpoints.py, location.py): those under
`checkpoints/<uid>/` of its location, restored from S3 first when the output is a URL. When it has none,
`FTJOB_RESUME_FROM` (output.resumeFrom) may name another job's location or checkpoints: an s3:// URL (downloaded
into the scratch output by each node's local rank 0) or a directory (a pvc:// resumeFrom, mounted read-only at
/resume-from, read in place).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_runtime import checkpoints, location

log = logging.getLogger("finetune_runtime")

RESUME_FROM_DIR = ".resume-from"  # under the scratch output: an s3:// resumeFrom's download


class ResumeError(ValueError):
    """output.resumeFrom names no complete checkpoint; the message says where it looked."""


@dataclass(frozen=True)
class ResumePoint:
    path: Path  # the local checkpoint directory the Trainer resumes from
    url: str | None  # where it was downloaded from (S3), else None
    own: bool  # this job's own checkpoint (False: output.resumeFrom's)

    @property
    def finished(self) -> bool:
        """This job's training had ended at this checkpoint: only the final steps are left. (Another job's final
        checkpoint is a start: this job trains on from it to its own end.)"""
        return self.own and checkpoints.finished_training(self.path)


def _is_checkpoint(where: str) -> bool:
    return checkpoints.checkpoint_step(Path(where.rstrip("/"))) is not None


def _local_markers(root: Path) -> list[str]:
    """The marker files find_checkpoint considers, relative to root (without walking whole checkpoint trees)."""
    marker = checkpoints.COMPLETE_MARKER
    patterns = (f"*/{marker}", f"{location.CHECKPOINTS}/*/{marker}", f"{location.CHECKPOINTS}/*/*/{marker}")
    return sorted(p.relative_to(root).as_posix() for pattern in patterns for p in root.glob(pattern))


def find_local(source: Path) -> Path:
    """The checkpoint a directory resumeFrom names (in place: the mount is read-only)."""
    if _is_checkpoint(source.name):
        found = source if checkpoints.is_complete(source) else None
    else:
        hit = location.find_checkpoint(_local_markers(source)) if source.is_dir() else None
        found = source / hit[0] if hit else None
        found = found if found is not None and checkpoints.is_complete(found) else None
    if found is None:
        raise ResumeError(
            f"output.resumeFrom ({source}) holds no complete checkpoint: name a job's location "
            "(its status.output.location), a checkpoints/<uid>/ directory or a checkpoint-<step>/ directory"
        )
    return found


def download_s3(source: str, scratch: Path) -> tuple[Path, str]:
    """Download the checkpoint an s3:// resumeFrom names into scratch/checkpoint-<step>: (local dir, its URL)."""
    from finetune_runtime import s3sync

    loc = s3sync.location_from_url(source, "FTJOB_RESUME_FROM")
    keys = loc.keys()
    hit: tuple[str, int] | None
    if _is_checkpoint(source):
        step = checkpoints.checkpoint_step(Path(source.rstrip("/"))) or 0
        hit = ("", step) if checkpoints.COMPLETE_MARKER in keys else None
    else:
        hit = location.find_checkpoint(keys)
    if hit is None:
        raise ResumeError(
            f"output.resumeFrom ({source}) holds no complete checkpoint: name a job's location (its "
            "status.output.location), a checkpoints/<uid>/ prefix or a checkpoint-<step>/ prefix under it"
        )
    where, step = hit
    path = s3sync.download_tree(loc, where, scratch / f"checkpoint-{step}")
    return path, (loc.url_of(where) + "/" if where else str(loc))


def resume_from(env: Mapping[str, str], scratch: Path, downloader: bool) -> ResumePoint | None:
    """output.resumeFrom's checkpoint, or None when the spec names none. `downloader`: this process fetches an
    s3:// one (each node's local rank 0; the others, after it, find the download in `scratch`)."""
    source = env.get("FTJOB_RESUME_FROM")
    if not source:
        return None
    if not source.startswith("s3://"):
        return ResumePoint(find_local(Path(source)), None, own=False)
    if downloader:
        path, url = download_s3(source, scratch / RESUME_FROM_DIR)
        log.info("downloaded checkpoint %s from %s (output.resumeFrom)", path.name, url)
        return ResumePoint(path, url, own=False)
    found = checkpoints.newest_complete(scratch / RESUME_FROM_DIR)
    if found is None:
        raise ResumeError(f"the checkpoint of output.resumeFrom ({source}) was not downloaded on this node")
    return ResumePoint(found, None, own=False)


# What accelerate names a multi-process CPU device ("cpu:0"); torch restores only plain "cpu".
_INDEXED_CPU = "cpu:"
_indexed_cpu_accepted = False


def accept_indexed_cpu_locations() -> None:
    """Let torch.load restore a storage to an indexed CPU device ("cpu:0") as to "cpu". transformers 4.x's Trainer
    reads the optimizer state of a multi-process resume with map_location=args.device, and a multi-process CPU
    run's device carries an index there, which torch refuses ("don't know how to restore data location"): every
    resume of a 2-rank gloo job failed under the transformers 4.57 pin. transformers 5 maps to plain "cpu" itself.
    Registered once per process; every other location goes to torch's own deserializers."""
    global _indexed_cpu_accepted
    if _indexed_cpu_accepted:
        return
    import torch

    def restore(storage: Any, where: str) -> Any:
        return storage if where.startswith(_INDEXED_CPU) else None  # torch.load reads every storage to the CPU

    torch.serialization.register_package(11, lambda storage: None, restore)
    _indexed_cpu_accepted = True
