"""The tooling around the local control plane: `ftjob-tool`, detached `up`/`down`, and what a failed start
leaves behind. Skipped against an external cluster (FTJOB_KUBECONFIG): they test this machine's tooling."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ftjob_cluster import bins
from ftjob_cluster.localcluster import ClusterError, Etcd, KubeApiserver, LocalCluster

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "cluster" / "bin" / "ftjob-tool"

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("FTJOB_KUBECONFIG")), reason="tests the local tooling, not the cluster under test"
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools" / "cluster")}
    return subprocess.run(
        [sys.executable, "-m", "ftjob_cluster", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_ftjob_tool_prints_pinned_client_binaries() -> None:
    proc = subprocess.run([str(TOOL), "kubectl", "helm"], capture_output=True, text=True, check=True)
    kubectl, helm = (Path(p) for p in proc.stdout.split())
    assert kubectl.is_absolute() and os.access(kubectl, os.X_OK)
    client = json.loads(
        subprocess.run(
            [kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert client["clientVersion"]["gitVersion"] == bins.KUBECTL_VERSION
    helm_version = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, check=True)
    assert helm_version.stdout.startswith(bins.HELM_VERSION)


def test_ftjob_tool_prints_built_components() -> None:
    names = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
    proc = subprocess.run([str(TOOL), *names], capture_output=True, text=True, check=True)
    paths = [Path(p) for p in proc.stdout.split()]
    assert [p.name for p in paths] == names
    out = subprocess.run([paths[1], "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"Kubernetes {bins.K8S_VERSION}"
    out = subprocess.run([paths[0], "--version"], capture_output=True, text=True, check=True).stdout
    assert f"etcd Version: {bins.ETCD_VERSION}" in out


def test_ftjob_tool_rejects_unknown_name() -> None:
    proc = subprocess.run([str(TOOL), "kubelet-not-here"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "invalid choice" in proc.stderr


def test_failed_start_keeps_logs_and_stops_what_started(tmp_path: Path) -> None:
    etcd = Etcd()
    cluster = LocalCluster(tmp_path / "c", components=[etcd, KubeApiserver(extra_args=["--no-such-flag"])])
    with pytest.raises(ClusterError) as err:
        cluster.start()
    log = tmp_path / "c" / "logs" / "kube-apiserver.log"
    assert str(log) in str(err.value)
    assert "unknown flag: --no-such-flag" in str(err.value)
    assert "unknown flag: --no-such-flag" in log.read_text()
    assert (tmp_path / "c" / "logs" / "kube-apiserver.cmdline").exists()
    # etcd had started; a failed start must not leak it.
    assert etcd.process is None
    assert not any(
        p.is_dir() and _alive(int(p.name)) and str(tmp_path) in (p / "cmdline").read_bytes().decode(errors="replace")
        for p in Path("/proc").iterdir()
        if p.name.isdigit()
    )


def test_detached_up_status_down(tmp_path: Path) -> None:
    d = tmp_path / "cluster"
    up = _cli("up", "--dir", str(d))
    assert up.returncode == 0, up.stderr
    assert f"export KUBECONFIG={d / 'admin.kubeconfig'}" in up.stdout
    seconds = float(re.search(r"up in ([0-9.]+) s", up.stdout).group(1))  # type: ignore[union-attr]
    # Warm cache: the binaries exist, so start-up is process start + apiserver bootstrap only.
    assert seconds < 30
    state = json.loads((d / "state.json").read_text())
    pids = [c["pid"] for c in state["components"]]
    try:
        assert _cli("up", "--dir", str(d)).returncode == 1  # a second `up` on the same dir refuses
        kubectl = bins.ensure_binary("kubectl")
        ns = subprocess.run(
            [kubectl, f"--kubeconfig={d / 'admin.kubeconfig'}", "get", "ns", "-o", "name"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "namespace/kube-system" in ns.stdout.split()
        status = _cli("status", "--dir", str(d))
        assert status.returncode == 0
        assert "kube-scheduler" in status.stdout
    finally:
        down = _cli("down", "--dir", str(d))
    assert down.returncode == 0
    assert "stopped kube-scheduler, kube-controller-manager, kube-apiserver, etcd" in down.stdout
    assert not any(_alive(pid) for pid in pids)
    assert _cli("status", "--dir", str(d)).returncode == 1
