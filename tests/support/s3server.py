"""A real S3-compatible server for tests: versitygw (`make versitygw`) with its posix backend in a temp dir, on
127.0.0.1 and a free port. Credentials are random per server; `env` is what a pod (or a boto3 client) needs."""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    root: Path  # the posix backend's directory: one subdirectory per bucket

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS SDK variables (boto3 reads AWS_ENDPOINT_URL since 1.28)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)


@contextmanager
def versitygw(binary: str, tmp: Path, deadline_s: float = 60) -> Iterator[S3Server]:
    root = tmp / "s3-root"
    root.mkdir(parents=True)
    port = _free_port()
    access, secret = "ftjob" + secrets.token_hex(4), secrets.token_hex(16)
    log = (tmp / "versitygw.log").open("w")
    proc = subprocess.Popen(
        [binary, "--access", access, "--secret", secret, "--port", f"127.0.0.1:{port}", "posix", str(root)],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        end = time.monotonic() + deadline_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"versitygw exited with {proc.returncode}: {(tmp / 'versitygw.log').read_text()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > end:
                raise TimeoutError(f"versitygw did not listen on 127.0.0.1:{port} within {deadline_s}s")
            time.sleep(0.1)  # poll again until the deadline
        yield S3Server(f"http://127.0.0.1:{port}", access, secret, root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
