"""Two operator processes under leader election (`ftjob operator --leader-elect`) against a real control plane,
the leader failing as life makes it fail:
- SIGKILLed (a crashed pod, a lost node): the standby takes over, no child is created twice, the job Succeeds;
- SIGSTOPped past its lease (a hung process, a paused VM) while the new leader restarts the job's ranks, then
  SIGCONTed: it must not act on its stale view (it sees it lost the lease and exits): the split-brain case.

The control plane is this module's own, with an audit log of the two operators' users (op-a, op-b), so that what
each process sent is the API server's record, not the process's word: the standby must have sent nothing but
Lease reads while it stood by, and the woken leader no write at all.

The timings are short (tests/support/failover_support.py, TEST_TIMING) and waits are bounded generously; the measured
failover times are in docs/operator.md ("High availability"), from benchmarks/leader_failover.py."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Kubectl, make_kubectl
from failover_support import MUTATING, Lease, PodLedger, audit_events, audit_policy, elected_operator, signal_process
from kubernetes import client, config
from operator_support import Kubelet, install_crd, job_yaml, status, two_rank_job

from finetune_operator.leader import EXIT_LEASE_LOST
from ftjob_cluster import bins
from ftjob_cluster.localcluster import Etcd, KubeApiserver, KubeControllerManager, LocalCluster, wait_for

USERS = ("op-a", "op-b")
LEASE = "finetune-operator"
# A generous bound on a takeover (lease 6 s + jittered polling + a loaded machine): what is measured is in the docs.
TAKEOVER_TIMEOUT = 90


@dataclass
class Audited:
    kubectl: Kubectl
    api: client.ApiClient
    kubeconfigs: dict[str, Path]
    log: Path

    def namespace(self, stem: str) -> str:
        name = f"{stem}-{int(time.time() * 1000) % 10**8}"
        core = client.CoreV1Api(self.api)
        core.create_namespace({"metadata": {"name": name}})
        wait_for(lambda: core.read_namespaced_service_account("default", name), timeout=60, message="default SA")
        return name


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audited]:
    work = tmp_path_factory.mktemp("failover")
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(audit_policy(*USERS)))
    log = work / "audit.log"
    apiserver = KubeApiserver(
        [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]
    )
    with LocalCluster(work / "cluster", [Etcd(), apiserver, KubeControllerManager()], ready_timeout=300) as cluster:
        kubectl = make_kubectl(bins.ensure_binary("kubectl"), cluster.kubeconfig)
        install_crd(kubectl, wait_for)
        assert cluster.ctx is not None
        kubeconfigs = {}
        for user in USERS:
            kubeconfigs[user] = cluster.ctx.write_kubeconfig(user, user)
            kubectl("create", "clusterrolebinding", f"failover-{user}", "--clusterrole=cluster-admin", f"--user={user}")
        api = config.new_client_from_config(str(cluster.kubeconfig))
        try:
            yield Audited(kubectl, api, kubeconfigs, log)
        finally:
            api.close()


def phase(a: Audited, ns: str, name: str) -> str | None:
    return status(a.api, ns, name).get("phase")


def run_job_to_running(a: Audited, kubelet: Kubelet, ns: str, name: str) -> dict[str, str]:
    """Applies a 2-rank job and reports its pods Running; returns {pod name: uid}."""
    a.kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(two_rank_job(name)))
    wait_for(lambda: len(kubelet.live_pods(name)) == 2, timeout=60, message="2 pods")
    for pod in kubelet.live_pods(name):
        kubelet.set_status(pod.metadata.name, "Running")
    wait_for(lambda: phase(a, ns, name) == "Running", timeout=60, message="Running")
    return {p.metadata.name: p.metadata.uid for p in kubelet.live_pods(name)}


def finish(a: Audited, kubelet: Kubelet, ns: str, name: str) -> None:
    for pod in kubelet.live_pods(name):
        kubelet.set_status(pod.metadata.name, "Succeeded", exit_code=0, reason="Completed")
    wait_for(lambda: phase(a, ns, name) == "Succeeded", timeout=60, message=f"{name} Succeeded")


def standby_requests(a: Audited, user: str, acquired: float) -> list[Any]:
    """What `user` sent before it acquired the lease (`acquired`: the Lease's acquireTime, which it wrote from its
    own clock, on this host)."""
    return [r for r in audit_events(a.log, user) if r.at < acquired]


def test_sigkill_of_the_leader_hands_over_without_duplicating_a_child(audited: Audited, tmp_path: Path) -> None:
    a = audited
    ns = a.namespace("kill")
    lease = Lease(a.api, ns, LEASE)
    kubelet = Kubelet(a.api, ns)
    ledger = PodLedger(a.api, ns, "steady")
    common = {"namespace": ns, "lease": LEASE}
    try:
        with elected_operator(a.kubeconfigs["op-a"], wait_for, tmp_path / "a.log", identity="op-a", **common) as op_a:
            lease.wait_for_holder("op-a", wait_for, timeout=60)
            with elected_operator(
                a.kubeconfigs["op-b"], wait_for, tmp_path / "b.log", identity="op-b", **common
            ) as op_b:
                before = run_job_to_running(a, kubelet, ns, "steady")
                assert lease.holder() == "op-a"
                assert op_b.reconciles() == 0, "the standby made a pass"

                signal_process(op_a, signal.SIGKILL)
                op_a.process.wait(timeout=30)
                took = lease.wait_for_holder("op-b", wait_for, timeout=TAKEOVER_TIMEOUT)
                acquired = lease.read().spec.acquire_time.timestamp()
                wait_for(lambda: op_b.reconciles() >= 1, timeout=60, message="the new leader's first pass")
                print(f"takeover after SIGKILL: lease in {took:.1f} s")  # shown with -s; the docs have the numbers

                after = {p.metadata.name: p.metadata.uid for p in kubelet.live_pods("steady")}
                assert after == before, "the new leader recreated pods of a running job"
                assert phase(a, ns, "steady") == "Running"
                finish(a, kubelet, ns, "steady")
                assert status(a.api, ns, "steady").get("restartCount", 0) == 0
        # The standby watched nothing and wrote nothing: every request before it led was a read of the Lease.
        waiting = standby_requests(a, "op-b", acquired)
        assert waiting, "the standby never read the Lease"
        assert {(r.verb, r.resource) for r in waiting} == {("get", "leases")}, waiting
    finally:
        ledger.stop()
        kubelet.stop()
    assert not ledger.violations, ledger.violations
    assert ledger.attempts() == {"0"} and ledger.pods_seen() == 2, ledger.seen


def test_a_hung_leader_woken_after_a_takeover_exits_without_acting(audited: Audited, tmp_path: Path) -> None:
    """SIGSTOP past the lease: the standby takes over and restarts the job's ranks after a rank failure; the old
    leader, SIGCONTed with its stale view of attempt 0, must send no write at all and exit (EXIT_LEASE_LOST)."""
    a = audited
    ns = a.namespace("hang")
    lease = Lease(a.api, ns, LEASE)
    kubelet = Kubelet(a.api, ns)
    ledger = PodLedger(a.api, ns, "hung")
    common = {"namespace": ns, "lease": LEASE}
    try:
        with elected_operator(a.kubeconfigs["op-a"], wait_for, tmp_path / "a.log", identity="op-a", **common) as op_a:
            lease.wait_for_holder("op-a", wait_for, timeout=60)
            with elected_operator(
                a.kubeconfigs["op-b"], wait_for, tmp_path / "b.log", identity="op-b", **common
            ) as op_b:
                run_job_to_running(a, kubelet, ns, "hung")

                stopped = signal_process(op_a, signal.SIGSTOP)
                took = lease.wait_for_holder("op-b", wait_for, timeout=TAKEOVER_TIMEOUT)
                print(f"takeover after SIGSTOP: lease in {took:.1f} s")
                wait_for(lambda: op_b.reconciles() >= 1, timeout=60, message="the new leader's first pass")
                # The new leader acts while the old one is frozen: a rank fails, the group restarts (attempt 1).
                kubelet.set_status("hung-rank-1", "Failed", exit_code=1, message="boom")
                wait_for(
                    lambda: (
                        status(a.api, ns, "hung").get("restartCount") == 1
                        and {p.metadata.labels["finetune.dev/attempt"] for p in kubelet.live_pods("hung")} == {"1"}
                        and len(kubelet.live_pods("hung")) == 2
                    ),
                    timeout=60,
                    message="the group restarted by the new leader",
                )
                for pod in kubelet.live_pods("hung"):
                    kubelet.set_status(pod.metadata.name, "Running")
                wait_for(lambda: phase(a, ns, "hung") == "Running", timeout=60, message="attempt 1 Running")

                woken = signal_process(op_a, signal.SIGCONT)
                rc = op_a.process.wait(timeout=60)
                log = (tmp_path / "a.log").read_text()
                assert rc == EXIT_LEASE_LOST, log[-3000:]
                assert "lost the lease" in log
                # The API server's record: after waking, op-a decided no write at all, not even a renewal. Only a
                # renewal it had begun before it was stopped (its renewTime says when) may arrive late, and the
                # API server refuses that stale update by its resourceVersion.
                late = [r for r in audit_events(a.log, "op-a") if r.at >= woken and r.verb in MUTATING]
                begun_before = [
                    r
                    for r in late
                    if r.resource == "leases" and r.renew_time is not None and r.renew_time < stopped and r.code == 409
                ]
                assert late == begun_before and len(late) <= 1, late
                assert lease.holder() == "op-b"

                finish(a, kubelet, ns, "hung")
                assert status(a.api, ns, "hung")["restartCount"] == 1
                assert op_b.process.poll() is None, "the new leader exited"
    finally:
        ledger.stop()
        kubelet.stop()
    assert not ledger.violations, ledger.violations
    assert ledger.attempts() == {"0", "1"} and ledger.pods_seen() == 4, ledger.seen
