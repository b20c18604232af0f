"""Run a launcher (torchrun, mpirun) as a child for a precompile trial and hand its report to Kubernetes.

The trial's rank 0 prints one `precompile` progress record with `complete` and a `cache` report
(compilecache.py). Under mpirun that line arrives on the launcher pod's stdout, not on rank 0's pod, so the
process that sees every rank's output relays it: the record goes to the container's termination message file,
which the kubelet copies into the pod's status (`state.terminated.message` of the init container). The
operator reads it from there for status.compileCache: a field of the pod, kept while the pod exists, where a
log line could be missed between two reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from finetune_runtime.progress import parse_line

# The kubelet's default terminationMessagePath; its contents are capped at 4096 bytes.
TERMINATION_LOG = "/dev/termination-log"
_LIMIT = 4096


def trial_report(line: str) -> dict[str, Any] | None:
    """The final record of a precompile trial, from one output line (None for any other line)."""
    try:
        rec = parse_line(line)
    except ValueError:
        return None
    if rec and rec.get("event") == "precompile" and rec.get("complete"):
        return rec
    return None


def write_termination_message(report: dict[str, Any], path: Path) -> bool:
    """`{"compileCache": {...}}` into the termination message file; False where there is none. The kubelet
    mounts that file into every container; elsewhere (`ftjob run`, docker) it does not exist and nothing is
    created (as root, a new /dev/termination-log on a host would be litter)."""
    doc = {"compileCache": {**(report.get("cache") or {}), "steps": report.get("step"), "time": report.get("time")}}
    text = json.dumps(
        {"compileCache": {k: v for k, v in doc["compileCache"].items() if v is not None}}, separators=(",", ":")
    )
    if len(text) > _LIMIT or not path.is_file():
        return False
    try:
        path.write_text(text, encoding="utf-8")
    except OSError:  # not writable: no message, and the trial still counts
        return False
    return True


def run_relaying(argv: list[str], extra_env: dict[str, str] | None = None, termination_log: Path | None = None) -> int:
    """Run argv with its output passed through line by line; relay the trial's report; return its exit code.
    SIGTERM/SIGINT (the kubelet stopping the pod) are forwarded to the child."""
    env = {**os.environ, **(extra_env or {})}
    target = termination_log or Path(os.environ.get("FTJOB_TERMINATION_LOG") or TERMINATION_LOG)
    sys.stdout.flush()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    report = None
    assert proc.stdout is not None
    out = sys.stdout.buffer
    for raw in proc.stdout:
        out.write(raw)
        out.flush()
        found = trial_report(raw.decode("utf-8", "replace"))
        report = found or report
    rc = proc.wait()
    if rc == 0 and report is not None:
        write_termination_message(report, target)
    return rc
