"""Failover of the operator as Helm runs it (docs/operator.md, "High availability"): the session's release upgraded
to `replicaCount: 2`, so that two operator pods run under the chart's leader election (a coordination.k8s.io Lease
named like the release, the chart's default timings), while a job trains on the two nodes. The leader's pod (the
Lease's holderIdentity) is deleted twice, as life deletes one:
- `kubectl delete pod` (what a drain, an eviction or a rolling update does: SIGTERM, and the leader releases the
  Lease as it stops);
- then, once the Deployment's replacement pod stands by, the new leader with `--grace-period=0 --force` (the API
  object gone at once; the kubelet still stops the container with SIGTERM, but with its minimum grace period, 2 s:
  the leader releases the Lease only if kopf has stopped by then, as it did in most runs; otherwise it is killed
  holding the Lease, which then expires, and the takeover takes up to leaseDuration + a retry, 17 s once). A
  leader that dies holding the Lease at any moment (SIGKILL, SIGSTOP) is the control-plane tier's
  (tests/controlplane/test_failover.py): here the kubelet would restart its container under the same pod name,
  which takes its own Lease back at once.
Each time another replica must hold the Lease within a bound and make its first pass (its own /metrics, read from
its pod IP): the standby, or the Deployment's replacement for the deleted pod where that one starts first (a
released Lease goes to whichever replica reads it next, as with client-go; a replacement whose image is on its node
makes its first read a second or two after the deletion, the standby every 2-4.4 s). The replica that did not take
over must still stand by (finetune_operator_leader 0): two leaders never act at once. Throughout, the job's children
(its pods, Service and ConfigMap, controlled by its uid) stay the same objects, a real watch never sees two pods of
one rank and attempt, and the API server answers no create of a pod, Service or ConfigMap with a 409 (a new leader
that sent a create for a child that existed); the job Succeeds with no restart (backoffLimit 0). Each deletion adds
a row to the failure table (docs/reliability.md, e2e section). The release goes back to one replica afterwards,
whatever happened."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import reliability
from cluster_support import Kubectl
from conftest import OPERATOR_NS, RELEASE_NAME, NodeCluster, Release, upgrade_operator
from failover_support import Lease, PodLedger
from kubernetes import config

from finetune_operator import constants as c
from finetune_operator.progress import parse_line
from ftjob_cluster.localcluster import wait_for

JOBS = Path(__file__).resolve().parent / "jobs"
JOB = "ja-long"
JOB_TIMEOUT = 1200.0
# The chart's names and defaults (charts/finetune-operator/values.yaml): the Lease is named like the release's full
# name; the metrics port; leaderElection's timings, which the test leaves as a user gets them.
LEASE = f"{RELEASE_NAME}-finetune-operator"
METRICS_PORT = 8080
LEASE_DURATION_S, RETRY_PERIOD_S = 15, 2
# docs/operator.md's bound on a takeover after a leader dies without releasing the Lease: its last renewal up to a
# retry period before, the lease duration, then two jittered standby reads (each up to 2.2 retry periods).
TAKEOVER_BOUND_S = LEASE_DURATION_S + 4.4 * RETRY_PERIOD_S
# What the test waits for before it fails: the bound and a loaded machine's slack (the measured time is recorded).
TAKEOVER_TIMEOUT = 120.0
SELECTOR = "app.kubernetes.io/name=finetune-operator,app.kubernetes.io/instance=" + RELEASE_NAME
CHILD_KINDS = "pods,services,configmaps"
# apiserver_request_total's samples for a create refused because the object exists.
_CONFLICT = re.compile(r"^apiserver_request_total\{([^}]*)\} (\S+)$")


def _operator_pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    """The release's operator pods that are not being deleted."""
    pods = json.loads(kubectl("-n", OPERATOR_NS, "get", "pods", "-l", SELECTOR, "-o", "json").stdout)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and bool(pod["status"].get("podIP"))


