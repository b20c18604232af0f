"""A job's location: the one directory (output claim) or S3 prefix (output.url) that holds what the job writes.

The operator computes it (`<output.path>/<namespace>/<job>` of the claim, mounted at /output; or
`<output.url>/<namespace>/<job>/`, FTJOB_OUTPUT_URL) and reports it in status.output.location; the runtime never
re-derives it. Jobs of other names never share it. A job deleted and created again under the same name does, so
inside it every job keeps to what carries its uid (FTJOB_JOB_UID):

    job.json                         {namespace, name, uid}: the job whose final artefacts lie here
    model/, metrics.json, ...        the final artefacts of that job (its task plugin's outputs)
    checkpoints/<uid>/checkpoint-N/  each job's own checkpoints; the marker records the uid (checkpoints.py)
    previous/<uid>/                  final artefacts of an earlier job of this name, moved aside by its successor

A job resumes only from checkpoints under its own uid (a new job of an old name starts fresh), deletes only
those, and moves its predecessor's final artefacts aside (`take_over`) before it writes any of its own: nothing
another job wrote is lost. `output.resumeFrom` (FTJOB_RESUME_FROM) names a location or checkpoint to start from
instead (`find_checkpoint`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from finetune_runtime import checkpoints

log = logging.getLogger("finetune_runtime")

JOB_RECORD = "job.json"
CHECKPOINTS = "checkpoints"
PREVIOUS = "previous"
# Names take_over leaves where they are: the checkpoint and previous trees (uid-keyed already) and the record.
_KEPT = (JOB_RECORD, CHECKPOINTS, PREVIOUS)
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Where the runtime is started by hand (tests, a config run directly) no operator gives a uid: all such runs share
# this one, so a second run in the same output directory resumes the first (as `ftjob run` does, which sets it).
LOCAL_UID = "local"


class ConfigurationError(ValueError):
    """The environment names no usable identity or location; the message names the variable."""


@dataclass(frozen=True)
class Identity:
    namespace: str
    name: str
    uid: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Identity:
        uid = env.get("FTJOB_JOB_UID") or LOCAL_UID
        if not _UID.match(uid):
            raise ConfigurationError(f"FTJOB_JOB_UID must be a Kubernetes uid (letters, digits, '-'), got {uid!r}")
        return cls(env.get("FTJOB_NAMESPACE") or "default", env.get("FTJOB_JOB_NAME") or "ftjob", uid)

    def record(self) -> str:
        return json.dumps({"namespace": self.namespace, "name": self.name, "uid": self.uid}, indent=1) + "\n"


class Location(Protocol):
    """A job's location: a directory (DirLocation) or an S3 prefix (s3sync.S3Location). Names are relative."""

    def top(self, under: str = "") -> set[str]:
        """The names directly inside the location, or inside its directory `under` (files and directories)."""

    def keys(self, under: str = "") -> list[str]:
        """Every file below `under`, relative to the location."""

    def read_text(self, name: str) -> str | None:
        """A small file's text; None when absent."""

    def write_text(self, name: str, text: str) -> None: ...

    def put(self, src: Path, name: str) -> None:
        """Copy the local file src to `name`."""

    def move(self, name: str, to_dir: str) -> None:
        """Move the file or directory `name` into directory `to_dir` (kept under its own name)."""

    def __str__(self) -> str: ...


