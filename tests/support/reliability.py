"""What docs/reliability.md is written from, for the two tiers that write it: the fault tier (tests/faults, its
`faults` section) and the e2e tier (tests/e2e, its `e2e` section, the failure table measured on real nodes).

- `Verdict`: a record's outcome is pytest's own report of the test that made it (`observe`), never the test's
  word; `Ledger` binds each record to that test through the tier's conftest hooks.
- Sections: each tier rewrites only the part of the file between its own markers (`replace_section`), so one
  tier's run never touches the other's rows, and a file without the markers gets the section appended.
- `Disruption`: one row of the e2e failure table (a fault, when it was detected, when training ran again, the
  steps lost, the goal and whether it held), and `render_disruptions`, the section's text: only tests that
  passed have a row.
- Reading the times back: rank 0's progress lines with the kubelet's timestamps (`progress_log`, `LogFollower`),
  and the API's own times (status.failures[].time, a condition's lastTransitionTime) as `utc`.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from finetune_operator.progress import parse_line


# -- pytest's verdict on the test that made a record ------------------------------------------------------------
@dataclass(kw_only=True)
class Verdict:
    result: str | None = None  # pytest's outcome of that test: "passed", "failed" or "skipped"; None until reported
    reason: str = ""  # pytest's one-line message of a failure or a skip

    def observe(self, report: pytest.TestReport) -> None:
        """Take in pytest's report of one phase (setup, call, teardown) of the test that made this record: any
        failed phase fails it, a skip skips it, and it passed when its call passed and nothing else failed."""
        if report.failed:
            if self.result != "failed":
                self.result, self.reason = "failed", one_line(report)
        elif report.skipped:
            if self.result is None:
                self.result, self.reason = "skipped", one_line(report)
        elif report.when == "call" and self.result is None:
            self.result = "passed"

    @property
    def passed(self) -> bool:
        return self.result == "passed"


def one_line(report: pytest.TestReport) -> str:
    """pytest's message for a failed or skipped phase: the exception's first line, or the skip's reason."""
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, "Skipped: reason")
        text = str(report.longrepr[2]).removeprefix("Skipped: ")
    else:
        crash = getattr(report.longrepr, "reprcrash", None)
        text = crash.message if crash is not None else report.longreprtext
    return (text.strip().splitlines() or [report.outcome])[0][:300]


R = TypeVar("R", bound=Verdict)


class Ledger(Generic[R]):
    """One tier's records. The tier's conftest calls `begin` as each test's protocol starts and `observe` with
    each of its reports: a record takes its outcome from the reports of the test during which it was added."""

    def __init__(self) -> None:
        self.records: list[R] = []
        self._first = pytest.StashKey[int]()

    def add(self, record: R) -> R:
        self.records.append(record)
        return record

    def begin(self, item: pytest.Item) -> None:
        item.stash[self._first] = len(self.records)

    def observe(self, item: pytest.Item, report: pytest.TestReport) -> None:
        for r in self.records[item.stash.get(self._first, len(self.records)) :]:
            r.observe(report)


# -- sections of docs/reliability.md ----------------------------------------------------------------------------
def _markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"


def replace_section(doc: str, name: str, body: str) -> str:
    """`doc` with the text between section `name`'s markers replaced by `body` (everything else as it was), or
    with the section appended when `doc` has no such markers."""
    begin, end = _markers(name)
    block = f"{begin}\n{body.strip()}\n{end}"
    i = doc.find(begin)
    if i < 0:
        return (doc.rstrip() + "\n\n" if doc.strip() else "") + block + "\n"
    j = doc.find(end, i)
    if j < 0:
        raise ValueError(f"section {name!r} begins but never ends ({end} missing): fix the file by hand")
    return doc[:i] + block + doc[j + len(end) :]


def section(doc: str, name: str) -> str | None:
    """The text between section `name`'s markers, or None when `doc` has no such section."""
    begin, end = _markers(name)
    i, j = doc.find(begin), doc.find(end)
    return doc[i + len(begin) : j].strip() if 0 <= i < j else None


def write_section(path: Path, name: str, body: str) -> None:
    path.write_text(replace_section(path.read_text() if path.exists() else "", name, body))


# -- the e2e failure table ----------------------------------------------------------------------------------------
@dataclass
class Disruption(Verdict):
    """One row: a failure mode an e2e test injected, and what the test measured of it. Times are seconds from the
    fault; None where the mode has no such moment (a job that never trains again), with `*_note` saying why."""

    mode: str
    injection: str
    detected_s: float | None = None
    detected_note: str = ""  # what detection was, e.g. "NodeLost in status.failures"
    training_s: float | None = None
    training_note: str = ""
    steps_lost: int | None = None
    steps_note: str = ""  # e.g. "step 24 logged, resumed from checkpoint 16"
    goal: str = ""  # the goal for this mode, if it has one
    goal_held: bool | None = None
    goal_note: str = ""  # the measured value the goal was judged on


DISRUPTIONS: Ledger[Disruption] = Ledger()


def disruption(mode: str, injection: str) -> Disruption:
    """A row of the e2e failure table, owned by the test that calls this (its outcome is pytest's)."""
    return DISRUPTIONS.add(Disruption(mode, injection))


def _cell(value: str, note: str) -> str:
    return f"{value} ({note})" if note else value


