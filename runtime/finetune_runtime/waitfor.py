"""`wait-for`: init-container probes with a deadline (DNS names resolve, TCP ports open, SSH banners answer)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    kind: str  # "dns", "tcp" or "ssh"
    host: str
    port: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.host}" + (f":{self.port}" if self.port else "")


def split_host_port(value: str, default_port: int) -> tuple[str, int]:
    if value.count(":") == 1:
        h, p = value.split(":")
        return h, int(p)
    return value, default_port


def check(probe: Probe, timeout: float = 3.0) -> str | None:
    """None when the probe passes, else a short reason."""
    try:
        if probe.kind == "dns":
            socket.getaddrinfo(probe.host, None)
            return None
        assert probe.port is not None
        with socket.create_connection((probe.host, probe.port), timeout=timeout) as s:
            if probe.kind == "ssh":
                s.settimeout(timeout)
                banner = s.recv(64)
                if not banner.startswith(b"SSH-"):
                    return f"port {probe.port} answered but not with an SSH banner ({banner[:20]!r})"
        return None
    except socket.gaierror as e:
        return f"does not resolve ({e.strerror})"
    except OSError as e:
        return f"not reachable ({e.strerror or e})"


def wait_for(
    probes: list[Probe],
    timeout_s: float,
    interval_s: float = 1.0,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Poll until every probe passes or the deadline expires; report what is still missing either way."""
    deadline = clock() + timeout_s
    pending = list(probes)
    last: dict[Probe, str] = {}
    while True:
        still = []
        for p in pending:
            reason = check(p, timeout=min(3.0, max(0.2, deadline - clock())))
            if reason is None:
                log(f"wait-for: {p} ready")
            else:
                last[p] = reason
                still.append(p)
        pending = still
        if not pending:
            return True
        if clock() >= deadline:
            for p in pending:
                log(f"wait-for: TIMEOUT after {timeout_s:.0f}s: {p} {last[p]}")
            return False
        time.sleep(min(interval_s, max(0.0, deadline - clock())))
