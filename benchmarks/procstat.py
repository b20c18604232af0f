"""CPU time and memory of an operator process from /proc (Linux): what `ps` would show, without psutil.

The operator under test is one process (ours: `ftjob operator`; the peer: training-operator, exec'd in place
by its mount-namespace wrapper), but children are summed too, so a helper process could not hide its cost."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Usage:
    cpu_seconds: float  # user + system, the process and its living descendants
    rss_bytes: int  # resident now (VmRSS), summed the same way
    peak_rss_bytes: int  # the process's own high-water mark since it started (VmHWM)


def parse_stat(text: str) -> tuple[int, float]:
    """(ppid, user + system CPU seconds) from /proc/PID/stat. The command name (field 2) may hold spaces and
    parentheses, so fields are counted after its last ')'."""
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, utime and stime fields 14 and 15.
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / _TICKS


def parse_status_kib(text: str, key: str) -> int:
    """A `Key:  N kB` line of /proc/PID/status, in bytes (0 when absent, as for a zombie)."""
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _tree(pid: int, proc: Path) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                ppid, _ = parse_stat((entry / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def usage(pid: int, proc: Path = Path("/proc")) -> Usage:
    cpu, rss, peak = 0.0, 0, 0
    for p in _tree(pid, proc):
        try:
            _, seconds = parse_stat((proc / str(p) / "stat").read_text())
            status = (proc / str(p) / "status").read_text()
        except OSError:
            continue  # it exited meanwhile
        cpu += seconds
        rss += parse_status_kib(status, "VmRSS")
        if p == pid:
            peak = parse_status_kib(status, "VmHWM")
    return Usage(cpu, rss, peak)