def render_disruptions(records: Sequence[Disruption], written: datetime | None = None) -> str:
    """The e2e section: a row for each record whose test passed, in the order the tests ran."""
    when = (written or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Failures on real nodes: the failure table, measured (e2e tier)",
        "",
        "<!-- Generated by tests/e2e (`make test-e2e E2E_RELIABILITY_OUT=docs/reliability.md` writes this section); "
        "do not edit. -->",
        "",
        f"Written {when} from one session of the e2e tier: two kubelet nodes on this machine (tests/e2e, "
        "docs/cluster.md), the operator installed by Helm, each fault injected as life does it (a container killed "
        "through containerd, a memory limit, a node's processes SIGKILLed, `kubectl drain`, a rank that blocks). "
        "Every time is measured from the fault by the test itself: the fault's wall-clock time, the "
        "status.failures entry's `time` (the operator's pass that recorded it), node B's Ready `lastTransitionTime`, "
        "the kubelet's timestamps of rank 0's progress lines (`kubectl logs --timestamps`); API times have whole "
        "seconds, so a time to one of them is whole seconds too (the fault's time cut to its second). "
        "Training again: the new attempt's "
        "first progress line past the step it resumed from. Steps lost: the newest step rank 0 had logged when the "
        "fault struck minus the step the new attempt resumed from. A row is written only for a test that passed, "
        "from a session in which every test passed or was skipped. Not here: the operator's own failures and API "
        "server restarts, which are the fault suite's (its section); on real nodes a deleted operator pod costs no "
        "restart (tests/e2e/test_failures.py: the same pods run on, restartCount 0).",
        "",
        "| Failure mode | Injection | Detected after | Training again after | Steps lost | Goal | Held |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if not r.passed:
            continue
        detected = "—" if r.detected_s is None else f"{r.detected_s:.0f} s"
        training = "—" if r.training_s is None else f"{r.training_s:.0f} s"
        steps = "—" if r.steps_lost is None else str(r.steps_lost)
        held = "—" if r.goal_held is None else ("yes" if r.goal_held else "NO")
        cells = [
            r.mode,
            r.injection,
            _cell(detected, r.detected_note),
            _cell(training, r.training_note),
            _cell(steps, r.steps_note),
            r.goal or "—",
            _cell(held, r.goal_note),
        ]
        lines.append("| " + " | ".join(x.replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    return "\n".join(lines) + "\n"


# -- times, read back ------------------------------------------------------------------------------------------------
def utc(text: str) -> datetime:
    """An API time ("2026-12-04T22:11:45Z") or a kubelet log timestamp (RFC 3339 with nanoseconds) as an aware
    datetime (microseconds: Python keeps no more)."""
    text = text.strip().replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:  # fractional seconds, then the offset: cut to 6 digits
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)].ljust(6, '0')}{rest[digits:]}"
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


def seconds(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()


def api_seconds(start: datetime, api_time: str) -> float:
    """Seconds from `start` to an API time (status.failures[].time, lastTransitionTime, finishedAt), which is
    whole seconds, cut: `start` is cut to its second too, so that both sides have the same resolution (1 s) and
    an API time in the same second as `start` reads 0, not less."""
    return seconds(start.replace(microsecond=0), utc(api_time))


def failure_note(f: dict[str, Any]) -> str:
    """How a status.failures entry reads in the table: its reason, and the rank and exit code where it has them."""
    who = f"rank {f['rank']} " if "rank" in f else ""
    code = f", exit code {f['exitCode']}" if "exitCode" in f else ""
    return f"{who}{f.get('reason')}{code} in status.failures"


Line = tuple[datetime, dict[str, Any]]


def progress_lines(log: str) -> list[Line]:
    """The progress records in a `kubectl logs --timestamps` text, each with the kubelet's timestamp."""
    out: list[Line] = []
    for raw in log.splitlines():
        stamp, _, line = raw.partition(" ")
        record = parse_line(line)
        if record is None:
            continue
        try:
            out.append((utc(stamp), record))
        except ValueError:  # not a timestamped line
            continue
    return out


def train_steps(lines: Sequence[Line]) -> list[tuple[datetime, int]]:
    return [(t, int(r["step"])) for t, r in lines if r.get("event") == "train" and isinstance(r.get("step"), int)]


def first_step_after(lines: Sequence[Line], step: int) -> tuple[datetime, int] | None:
    """The first training line past `step`: a resumed attempt training again."""
    return next(((t, s) for t, s in train_steps(lines) if s > step), None)


def last_step(lines: Sequence[Line]) -> int | None:
    steps = [s for _, s in train_steps(lines)]
    return max(steps) if steps else None


def progress_log(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], ns: str, pod: str, container: str
) -> list[Line]:
    """A pod's progress lines as its kubelet timestamped them, read now (the pod must still exist)."""
    out = kubectl("-n", ns, "logs", pod, "-c", container, "--timestamps", check=False).stdout
    return progress_lines(out)


class LogFollower:
    """`kubectl logs -f --timestamps` of one container, kept in memory until the container ends (or `stop`): the
    lines a pod printed before it was deleted, which no later `kubectl logs` can read."""

    def __init__(self, command: Sequence[str]) -> None:
        self._text: list[str] = []
        self._proc = subprocess.Popen(
            [*command, "-f", "--timestamps"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._text.append(line)

    def lines(self) -> list[Line]:
        return progress_lines("".join(self._text))

    def stop(self, wait_s: float = 0.0) -> list[Line]:
        """The lines read; waits up to `wait_s` for the container (and so the stream) to end first."""
        try:
            self._proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._thread.join(timeout=10)
        return self.lines()
