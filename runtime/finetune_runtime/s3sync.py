"""Checkpoints that outlive the pod when the output is an S3 URL (`output.url`, FTJOB_OUTPUT_URL).

With a URL as output, `/output` is a scratch emptyDir that dies with the pod, so a group restart would start
from step 0. The rank that writes checkpoints (global rank 0) uploads each one to `<url>/checkpoints/
checkpoint-<step>/` as soon as the Trainer has saved it, the completeness marker last; at start each node's
local rank 0 downloads the newest remote checkpoint that has its marker, and the Trainer resumes from it as from a
local one. Remote rotation keeps the newest `keep` complete checkpoints, like the local save_total_limit.

boto3 comes with the images (imported lazily, as for the final upload); its standard configuration applies:
credentials from the pod (IRSA, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ...), AWS_REGION, and AWS_ENDPOINT_URL
(or AWS_ENDPOINT_URL_S3) for an S3-compatible server.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_runtime import checkpoints

log = logging.getLogger("finetune_runtime")

CHECKPOINTS_PREFIX = "checkpoints"  # <url>/checkpoints/checkpoint-<step>/...: read back by restore()
_DOWNLOAD_PREFIX = ".download-"  # a download in progress under the local checkpoints dir (renamed when whole)


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # without leading/trailing slashes; "" for the bucket's root

    @classmethod
    def parse(cls, url: str) -> S3Url:
        if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
            raise ValueError(f"FTJOB_OUTPUT_URL must be an s3://bucket[/prefix] URL, got {url!r}")
        bucket, _, prefix = url[5:].partition("/")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def s3_client() -> Any:
    from finetune_runtime.backends import MissingStackError

    try:
        import boto3  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as e:
        raise MissingStackError(
            "FTJOB_OUTPUT_URL is set but boto3 is not installed; the finetune-operator "
            "images (finetune-operator/neuron, finetune-operator/xeon, ...) include it"
        ) from e
    return boto3.client("s3")


class CheckpointSync:
    """Upload/rotate/restore checkpoints under `<url>/checkpoints/`. `client`: a boto3 S3 client."""

    def __init__(self, url: str, client: Any, keep: int) -> None:
        self.url = S3Url.parse(url)
        self.client = client
        self.keep = keep

    def _ckpt_prefix(self, step: int | None = None) -> str:
        return self.url.key(CHECKPOINTS_PREFIX, f"checkpoint-{step}" if step is not None else "") + "/"

    def remote_checkpoints(self) -> dict[int, list[str]]:
        """step -> every key under that checkpoint's prefix."""
        found: dict[int, list[str]] = {}
        root = self._ckpt_prefix()
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.url.bucket, Prefix=root):
            for obj in page.get("Contents", []):
                name = obj["Key"][len(root) :].split("/", 1)[0]
                step = checkpoints.checkpoint_step(Path(name))
                if step is not None:
                    found.setdefault(step, []).append(obj["Key"])
        return found

    def complete_steps(self, found: Mapping[int, list[str]]) -> list[int]:
        return sorted(s for s, keys in found.items() if self._ckpt_prefix(s) + checkpoints.COMPLETE_MARKER in keys)

    def upload(self, ckpt: Path) -> str:
        """Upload a complete local checkpoint, its marker last (a checkpoint cut off mid-upload has no marker
        and is never restored), then rotate the remote ones. Returns the checkpoint's URL."""
        step = checkpoints.checkpoint_step(ckpt)
        if step is None or not checkpoints.is_complete(ckpt):
            raise ValueError(f"{ckpt} is not a complete checkpoint")
        prefix = self._ckpt_prefix(step)
        files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != checkpoints.COMPLETE_MARKER)
        for f in [*files, ckpt / checkpoints.COMPLETE_MARKER]:
            self.client.upload_file(str(f), self.url.bucket, prefix + f.relative_to(ckpt).as_posix())
        log.info("uploaded checkpoint %s to s3://%s/%s", ckpt.name, self.url.bucket, prefix)
        try:
            self.rotate(keep_step=step)
        except Exception as e:  # old checkpoints left behind cost storage, not the run
            log.warning(
                "could not delete old checkpoints under %s (the pods' role needs s3:DeleteObject): %s", self.url, e
            )
        return f"s3://{self.url.bucket}/{prefix}"

    def rotate(self, keep_step: int) -> list[int]:
        """Delete remote checkpoints other than the newest `keep` complete ones (and `keep_step`): older ones
        and partial uploads of an earlier life of the job. Each loses its marker first, so a deletion cut off
        half-way never leaves something that looks complete."""
        found = self.remote_checkpoints()
        kept = set(self.complete_steps(found)[-self.keep :]) | {keep_step}
        gone = sorted(s for s in found if s not in kept)
        for s in gone:
            marker = self._ckpt_prefix(s) + checkpoints.COMPLETE_MARKER
            keys = sorted(found[s], key=lambda k: k != marker)
            for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
                self.client.delete_objects(
                    Bucket=self.url.bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True}
                )
        return gone

    def restore(self, local_root: Path) -> tuple[Path, str] | None:
        """Download the newest complete remote checkpoint into local_root unless a local one is as new.
        Returns (local dir, its URL) when it downloaded one."""
        found = self.remote_checkpoints()
        steps = self.complete_steps(found)
        if not steps:
            return None
        step = steps[-1]
        local = checkpoints.newest_complete(local_root)
        if local is not None and (checkpoints.checkpoint_step(local) or 0) >= step:
            return None
        prefix = self._ckpt_prefix(step)
        local_root.mkdir(parents=True, exist_ok=True)
        for stale in local_root.glob(_DOWNLOAD_PREFIX + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = local_root / f"{_DOWNLOAD_PREFIX}checkpoint-{step}"
        for key in found[step]:
            dst = tmp / key[len(prefix) :]
            dst.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(self.url.bucket, key, str(dst))
        final = local_root / f"checkpoint-{step}"
        shutil.rmtree(final, ignore_errors=True)  # an incomplete local copy of the same step
        os.replace(tmp, final)
        return final, f"s3://{self.url.bucket}/{prefix}"


def from_env(env: Mapping[str, str], keep: int) -> CheckpointSync | None:
    url = env.get("FTJOB_OUTPUT_URL")
    return CheckpointSync(url, s3_client(), keep) if url else None
