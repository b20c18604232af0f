"""The API server misbehaving under a running operator: restarted (every watch stream cut, connections refused
while it is down), connections cut at random, slow, and a second operator racing every write (409s on child
creates, status patches interleaved). Each time the job's whole life still completes: one counted group restart,
Succeeded, no duplicate or orphaned child."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faultlib import (
    LONG,
    DelayProxy,
    OperatorProcess,
    Record,
    lifecycle,
    record,
    rng,
    server_port,
    violations,
    wait_until,
)
from operator_support import Kubelet

from ftjob_cluster.localcluster import LocalCluster


@pytest.fixture
def kubelet(kube_api: Any, namespace: str) -> Iterator[Kubelet]:
    k = Kubelet(kube_api, namespace)
    yield k
    k.stop()


def _operator(kubeconfig: Path, log: Path) -> OperatorProcess:
    op = OperatorProcess(kubeconfig, log)
    wait_until(op.healthy, 60, "operator /healthz")
    return op


def _lifecycles(
    rec: Record,
    prefix: str,
    trials: int,
    kubectl: Any,
    kube_api: Any,
    kubelet: Kubelet,
    namespace: str,
    timeout: float,
    during: Callable[[], None] = lambda: None,
    check: Callable[[], None] = lambda: None,
) -> None:
    """`trials` whole job lives (faultlib.lifecycle) one after another, jobs `{prefix}-0`, `{prefix}-1`, ...; after
    each, no duplicate or orphaned child and `check()` holds. Each life counts in rec.trials; a failed assertion
    goes to rec.failures and stops the test."""
    for trial in range(trials):
        try:
            lifecycle(kubectl, kube_api, kubelet, namespace, f"{prefix}-{trial}", timeout=timeout, during=during)
            assert violations(kube_api, namespace) == []
            check()
        except AssertionError as e:
            rec.failures.append(str(e)[:500])
            raise
        finally:
            rec.trials += 1


def test_api_server_restarted_under_a_running_operator(
    crd: None,
    local_cluster: LocalCluster | None,
    kubectl: Any,
    kube_api: Any,
    kubeconfig: Path,
    namespace: str,
    kubelet: Kubelet,
    tmp_path: Path,
) -> None:
    if local_cluster is None:
        pytest.skip("restarts the session's own kube-apiserver (not possible with FTJOB_KUBECONFIG)")
    trials = 2 if LONG else 1
    rec = record(
        "test_api_server_restarted_under_a_running_operator",
        "kube-apiserver stopped (SIGTERM) and started again on the same port at each step of a job's "
        "life (long variant): after the create, with pods running, after a rank failure, before the "
        "end",
    )
    op = _operator(kubeconfig, tmp_path / "operator.log")
    downtimes: list[float] = []
    steps = [0]

    def restart() -> None:  # at every step of the long variant; after the rank failure only in the quick one
        steps[0] += 1
        if LONG or steps[0] == 3:
            downtimes.append(local_cluster.restart("kube-apiserver"))

    def operator_alive() -> None:
        assert op.process.poll() is None, "the operator exited"

    try:
        _lifecycles(
            rec,
            "restart",
            trials,
            kubectl,
            kube_api,
            kubelet,
            namespace,
            timeout=180,
            during=restart,
            check=operator_alive,
        )
        rec.notes.append(
            f"{len(downtimes)} restarts, API down {min(downtimes):.1f}-{max(downtimes):.1f} s each; "
            "the same operator process went on"
        )
    finally:
        op.stop()


def test_watch_streams_cut_at_random(
    crd: None, kubectl: Any, kube_api: Any, kubeconfig: Path, namespace: str, kubelet: Kubelet, tmp_path: Path
) -> None:
    trials = 3 if LONG else 1
    rec = record(
        "test_watch_streams_cut_at_random",
        "every connection between the operator and the API server (watches, requests) closed by a "
        "loopback proxy every 0.5-3 s at random, for a job's whole life",
    )
    r = rng(rec.scenario)
    proxy = DelayProxy(server_port(kubeconfig))
    op = _operator(proxy.kubeconfig(kubeconfig, tmp_path / "proxy.kubeconfig"), tmp_path / "operator.log")
    stop = threading.Event()
    cuts: list[int] = []

    def cutter() -> None:
        while not stop.wait(r.uniform(0.5, 3.0)):
            cuts.append(proxy.cut())

    t = threading.Thread(target=cutter, daemon=True)
    t.start()
    try:
        _lifecycles(rec, "cut", trials, kubectl, kube_api, kubelet, namespace, timeout=180)
        rec.notes.append(f"{len(cuts)} cuts, {sum(cuts)} connections closed")
    finally:
        stop.set()
        t.join(timeout=10)
        op.stop()
        proxy.close()


def test_slow_api(
    crd: None, kubectl: Any, kube_api: Any, kubeconfig: Path, namespace: str, kubelet: Kubelet, tmp_path: Path
) -> None:
    delay = 0.25
    trials = 2 if LONG else 1
    rec = record(
        "test_slow_api",
        f"{delay * 1000:.0f} ms added by a loopback proxy before every chunk the "
        "operator sends to the API server (each request takes at least that; a pass several times it)",
    )
    proxy = DelayProxy(server_port(kubeconfig), delay=delay)
    op = _operator(proxy.kubeconfig(kubeconfig, tmp_path / "proxy.kubeconfig"), tmp_path / "operator.log")
    try:
        _lifecycles(rec, "slow", trials, kubectl, kube_api, kubelet, namespace, timeout=180)
    finally:
        op.stop()
        proxy.close()


def test_two_operators_race_every_write(
    crd: None, kubectl: Any, kube_api: Any, kubeconfig: Path, namespace: str, kubelet: Kubelet, tmp_path: Path
) -> None:
    """A conflicting writer: a second operator process (a stuck old replica, a botched rollout) reconciles the
    same jobs. Every child create races (one of them meets a 409 and reads the object back), both patch the
    status, and a rank failure must still count as one restart."""
    trials = 3 if LONG else 1
    rec = record(
        "test_two_operators_race_every_write",
        "a second operator process on the same jobs: 409 AlreadyExists on child creates, interleaved status patches",
    )
    ops = [_operator(kubeconfig, tmp_path / f"operator-{i}.log") for i in range(2)]
    try:
        _lifecycles(rec, "race", trials, kubectl, kube_api, kubelet, namespace, timeout=120)
        logs = "".join((tmp_path / f"operator-{i}.log").read_text() for i in range(2))
        rec.notes.append("both processes reconciled" if all(o.reconciles() > 0 for o in ops) else "")
        assert "exists but is not controlled" not in logs, "a 409 on our own child was taken for a foreign one"
    finally:
        for o in ops:
            o.stop()
