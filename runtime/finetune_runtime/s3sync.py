"""Everything the runtime does on S3 (`output.url`, FTJOB_OUTPUT_URL = the job's location; `output.resumeFrom`).

With a URL as output, `/output` is a scratch emptyDir that dies with the pod, so a group restart would start
from step 0. The rank that writes checkpoints (global rank 0) uploads each one to `<location>/checkpoints/<uid>/
checkpoint-<step>/` as soon as the Trainer has saved it, the completeness marker last; at start each node's local
rank 0 downloads the newest remote checkpoint of this job (its marker names this job's uid), and the Trainer
resumes from it as from a local one. Remote rotation keeps this job's newest `keep` complete checkpoints, like the
local save_total_limit, and never touches another job's. At the end rank 0 uploads the final artefacts to
`<location>/`.

boto3 comes with the images (imported lazily); its standard configuration applies: credentials from the pod
(IRSA, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ...), AWS_REGION, and AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3)
for an S3-compatible server.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_runtime import checkpoints, location

log = logging.getLogger("finetune_runtime")

_DOWNLOAD_PREFIX = ".download-"  # a download in progress under a local checkpoints dir (renamed when whole)
_DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # without leading/trailing slashes; "" for the bucket's root

    @classmethod
    def parse(cls, url: str, variable: str = "FTJOB_OUTPUT_URL") -> S3Url:
        if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
            raise ValueError(f"{variable} must be an s3://bucket[/prefix] URL, got {url!r}")
        bucket, _, prefix = url[5:].partition("/")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}/" if self.prefix else f"s3://{self.bucket}/"


def s3_client() -> Any:
    from finetune_runtime.backends import MissingStackError

    try:
        import boto3  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as e:
        raise MissingStackError(
            "FTJOB_OUTPUT_URL (or an s3:// FTJOB_RESUME_FROM) is set but boto3 is not installed; the "
            "finetune-operator images include it"
        ) from e
    return boto3.client("s3")


class S3Location:
    """A location (location.Location) under an S3 prefix; `client` is a boto3 S3 client."""

    def __init__(self, url: S3Url, client: Any) -> None:
        self.url = url
        self.client = client

    def _listing(self, under: str, delimiter: bool) -> tuple[list[str], list[str]]:
        root = self.url.key(under) + "/" if self.url.key(under) else ""
        kw: dict[str, Any] = {"Bucket": self.url.bucket, "Prefix": root}
        if delimiter:
            kw["Delimiter"] = "/"
        keys: list[str] = []
        dirs: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(**kw):
            keys += [o["Key"] for o in page.get("Contents", [])]
            dirs += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        return keys, dirs

    def _rel(self, key: str) -> str:
        return key[len(self.url.prefix) + 1 :] if self.url.prefix else key

    def top(self, under: str = "") -> set[str]:
        keys, dirs = self._listing(under, delimiter=True)
        cut = len(under.strip("/")) + 1 if under.strip("/") else 0
        return {self._rel(k)[cut:] for k in keys} | {self._rel(d).rstrip("/")[cut:] for d in dirs}

    def keys(self, under: str = "") -> list[str]:
        return sorted(self._rel(k) for k in self._listing(under, delimiter=False)[0])

    def read_text(self, name: str) -> str | None:
        try:
            body = self.client.get_object(Bucket=self.url.bucket, Key=self.url.key(name))["Body"]
        except self.client.exceptions.NoSuchKey:
            return None
        return str(body.read().decode("utf-8"))

    def write_text(self, name: str, text: str) -> None:
        self.client.put_object(Bucket=self.url.bucket, Key=self.url.key(name), Body=text.encode("utf-8"))

    def put(self, src: Path, name: str) -> None:
        self.client.upload_file(str(src), self.url.bucket, self.url.key(name))

    def get(self, name: str, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.url.bucket, self.url.key(name), str(dst))

    def delete(self, names: Iterable[str]) -> None:
        keys = [self.url.key(n) for n in names]
        for i in range(0, len(keys), _DELETE_BATCH):
            self.client.delete_objects(
                Bucket=self.url.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + _DELETE_BATCH]], "Quiet": True},
            )

    def move(self, name: str, to_dir: str) -> None:
        """Server-side copies first, deletions after: an interrupted move leaves both copies, never none."""
        names = self.keys(name) or [name]
        for n in names:
            src = {"Bucket": self.url.bucket, "Key": self.url.key(n)}
            self.client.copy(src, self.url.bucket, self.url.key(to_dir, n))
        self.delete(names)

    def url_of(self, name: str) -> str:
        return f"s3://{self.url.bucket}/{self.url.key(name)}"

    def __str__(self) -> str:
        return str(self.url)


def download_tree(loc: S3Location, under: str, local: Path) -> Path:
    """Download every file below `under` into `local` (replaced whole: a partial download is never left there)."""
    local.parent.mkdir(parents=True, exist_ok=True)
    for stale in local.parent.glob(_DOWNLOAD_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = local.parent / f"{_DOWNLOAD_PREFIX}{local.name}"
    prefix = under.rstrip("/") + "/" if under else ""
    for name in loc.keys(under):
        loc.get(name, tmp / name[len(prefix) :])
    shutil.rmtree(local, ignore_errors=True)  # an incomplete local copy of the same step
    os.replace(tmp, local)
    return local


class CheckpointSync:
    """Upload/rotate/restore this job's checkpoints under `<location>/checkpoints/<uid>/`."""

    def __init__(self, loc: S3Location, uid: str, keep: int) -> None:
        self.loc = loc
        self.uid = uid
        self.keep = keep
        self.root = location.checkpoint_dir(uid)

    def _ckpt(self, step: int) -> str:
        return f"{self.root}/checkpoint-{step}"

    def remote_checkpoints(self) -> dict[int, list[str]]:
        """step -> every file (relative to the location) under that checkpoint."""
        found: dict[int, list[str]] = {}
        for name in self.loc.keys(self.root):
            step = checkpoints.checkpoint_step(Path(name[len(self.root) + 1 :].split("/", 1)[0]))
            if step is not None:
                found.setdefault(step, []).append(name)
        return found

    def complete_steps(self, found: dict[int, list[str]]) -> list[int]:
        return sorted(s for s, names in found.items() if f"{self._ckpt(s)}/{checkpoints.COMPLETE_MARKER}" in names)

    def upload(self, ckpt: Path) -> str:
        """Upload a complete local checkpoint, its marker last (a checkpoint cut off mid-upload has no marker
        and is never restored), then rotate the remote ones. Returns the checkpoint's URL."""
        step = checkpoints.checkpoint_step(ckpt)
        if step is None or not checkpoints.is_complete(ckpt):
            raise ValueError(f"{ckpt} is not a complete checkpoint")
        files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != checkpoints.COMPLETE_MARKER)
        for f in [*files, ckpt / checkpoints.COMPLETE_MARKER]:
            self.loc.put(f, f"{self._ckpt(step)}/{f.relative_to(ckpt).as_posix()}")
        url = self.loc.url_of(self._ckpt(step)) + "/"
        log.info("uploaded checkpoint %s to %s", ckpt.name, url)
        try:
            self.rotate(keep_step=step)
        except Exception as e:  # old checkpoints left behind cost storage, not the run
            log.warning("could not delete old checkpoints under %s (the pods' role needs s3:DeleteObject): %s", url, e)
        return url

    def rotate(self, keep_step: int) -> list[int]:
        """Delete this job's remote checkpoints other than the newest `keep` complete ones (and `keep_step`):
        older ones and partial uploads of an earlier life of the job. Each loses its marker first, so a deletion
        cut off half-way never leaves something that looks complete."""
        found = self.remote_checkpoints()
        kept = set(self.complete_steps(found)[-self.keep :]) | {keep_step}
        gone = sorted(s for s in found if s not in kept)
        for s in gone:
            marker = f"{self._ckpt(s)}/{checkpoints.COMPLETE_MARKER}"
            self.loc.delete(sorted(found[s], key=lambda k: k != marker))
        return gone

    def restore(self, local_root: Path) -> tuple[Path, str] | None:
        """Download this job's newest complete remote checkpoint into local_root unless a local one is as new.
        A checkpoint whose marker names another uid is refused (logged), never restored. Returns (local dir,
        its URL) when it downloaded one."""
        found = self.remote_checkpoints()
        local = checkpoints.newest_complete(local_root, self.uid)
        have = (checkpoints.checkpoint_step(local) or 0) if local is not None else -1
        for step in reversed(self.complete_steps(found)):
            if step <= have:
                return None
            marker = self.loc.read_text(f"{self._ckpt(step)}/{checkpoints.COMPLETE_MARKER}") or ""
            writer = checkpoints.marker_uid_of(marker)
            if writer != self.uid:
                log.warning(
                    "not restoring %s: job uid %s wrote it, this job is uid %s",
                    self.loc.url_of(self._ckpt(step)),
                    writer,
                    self.uid,
                )
                continue
            path = download_tree(self.loc, self._ckpt(step), local_root / f"checkpoint-{step}")
            return path, self.loc.url_of(self._ckpt(step)) + "/"
        return None


def location_from_url(url: str, variable: str = "FTJOB_OUTPUT_URL") -> S3Location:
    return S3Location(S3Url.parse(url, variable), s3_client())
