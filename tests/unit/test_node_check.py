"""`python -m ftjob_cluster node-check` and the e2e tier: a machine that cannot run nodes skips the tier (exit 1),
one where another node runs now fails it (exit 2: its tests did not run), one that can run them runs it (0)."""

from __future__ import annotations

import pytest

from ftjob_cluster import node
from ftjob_cluster.__main__ import main

BUSY = "a node already runs on this machine (interface ftjob0 exists; make cluster-down stops it)"


@pytest.mark.parametrize(
    ("lacks", "busy", "code"),
    [(None, None, 0), ("the node needs root (network interfaces, mounts, cgroups)", None, 1), (None, BUSY, 2)],
)
def test_node_check_tells_a_machine_that_cannot_from_one_that_is_busy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], lacks: str | None, busy: str | None, code: int
) -> None:
    monkeypatch.setattr(node, "busy_reason", lambda: busy)
    monkeypatch.setattr(node, "unavailable_reason", lambda: lacks or node.busy_reason())
    assert main(["node-check"]) == code
    out = capsys.readouterr().out
    assert (lacks or busy or "this machine can run a node") in out
