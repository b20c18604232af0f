"""Failover of the elected operator: how long until a standby acts after the leader dies or is stopped, and what a
standby costs the API server.

    python benchmarks/leader_failover.py [--rounds 4] [--window 60] [--json OUT] [--keep]

Its own LocalCluster (etcd, kube-apiserver with an audit log of the two operators' users, controller-manager), the
CRD, and two `ftjob operator --leader-elect` processes with the chart's default timings (lease 15 s, renew
deadline 10 s, retry period 2 s), each as its own user (bench-a, bench-b; cluster-admin) and pod name, the Lease
in the jobs' namespace; a 2-rank job Running (its pods reported Running through the status subresource, as a
kubelet would).
1. **standby cost**: over `--window` seconds, every request of the standby and the leader's Lease requests, from the
   audit log (the API server's own count).
2. **kill** rounds: SIGKILL of the leader (a crashed pod, a lost node). Measured from the signal: until the Lease
   names the standby (polled every 0.1 s), and until the new leader's first full reconcile pass (its /metrics). The
   killed process is started again under the same pod name, as its container would be, and stands by; the next
   round starts once it has read the Lease twice.
3. **handover** rounds: SIGTERM of the leader (a rolling update, a node drain): kopf stops, the lease is released,
   and the standby takes it at its next attempt.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import yaml
from benchio import scratch, write_json
from cluster_support import make_kubectl
from failover_support import Lease, audit_events, audit_policy, elected_operator
from kubernetes import client, config
from operator_support import Kubelet, RunningOperator, install_crd, job_yaml, two_rank_job

from finetune_operator import constants
from ftjob_cluster import bins
from ftjob_cluster.localcluster import Etcd, KubeApiserver, KubeControllerManager, LocalCluster, wait_for

USERS = ("bench-a", "bench-b")
NAMESPACE = "failover"
LEASE = "finetune-operator"
DEFAULT_TIMING = {
    "lease-duration": f"{constants.LEASE_DURATION_S:g}s",
    "renew-deadline": f"{constants.RENEW_DEADLINE_S:g}s",
    "retry-period": f"{constants.RETRY_PERIOD_S:g}s",
}


def summary(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
    }


class Operators:
    """The two operator processes; one is restarted under the same identity after it was stopped."""

    def __init__(self, stack: contextlib.ExitStack, work: Path, kubeconfigs: dict[str, Path]) -> None:
        self.stack, self.work, self.kubeconfigs = stack, work, kubeconfigs
        self.running: dict[str, RunningOperator] = {}
        self.starts = 0

    def start(self, who: str) -> RunningOperator:
        self.starts += 1
        log = self.work / f"{who}-{self.starts}.log"
        op = self.stack.enter_context(
            elected_operator(
                self.kubeconfigs[who],
                wait_for,
                log,
                identity=who,
                namespace=NAMESPACE,
                lease=LEASE,
                timing=DEFAULT_TIMING,
            )
        )
        self.running[who] = op
        return op


def lease_gets(log: Path, who: str, since: float) -> int:
    return sum(1 for r in audit_events(log, who) if r.at >= since and r.resource == "leases" and r.verb == "get")


def run(rounds: int, window: float, work: Path) -> dict[str, Any]:
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(audit_policy(*USERS)))
    audit = work / "audit.log"
    apiserver = KubeApiserver(
        [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]
    )
    with (
        LocalCluster(work / "cluster", [Etcd(), apiserver, KubeControllerManager()], ready_timeout=300) as cluster,
        contextlib.ExitStack() as stack,
    ):
        kubectl = make_kubectl(bins.ensure_binary("kubectl"), cluster.kubeconfig)
        install_crd(kubectl, wait_for)
        assert cluster.ctx is not None
        kubeconfigs = {u: cluster.ctx.write_kubeconfig(u, u) for u in USERS}
        for u in USERS:
            kubectl("create", "clusterrolebinding", f"bench-{u}", "--clusterrole=cluster-admin", f"--user={u}")
        kubectl("create", "namespace", NAMESPACE)
        api = config.new_client_from_config(str(cluster.kubeconfig))
        stack.callback(api.close)
        wait_for(lambda: client.CoreV1Api(api).read_namespaced_service_account("default", NAMESPACE), timeout=60)
        kubelet = Kubelet(api, NAMESPACE)
        stack.callback(kubelet.stop)
        lease = Lease(api, NAMESPACE, LEASE)
        ops = Operators(stack, work, kubeconfigs)

        leader, standby = USERS
        ops.start(leader)
        lease.wait_for_holder(leader, wait_for, timeout=60)
        ops.start(standby)
        kubectl("apply", "-n", NAMESPACE, "-f", "-", input=job_yaml(two_rank_job("steady")))
        wait_for(lambda: len(kubelet.live_pods("steady")) == 2, timeout=60, message="2 pods")
        for pod in kubelet.live_pods("steady"):
            kubelet.set_status(pod.metadata.name, "Running")
        pods_before = {p.metadata.uid for p in kubelet.live_pods("steady")}

        # 1. What standing by costs.
        start = time.time()
        time.sleep(window)  # a measurement window, not a wait for a condition
        end = time.time()
        standby_reqs = [r for r in audit_events(audit, standby) if start <= r.at < end]
        leader_lease = [r for r in audit_events(audit, leader) if start <= r.at < end and r.resource == "leases"]
        cost = {
            "windowSeconds": round(end - start, 1),
            "standbyRequests": len(standby_reqs),
            "standbyKinds": sorted({f"{r.verb} {r.resource}" for r in standby_reqs}),
            "standbyPerSecond": round(len(standby_reqs) / (end - start), 3),
            "leaderLeaseRequests": len(leader_lease),
            "leaderLeasePerSecond": round(len(leader_lease) / (end - start), 3),
        }
        print(f"standby: {cost}", flush=True)

        # 2. SIGKILL rounds.
        kills = []
        for i in range(rounds):
            op_leader, op_standby = ops.running[leader], ops.running[standby]
            t0 = time.monotonic()
            op_leader.process.send_signal(signal.SIGKILL)
            lease.wait_for_holder(standby, wait_for, timeout=120)
            held = time.monotonic() - t0
            wait_for(lambda s=op_standby: s.reconciles() >= 1, timeout=120, interval=0.1, message="first pass")
            acting = time.monotonic() - t0
            kills.append({"lease": round(held, 2), "firstPass": round(acting, 2)})
            print(f"kill {i + 1}: lease {held:.1f} s, first pass {acting:.1f} s", flush=True)
            op_leader.process.wait(timeout=30)
            leader, standby = standby, leader
            restarted = time.time()
            ops.start(standby)  # the killed pod's container, restarted
            wait_for(lambda s=standby, t=restarted: lease_gets(audit, s, t) >= 2, timeout=60, message="standing by")

        # 3. SIGTERM rounds: the leader releases on its way out.
        handovers = []
        for i in range(rounds):
            op_leader, op_standby = ops.running[leader], ops.running[standby]
            t0 = time.monotonic()
            op_leader.process.send_signal(signal.SIGTERM)
            lease.wait_for_holder(standby, wait_for, timeout=120)
            held = time.monotonic() - t0
            wait_for(lambda s=op_standby: s.reconciles() >= 1, timeout=120, interval=0.1, message="first pass")
            acting = time.monotonic() - t0
            rc = op_leader.process.wait(timeout=60)
            handovers.append({"lease": round(held, 2), "firstPass": round(acting, 2), "exit": rc})
            print(f"handover {i + 1}: lease {held:.1f} s, first pass {acting:.1f} s (exit {rc})", flush=True)
            leader, standby = standby, leader
            restarted = time.time()
            ops.start(standby)
            wait_for(lambda s=standby, t=restarted: lease_gets(audit, s, t) >= 2, timeout=60, message="standing by")

        pods_after = {p.metadata.uid for p in kubelet.live_pods("steady")}
    return {
        "timing": DEFAULT_TIMING,
        "standbyCost": cost,
        "kill": {
            "rounds": kills,
            "lease": summary([k["lease"] for k in kills]),
            "firstPass": summary([k["firstPass"] for k in kills]),
        },
        "handover": {
            "rounds": handovers,
            "lease": summary([h["lease"] for h in handovers]),
            "firstPass": summary([h["firstPass"] for h in handovers]),
        },
        "podsUnchanged": pods_after == pods_before,  # no leader recreated the running job's pods
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4, help="kill rounds, then as many SIGTERM handovers")
    ap.add_argument("--window", type=float, default=60.0, help="seconds over which the standby's requests are counted")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the cluster's folder (logs, audit log)")
    args = ap.parse_args()
    with scratch("ftjob-bench-failover-", args.keep) as work:
        doc = run(args.rounds, args.window, work)
    print(yaml.safe_dump(doc, sort_keys=False))
    write_json(args.json, doc)


if __name__ == "__main__":
    main()
