"""What every benchmark script writes with --json (the result document, pretty-printed, folders made), and the
scratch folder a cluster benchmark works in."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def scratch(prefix: str, keep: bool) -> Iterator[Path]:
    """A fresh folder under the temp dir, removed when the run succeeds unless `keep`, kept (and named on stderr)
    when it fails: a cluster benchmark's etcd data and audit log are 100-500 MB a run, and leaving every run's
    behind filled a CI machine's disk."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    except BaseException:
        print(f"run failed: logs, etcd data and audit log kept in {work}", file=sys.stderr, flush=True)
        raise
    if keep:
        print(f"logs, etcd data and audit log kept in {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)


def write_json(path: Path | None, doc: Any) -> None:
    """Write `doc` to `path` (nothing when the script was given no --json)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
