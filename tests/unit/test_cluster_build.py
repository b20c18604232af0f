"""`python -m ftjob_cluster build`: which Go build groups it builds, and the one Go build cache they share.

The Go builds themselves are the binary targets' (every tier that needs a binary runs them for real); here
`bins.build_go_binaries` records its calls, so that the command's choices can be checked without minutes of go build.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ftjob_cluster import bins, netpolicy, node
from ftjob_cluster.__main__ import main


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, Path, bool]]:
    """(group, gocache, whether that cache existed then) of each build the command asked for."""
    monkeypatch.setenv("FTJOB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FTJOB_GO_CACHE", raising=False)
    monkeypatch.delenv("GOCACHE", raising=False)
    calls: list[tuple[str, Path, bool]] = []

    def build(force: bool = False, group: str = "control-plane", gocache: Path | None = None) -> Any:
        assert gocache is not None
        calls.append((group, gocache, gocache.is_dir()))

    monkeypatch.setattr(bins, "build_go_binaries", build)
    monkeypatch.setattr(bins, "fetch_client_binaries", lambda force=False: None)
    monkeypatch.setattr(bins, "ensure_binary", lambda name: bins.bin_dir() / name)
    monkeypatch.setattr(netpolicy, "network_policy_unavailable_reason", lambda: "no nftables queue here")
    return calls


def test_with_node_builds_the_node_groups_after_the_control_plane_in_its_go_cache(
    monkeypatch: pytest.MonkeyPatch, builds: list[tuple[str, Path, bool]]
) -> None:
    monkeypatch.setattr(node, "machine_reason", lambda: None)
    assert main(["build", "--with-node"]) == 0
    assert [g for g, _, _ in builds] == ["control-plane", "node", "coredns"]
    (cache,) = {c for _, c, _ in builds}
    assert all(existed for _, _, existed in builds)
    assert cache.parent == bins.bin_dir().parent and not cache.exists(), "the shared cache outlived the command"


def test_with_node_builds_only_the_control_plane_where_no_node_can_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], builds: list[tuple[str, Path, bool]]
) -> None:
    monkeypatch.setattr(node, "machine_reason", lambda: "the node needs root (network interfaces, mounts, cgroups)")
    assert main(["build", "--with-node"]) == 0
    assert [g for g, _, _ in builds] == ["control-plane"]
    assert "node binaries not built (no node can run here): the node needs root" in capsys.readouterr().out


def test_a_shared_cache_a_killed_build_left_is_removed_and_a_running_builds_is_not(
    builds: list[tuple[str, Path, bool]],
) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    parent = bins.bin_dir().parent
    left = parent / f".gocache-shared-{ended.pid}-x1"
    running = parent / f".gocache-shared-{os.getpid()}-x2"
    for d in (left, running):
        (d / "00").mkdir(parents=True)
    assert main(["build"]) == 0
    assert [g for g, _, _ in builds] == ["control-plane"]
    assert not left.exists() and running.exists()