class DirLocation:
    """The location as a directory: the output claim's job directory, mounted at /output."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def top(self, under: str = "") -> set[str]:
        base = self.root / under if under else self.root
        return {p.name for p in base.iterdir()} if base.is_dir() else set()

    def keys(self, under: str = "") -> list[str]:
        base = self.root / under if under else self.root
        if base.is_file():
            return [under]
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def read_text(self, name: str) -> str | None:
        try:
            return (self.root / name).read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_text(self, name: str, text: str) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

    def put(self, src: Path, name: str) -> None:
        dst = self.root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)

    def move(self, name: str, to_dir: str) -> None:
        dst = self.root / to_dir / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.root / name, _free_name(dst))  # one rename per entry: atomic on the claim's filesystem

    def __str__(self) -> str:
        return str(self.root)


def _free_name(dst: Path) -> Path:
    """dst, or dst-1, dst-2, ... when taken: a move never replaces what an earlier move put there."""
    n, out = 0, dst
    while out.exists():
        n += 1
        out = dst.with_name(f"{dst.name}-{n}")
    return out


def owner(loc: Location) -> Identity | None:
    text = loc.read_text(JOB_RECORD)
    if text is None:
        return None
    try:
        doc = json.loads(text)
        return Identity(str(doc["namespace"]), str(doc["name"]), str(doc["uid"]))
    except (json.JSONDecodeError, KeyError, TypeError):
        return Identity("", "", "unknown")


def take_over(loc: Location, me: Identity) -> tuple[str, list[str]] | None:
    """Make the location this job's before it writes final artefacts there (global rank 0, at start): another
    job's final artefacts (or those of a runtime that wrote no job.json) move to previous/<its uid>/, then
    job.json names this job. Returns (where they went, what moved) when something moved.

    Safe to repeat after a crash half-way: job.json changes last, so the next start moves the rest."""
    was = owner(loc)
    if was is not None and was.uid == me.uid:
        return None
    theirs = sorted(n for n in loc.top() if n not in _KEPT and not n.startswith("."))
    to_dir = f"{PREVIOUS}/{was.uid if was else 'unknown'}"
    for name in theirs:
        loc.move(name, to_dir)
    if was is not None and theirs:
        loc.move(JOB_RECORD, to_dir)  # the predecessor's record goes with its artefacts
    loc.write_text(JOB_RECORD, me.record())
    return (to_dir, theirs) if theirs else None


def checkpoint_dir(uid: str) -> str:
    """This job's checkpoints, relative to the location."""
    return f"{CHECKPOINTS}/{uid}"


def others_checkpoints(loc: Location, uid: str) -> list[str]:
    """Checkpoint directories in the location that are not this job's (earlier jobs of its name; an older
    runtime's checkpoints/checkpoint-N): what a new job does not resume unless output.resumeFrom names them."""
    return sorted(f"{CHECKPOINTS}/{n}" for n in loc.top(CHECKPOINTS) if n != uid)


def find_checkpoint(keys: Iterable[str]) -> tuple[str, int] | None:
    """The newest checkpoint with a completeness marker among `keys` (files relative to an output.resumeFrom):
    (its directory relative to that place, its step).

    output.resumeFrom may name a job's location (checkpoints/<uid>/checkpoint-N, or an older runtime's
    checkpoints/checkpoint-N) or a directory of checkpoints (checkpoint-N); the newest step wins, whichever job
    wrote it. (A resumeFrom that names one checkpoint is that checkpoint: resume.py.)"""
    best: tuple[int, str] | None = None
    for key in keys:
        *ckpt, leaf = key.split("/")
        if leaf != checkpoints.COMPLETE_MARKER or not (len(ckpt) == 1 or (ckpt[0] == CHECKPOINTS and len(ckpt) <= 3)):
            continue
        step = checkpoints.checkpoint_step(Path(ckpt[-1]))
        if step is not None and (best is None or step > best[0]):
            best = (step, "/".join(ckpt))
    return (best[1], best[0]) if best else None


def upload_outputs(local_root: Path, loc: Location, names: Iterable[str]) -> list[str]:
    """Copy the final artefacts (files and directories `names` under local_root: the task's outputs,
    metrics.json, ...) to the location, e.g. from the scratch /output to S3. Returns what it copied."""
    done: list[str] = []
    for name in names:
        src = local_root / name
        files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src] if src.is_file() else []
        for f in files:
            rel = f.relative_to(local_root).as_posix()
            loc.put(f, rel)
            done.append(rel)
    log.info("uploaded final artefacts to %s", loc)
    return done