def _metrics(pod_ip: str) -> dict[str, float]:
    """The operator pod's own unlabelled samples (finetune_operator_leader, _reconciles_total), from its pod IP."""
    with urllib.request.urlopen(f"http://{pod_ip}:{METRICS_PORT}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("finetune_operator_") and "{" not in name and value:
            out[name] = float(value)
    return out


def _two_standing(kubectl: Kubectl, lease: Lease) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(leader, standby) once two operator pods are Ready, one of them holds the Lease and the other reports
    itself standing by (finetune_operator_leader 0) without a pass made."""
    pods = _operator_pods(kubectl)
    if len(pods) != 2 or not all(_ready(p) for p in pods):
        return None
    by_name = {p["metadata"]["name"]: p for p in pods}
    holder = lease.holder()
    if holder not in by_name:
        return None
    (standby,) = [p for n, p in by_name.items() if n != holder]
    try:
        m = _metrics(standby["status"]["podIP"])
    except OSError:
        return None
    if m.get("finetune_operator_leader") != 0:
        return None
    return by_name[holder], standby


def _operators_said(kubectl: Kubectl, lease: Lease) -> str:
    """For a failure message: who holds the Lease, each operator pod and the end of its log (the pods and their
    logs are gone once the session's cluster stops)."""
    out = [f"Lease holder: {lease.holder()}"]
    for pod in _operator_pods(kubectl):
        name = pod["metadata"]["name"]
        log = kubectl("-n", OPERATOR_NS, "logs", name, "--tail=30", check=False)
        out.append(f"--- {name} on {pod['spec'].get('nodeName')}, ready {_ready(pod)}:\n{log.stdout}{log.stderr}")
    return "\n".join(out)


def _children(kubectl: Kubectl, ns: str, uid: str) -> set[tuple[str, str, str]]:
    """(kind, name, uid) of every pod, Service and ConfigMap in `ns` whose controller is the object `uid`."""
    items = json.loads(kubectl("-n", ns, "get", CHILD_KINDS, "-o", "json").stdout)["items"]
    return {
        (o["kind"], o["metadata"]["name"], o["metadata"]["uid"])
        for o in items
        if any(r.get("controller") and r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
    }


def _creates(kubectl: Kubectl) -> dict[str, float]:
    """The API server's count of creates of pods, Services and ConfigMaps by response code (its /metrics)."""
    out: dict[str, float] = {}
    for line in kubectl("get", "--raw", "/metrics").stdout.splitlines():
        m = _CONFLICT.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("verb") in ("POST", "CREATE") and labels.get("resource") in ("pods", "services", "configmaps"):
            code = labels.get("code", "?")
            out[code] = out.get(code, 0.0) + float(m.group(2))
    return out


def _job(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("-n", ns, "get", "ftj", JOB, "-o", "json").stdout))


def _last_logged_step(kubectl: Kubectl, ns: str) -> int:
    """The newest training step rank 0 has printed, read from its container log now."""
    out = kubectl("-n", ns, "logs", f"{JOB}-rank-0", "-c", c.CONTAINER_TRAINER, "--tail=200", check=False).stdout
    steps = [p.get("step", 0) for line in out.splitlines() if (p := parse_line(line)) and p.get("event") == "train"]
    return max(steps, default=0)


@pytest.fixture
def two_replicas(node_cluster: NodeCluster, release: Release, kubectl: Kubectl, operator: str) -> Iterator[Lease]:
    """The release at replicaCount 2 until the test ends, then at 1 again (the chart's other values kept)."""
    api = config.new_client_from_config(str(node_cluster.kubeconfig))
    lease = Lease(api, OPERATOR_NS, LEASE)
    try:
        upgrade_operator(node_cluster, release, "replicaCount=2")
        wait_for(lambda: _two_standing(kubectl, lease), timeout=300, interval=1.0, message="a leader and a standby")
        yield lease
    finally:
        upgrade_operator(node_cluster, release, "replicaCount=1")
        wait_for(
            lambda: (
                len(_operator_pods(kubectl)) == 1 and lease.holder() == _operator_pods(kubectl)[0]["metadata"]["name"]
            ),
            timeout=300,
            interval=1.0,
            message="one operator pod again, holding the Lease",
        )
        api.close()


def test_leader_pod_deleted_twice_mid_training_another_replica_takes_over_and_the_job_succeeds(
    kubectl: Kubectl, node_cluster: NodeCluster, job_namespace: tuple[str, Path], two_replicas: Lease
) -> None:
    ns, _ = job_namespace
    lease = two_replicas
    api = config.new_client_from_config(str(node_cluster.kubeconfig))
    ledger = PodLedger(api, ns, JOB)
    try:
        kubectl("-n", ns, "apply", "-f", str(JOBS / f"{JOB}.yaml"))
        wait_for(lambda: _last_logged_step(kubectl, ns) >= 2, timeout=JOB_TIMEOUT, interval=2.0, message="step 2")
        uid = _job(kubectl, ns)["metadata"]["uid"]
        children = _children(kubectl, ns, uid)
        assert sorted(k for k, _, _ in children) == ["ConfigMap", "Pod", "Pod", "Service"], children
        creates_before = _creates(kubectl)
        assert creates_before.get("201", 0) > 0, creates_before  # the counter is read (pods were created)

        # Each row is declared by a literal `disruption("…")` call: tests/unit/test_reliability.py reads the
        # modes the e2e tests record that way, to find a committed row no test measures any more.
        for row, flags in [
            (
                reliability.disruption(
                    "operator leader pod deleted (2 replicas)",
                    "`kubectl delete pod` of the operator pod holding the Lease mid-training (SIGTERM: it releases the "
                    "Lease as it stops); chart defaults: lease 15 s, renew deadline 10 s, retry 2 s",
                ),
                ["--wait=false"],
            ),
            (
                reliability.disruption(
                    "operator leader pod force-deleted (2 replicas)",
                    "`kubectl delete pod --grace-period=0 --force` of the new leader once the replacement stood by: "
                    "the pod object gone at once, the kubelet stopping its container with SIGTERM and its minimum "
                    "grace, 2 s (the leader releases the Lease if kopf has stopped by then; if not, the Lease "
                    "expires)",
                ),
                ["--grace-period=0", "--force", "--wait=false"],
            ),
        ]:
            leader, standby = wait_for(
                lambda: _two_standing(kubectl, lease), timeout=300, interval=1.0, message="a leader and a standby"
            )
            leader_name, standby_name = leader["metadata"]["name"], standby["metadata"]["name"]
            assert _metrics(standby["status"]["podIP"]).get("finetune_operator_reconciles_total") == 0, (
                "the standby made a pass"
            )
            step = _last_logged_step(kubectl, ns)
            assert _job(kubectl, ns)["status"]["phase"] == "Running", "the job ended before the deletion"
            deleted_at = time.monotonic()
            kubectl("-n", OPERATOR_NS, "delete", "pod", leader_name, *flags)
            try:
                new_leader = wait_for(
                    lambda old=leader_name: (h := lease.holder()) not in (None, old) and h,
                    timeout=TAKEOVER_TIMEOUT,
                    interval=0.1,
                    message=f"another replica than {leader_name} holds the lease",
                )
            except TimeoutError as e:
                raise TimeoutError(f"{e}\n{_operators_said(kubectl, lease)}") from e
            took = time.monotonic() - deleted_at
            new_ip = wait_for(
                lambda h=new_leader: next(
                    (p["status"].get("podIP") for p in _operator_pods(kubectl) if p["metadata"]["name"] == h), None
                ),
                timeout=60,
                interval=0.5,
                message=f"{new_leader}'s pod IP",
            )
            wait_for(
                lambda ip=new_ip: _metrics(ip).get("finetune_operator_reconciles_total", 0) >= 1,
                timeout=120,
                interval=0.2,
                message="the new leader's first pass",
            )
            first_pass = time.monotonic() - deleted_at
            assert _metrics(new_ip)["finetune_operator_leader"] == 1
            who = "the standby" if new_leader == standby_name else "the Deployment's replacement pod"
            if new_leader != standby_name:  # it must have seen the new holder and kept standing by
                assert _metrics(standby["status"]["podIP"])["finetune_operator_leader"] == 0, "two leaders"
            st = _job(kubectl, ns)["status"]
            assert st["phase"] == "Running" and st.get("restartCount", 0) == 0, st
            assert _children(kubectl, ns, uid) == children, "the new leader replaced a child of the running job"
            print(
                f"[ftjob-e2e] {row.mode}: {who} held the Lease {took:.1f} s after the deletion, its first pass "
                f"after {first_pass:.1f} s (training at step {step})",
                flush=True,
            )
            row.detected_s = took
            row.detected_note = f"{who} held the Lease; its first pass of the job {first_pass:.1f} s after the deletion"
            row.training_note = "never stopped: the same pods ran on, restartCount 0"
            row.steps_lost = 0
            row.steps_note = f"at step {step} when deleted"
            row.goal = (
                f"another replica leads within leaseDuration + 4.4 × retryPeriod ({TAKEOVER_BOUND_S:.1f} s) of the "
                "deletion"
            )
            row.goal_held = took <= TAKEOVER_BOUND_S
            row.goal_note = f"{took:.1f} s"

        end = wait_for(
            lambda: (j := _job(kubectl, ns))["status"].get("phase") in ("Succeeded", "Failed") and j,
            timeout=JOB_TIMEOUT,
            interval=2.0,
            message=f"{JOB} to finish",
        )
        st = end["status"]
        assert st["phase"] == "Succeeded" and st.get("restartCount", 0) == 0, st
        assert _children(kubectl, ns, uid) == children
        creates_after = _creates(kubectl)
        assert creates_after.get("409", 0) == creates_before.get("409", 0), (creates_before, creates_after)
    finally:
        ledger.stop()
        api.close()
    assert not ledger.violations, ledger.violations
    assert ledger.attempts() == {"0"} and ledger.pods_seen() == 2, ledger.seen
