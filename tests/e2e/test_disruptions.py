"""Interruptions besides a rank's own failure, as life brings them on the real nodes: node B dies mid-training
(`kill_node`: no drain, the API objects as they were) and the group restarts on node A once the node has been
not Ready for runPolicy.nodeLossSeconds; rank 0 blocks for ever after a few steps and the job is restarted as Hung
once runPolicy.progressDeadlineSeconds pass with no new progress (docs/operator.md, "Node loss, drains and
hangs")."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import reliability
from cluster_support import Kubectl
from conftest import NODE_MONITOR_GRACE_S, NodeCluster
from kubernetes import client, config, watch

from finetune_operator import constants as c
from finetune_operator.progress import parse_line
from finetune_runtime import checkpoints
from ftjob_cluster import bins, node
from ftjob_cluster.localcluster import wait_for

JOBS = Path(__file__).resolve().parent / "jobs"
JOB_TIMEOUT = 1200.0
# How long a pass may take to follow a node's or a log's change on this loaded machine: the loop wakes on the Node's
# watch event and on its own timer, but kubectl polls, kopf's watch and the kubelet's status reports each add some.
SLACK_S = 30


def _status(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("-n", ns, "get", "ftj", name, "-o", "json").stdout).get("status", {}))


def _pods(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    return list(json.loads(kubectl("-n", ns, "get", "pods", "-o", "json").stdout)["items"])


def _wait_status(
    kubectl: Kubectl, ns: str, name: str, check: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        st = _status(kubectl, ns, name)
        return st if check(st) else None

    try:
        return dict(wait_for(ok, timeout=timeout, interval=1.0, message=what))  # type: ignore[arg-type]
    except TimeoutError:
        pods = kubectl("-n", ns, "get", "pods", "-o", "wide", check=False).stdout
        pytest.fail(f"{name}: {what} not seen: {_status(kubectl, ns, name)}\n{pods}")


class RankWatch:
    """Watches the namespace's pods (a real watch, every event) and records any moment at which two pods of the
    job claim the same rank: the group must never run a rank twice, not even while a lost node's pods linger."""

    def __init__(self, kubeconfig: Path, ns: str, job: str) -> None:
        api = config.new_client_from_config(str(kubeconfig))
        self.core = client.CoreV1Api(api)
        self.ns, self.job = ns, job
        self.pods: dict[str, str] = {}  # uid -> rank
        self.duplicates: list[str] = []
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        selector = f"{c.LABEL_JOB_NAME}={self.job}"
        while not self._stop.is_set():
            # Each watch starts with an ADDED event for every pod there is: what an older watch held may be gone.
            self.pods.clear()
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, self.ns, label_selector=selector, timeout_seconds=5):
                    pod = ev["object"]
                    uid, rank = pod.metadata.uid, (pod.metadata.labels or {}).get(c.LABEL_RANK)
                    self.events += 1
                    if ev["type"] == "DELETED" or rank is None:
                        self.pods.pop(uid, None)
                    else:
                        self.pods[uid] = rank
                    ranks = list(self.pods.values())
                    if len(ranks) != len(set(ranks)):
                        self.duplicates.append(f"{ev['type']} {pod.metadata.name}: ranks {sorted(ranks)}")
                    if self._stop.is_set():
                        break
            except Exception:  # the API server is loaded: the next watch starts afresh
                time.sleep(0.5)
            finally:
                w.stop()

    @contextmanager
    def running(self) -> Iterator[RankWatch]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=15)


def _cordoned(kubeconfig: Path, name: str) -> None:
    node._run(str(node.bins.ensure_binary("kubectl")), f"--kubeconfig={kubeconfig}", "cordon", name)


def _operator_on_node_a(kubectl: Kubectl, operator: str, node_cluster: NodeCluster) -> None:
    """The operator must survive node B's death: when it runs there, it is moved to node A first (node B
    cordoned meanwhile)."""
    a, b = node_cluster.nodes[0], node.NODE_B.name
    pods = _pods(kubectl, operator)
    if all(p["spec"].get("nodeName") == a for p in pods):
        return
    _cordoned(node_cluster.kubeconfig, b)
    try:
        for p in pods:
            kubectl(
                "-n", operator, "delete", "pod", p["metadata"]["name"], "--wait=true", "--timeout=120s", timeout=180
            )
        kubectl("-n", operator, "rollout", "status", "deployment", "--timeout=300s", timeout=320)
    finally:
        node.uncordon_node(node_cluster.kubeconfig, b)
    assert all(p["spec"].get("nodeName") == a for p in _pods(kubectl, operator)), _pods(kubectl, operator)


def _newest_step(ckpts: Path) -> int | None:
    """The step of the newest complete checkpoint under checkpoints/<job uid>/, if any."""
    found = [checkpoints.newest_complete(d) for d in ckpts.iterdir()] if ckpts.is_dir() else []
    steps = [checkpoints.checkpoint_step(p) for p in found if p is not None]
    return max((s for s in steps if s is not None), default=None)


def _training_again(st: dict[str, Any]) -> bool:
    """The restarted attempt reported progress: a restart drops status.lastProgressTime, and the new attempt's
    first progress line sets it again."""
    return bool(st.get("restartCount", 0) >= 1 and st.get("lastProgressTime"))


def _seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def _not_ready_since(kubectl: Kubectl, name: str) -> str:
    """When node `name`'s Ready condition last left True (its lastTransitionTime), read while it is not Ready."""
    conds = json.loads(kubectl("get", "node", name, "-o", "json").stdout)["status"]["conditions"]
    ready = next(x for x in conds if x["type"] == "Ready")
    assert ready["status"] != "True", ready
    return str(ready["lastTransitionTime"])


def _rank_0(kubectl: Kubectl, ns: str, job: str) -> str:
    """The name of the job's rank-0 pod now."""
    pods = [p for p in _pods(kubectl, ns) if p["metadata"]["labels"].get(c.LABEL_JOB_NAME) == job]
    return next(p["metadata"]["name"] for p in pods if p["metadata"]["labels"].get(c.LABEL_RANK) == "0")


def _training_again_at(kubectl: Kubectl, ns: str, job: str, resumed: int) -> datetime:
    """The kubelet's timestamp of the current attempt's first progress line past step `resumed` (rank 0 prints
    them; its pod is kept after the job ends)."""
    lines = reliability.progress_log(kubectl, ns, _rank_0(kubectl, ns, job), c.CONTAINER_TRAINER)
    first = reliability.first_step_after(lines, resumed)
    assert first is not None, f"{job}: no progress line past step {resumed} in rank 0's log: {lines[-5:]}"
    return first[0]


def _node_loss_goal(row: reliability.Disruption, not_ready: str, lost: str, loss_s: int) -> None:
    """The goal: NodeLost recorded within nodeLossSeconds + 10 s, counted from when Kubernetes marked the node not
    Ready (the node controller's grace period before that is Kubernetes', not the operator's). Both are API times."""
    after = reliability.seconds(reliability.utc(not_ready), reliability.utc(lost))
    row.goal = f"NodeLost within nodeLossSeconds ({loss_s} s) + 10 s of the node's Ready condition leaving True"
    row.goal_held = after <= loss_s + 10
    row.goal_note = f"{after:.0f} s"


def test_node_lost_mid_training_restarts_the_group_on_the_node_left_from_the_newest_checkpoint(
    kubectl: Kubectl, operator: str, node_cluster: NodeCluster, job_namespace: tuple[str, Path]
) -> None:
    """(a) The job fits on node A alone. Both ranks start on node B (node A cordoned while they are placed);
    node B dies after a checkpoint; once it has been not Ready for nodeLossSeconds the operator force-deletes its
    pods, records NodeLost naming the node, and the new attempt runs on node A from the newest checkpoint to
    Succeeded, never with two pods of one rank."""
    ns, host = job_namespace
    a, b = node_cluster.nodes[0], node.NODE_B.name
    name, loss_s = "ja-node-loss", 30
    row = reliability.disruption(
        "node lost (the job fits on the node left)",
        f"node B dies after a checkpoint: its kubelet, kube-proxy, containerd and the ranks' containers SIGKILLed, "
        f"no drain; runPolicy.nodeLossSeconds {loss_s}, node-monitor grace {NODE_MONITOR_GRACE_S} s",
    )
    cluster = node_cluster.cluster
    _operator_on_node_a(kubectl, operator, node_cluster)
    ranks = RankWatch(node_cluster.kubeconfig, ns, name)
    ckpts = host / name / ns / name / "checkpoints"
    with ranks.running():
        _cordoned(node_cluster.kubeconfig, a)
        try:
            kubectl("-n", ns, "apply", "-f", str(JOBS / f"{name}.yaml"))

            def placed() -> list[dict[str, Any]] | None:
                pods = [p for p in _pods(kubectl, ns) if p["spec"].get("nodeName")]
                return pods if len(pods) == 2 else None

            first = wait_for(placed, timeout=300, interval=1.0, message="both rank pods placed")
        finally:
            node.uncordon_node(node_cluster.kubeconfig, a)
        assert {p["spec"]["nodeName"] for p in first} == {b}, [p["spec"] for p in first]  # type: ignore[union-attr]
        try:
            at_kill = int(
                wait_for(lambda: _newest_step(ckpts), timeout=JOB_TIMEOUT, interval=1.0, message="a first checkpoint")
            )
            step_at_kill = _last_logged_step(kubectl, ns, f"{name}-rank-0")  # status.progress lags by its interval
            killed_at, killed_wall = time.monotonic(), reliability.now()
            node.kill_node(cluster, b)
            st = _wait_status(
                kubectl,
                ns,
                name,
                lambda s: any(f.get("reason") == "NodeLost" for f in s.get("failures", [])),
                NODE_MONITOR_GRACE_S + loss_s + SLACK_S + 60,
                "a NodeLost failure",
            )
            detected_s = time.monotonic() - killed_at
            # The group restarted once node B had been not Ready for nodeLossSeconds: not before (the node
            # controller needs its grace period first), and not much after.
            assert loss_s <= detected_s <= NODE_MONITOR_GRACE_S + loss_s + SLACK_S, detected_s
            f = next(f for f in st["failures"] if f.get("reason") == "NodeLost")
            assert f["node"] == b and f["pod"].startswith(f"{name}-rank-"), f
            assert f"runPolicy.nodeLossSeconds={loss_s}" in f["logTail"], f
            not_ready, lost = _not_ready_since(kubectl, b), f["time"]
            # The lost node's pods were force-deleted: the new attempt's pods take their names on node A.
            st = _wait_status(
                kubectl,
                ns,
                name,
                _training_again,
                JOB_TIMEOUT,
                "training again after the restart",
            )
            training_s = time.monotonic() - killed_at
            again = [p for p in _pods(kubectl, ns) if p["metadata"]["labels"].get(c.LABEL_ATTEMPT) == "1"]
            assert len(again) == 2 and {p["spec"].get("nodeName") for p in again} == {a}, [p["spec"] for p in again]
            done = _wait_status(
                kubectl, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), JOB_TIMEOUT, "end"
            )
            assert done["phase"] == "Succeeded", done
            assert done["restartCount"] == 1 and done["failures"][0]["reason"] == "NodeLost", done
            metrics = json.loads((host / name / ns / name / "metrics.json").read_text())
            resumed = checkpoints.checkpoint_step(Path(metrics["resumedFrom"]))
            assert resumed is not None and resumed >= at_kill, (metrics["resumedFrom"], at_kill)
            row.detected_s = reliability.api_seconds(killed_wall, lost)
            down_s = reliability.api_seconds(killed_wall, not_ready)
            row.detected_note = f"{reliability.failure_note(f)}; node B not Ready after {down_s:.0f} s"
            row.training_s = reliability.seconds(killed_wall, _training_again_at(kubectl, ns, name, resumed))
            row.training_note = "on node A"
            row.steps_lost = max(0, step_at_kill - resumed)
            row.steps_note = f"step {step_at_kill} logged, resumed from checkpoint {resumed}"
            _node_loss_goal(row, not_ready, lost, loss_s)
            print(
                f"[ftjob-e2e] node lost: detected {detected_s:.1f} s after the kill, training again after "
                f"{training_s:.1f} s, {max(0, step_at_kill - resumed)} steps lost (step {step_at_kill} -> "
                f"checkpoint {resumed})",
                flush=True,
            )
        finally:
            if not any(x.process for x in cluster.components if x.name == f"kubelet{node.NODE_B.suffix}"):
                node.restart_node(cluster, b)  # the session's other tests need node B
    assert ranks.events > 0 and not ranks.duplicates, ranks.duplicates


def test_rank_0_silent_past_the_progress_deadline_is_hung_but_not_before_its_first_line(
    kubectl: Kubectl, job_namespace: tuple[str, Path]
) -> None:
    """A command job: silent for longer than progressDeadlineSeconds before its first progress line (never a hang:
    the clock starts at the first line), three steps, then blocked for ever with its process alive. The operator
    restarts it as Hung naming step 3 within the deadline and a log read; backoffLimit 0 ends it there."""
    ns, _ = job_namespace
    name, deadline_s = "hang", 60
    row = reliability.disruption(
        "hang",
        f"rank 0 of a command job prints 3 steps, then blocks for ever with its process alive; "
        f"runPolicy.progressDeadlineSeconds {deadline_s}",
    )
    kubectl("-n", ns, "apply", "-f", str(JOBS / f"{name}.yaml"))
    st = _wait_status(
        kubectl, ns, name, lambda s: (s.get("progress") or {}).get("step") == 3, 600, "the last progress line"
    )
    seen = st["lastProgressTime"]
    # The hang begins with the last progress line: its kubelet timestamp, read while the pod still exists (the
    # job's end deletes it).
    steps = reliability.train_steps(
        reliability.progress_log(kubectl, ns, _rank_0(kubectl, ns, name), c.CONTAINER_TRAINER)
    )
    assert [s for _, s in steps] == [1, 2, 3], steps
    hung_at = steps[-1][0]
    end = _wait_status(kubectl, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the end")
    assert end["phase"] == "Failed" and end["reason"] == "BackoffLimitExceeded", end
    (f,) = end["failures"]
    assert f["reason"] == "Hung" and f["step"] == 3 and f["rank"] == 0, f
    assert "progressDeadlineSeconds=60" in f["logTail"] and "step 3" in f["logTail"], f
    # Counted from the last line the operator saw (its 30 s read interval, and a pass on a loaded machine).
    silent = _seconds(seen, f["time"])
    assert deadline_s <= silent <= deadline_s + 30 + SLACK_S, (seen, f["time"])
    row.detected_s = reliability.api_seconds(hung_at, f["time"])
    row.detected_note = f"{reliability.failure_note(f)}, counted from the last progress line; {silent:.0f} s " + (
        "after the operator last read progress"
    )
    row.training_note = "backoffLimit 0: the job ends Failed"
    row.steps_note = "a command job, no checkpoint"
    row.goal = f"Hung within the deadline ({deadline_s} s) + 30 s of the last progress line"
    row.goal_held = row.detected_s <= deadline_s + 30
    row.goal_note = f"{row.detected_s:.0f} s"
    print(f"[ftjob-e2e] hang: detected {silent:.0f} s after the last progress the operator saw", flush=True)
    # The blocked process ignores SIGTERM (the container's PID 1 has no handler): the job's end gives its pod the
    # failed group's grace period, not its own 120 s, before the kubelet kills it and frees the node.
    ended = time.monotonic()
    wait_for(
        lambda: not _pods(kubectl, ns),
        timeout=c.FAILED_GROUP_GRACE_S + SLACK_S,
        interval=1.0,
        message=f"the hung pod gone within constants.FAILED_GROUP_GRACE_S ({c.FAILED_GROUP_GRACE_S} s) of the end",
    )
    print(f"[ftjob-e2e] hang: the pod was gone {time.monotonic() - ended:.0f} s after the job Failed", flush=True)


def _last_logged_step(kubectl: Kubectl, ns: str, pod: str) -> int:
    """The newest training step rank 0 has printed (FTJOB_PROGRESS), read from its container log now."""
    out = kubectl("-n", ns, "logs", pod, "-c", c.CONTAINER_TRAINER, "--tail=200", check=False).stdout
    steps = [p.get("step", 0) for line in out.splitlines() if (p := parse_line(line)) and p.get("event") == "train"]
    return max(steps, default=0)


def test_drain_saves_the_current_step_on_every_rank_and_the_group_resumes_from_it(
    kubectl: Kubectl, operator: str, node_cluster: NodeCluster, job_namespace: tuple[str, Path]
) -> None:
    """kubectl drain of node B (the eviction API, as the AWS Node Termination Handler and Karpenter do) mid-training:
    only rank 1 gets SIGTERM; both ranks save the step they are at (there is no periodic checkpoint) and exit; the
    group restarts as Drained without counting against backoffLimit 0, waits Unschedulable while node B is
    cordoned (whole-node ranks need both nodes), and after the uncordon resumes from at least the step at which
    the drain began, to Succeeded."""
    ns, host = job_namespace
    a, b = node_cluster.nodes[0], node.NODE_B.name
    name = "ja-drain"
    row = reliability.disruption(
        "node drained",
        "`kubectl drain` of node B mid-training (eviction API), one whole-node rank on each node, no periodic "
        "checkpoint; node B stays cordoned until the job reports Unschedulable, then the test uncordons it",
    )
    _operator_on_node_a(kubectl, operator, node_cluster)
    kubectl("-n", ns, "apply", "-f", str(JOBS / f"{name}.yaml"))
    rank0 = f"{name}-rank-0"
    wait_for(lambda: _last_logged_step(kubectl, ns, rank0) >= 4, timeout=JOB_TIMEOUT, interval=2.0, message="step 4")
    pods = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in _pods(kubectl, ns)}
    assert pods == {rank0: a, f"{name}-rank-1": b} or pods == {rank0: b, f"{name}-rank-1": a}, pods
    # Rank 0's log as it is printed: its last training line before the drain stopped it (the pod is then deleted).
    follower = reliability.LogFollower(
        [
            str(bins.ensure_binary("kubectl")),
            f"--kubeconfig={node_cluster.kubeconfig}",
            "-n",
            ns,
            "logs",
            rank0,
            "-c",
            c.CONTAINER_TRAINER,
        ]
    )
    try:
        at_drain = _last_logged_step(kubectl, ns, rank0)
        drained_at, drained_wall = time.monotonic(), reliability.now()
        node.drain_node(node_cluster.kubeconfig, b, timeout_s=400)
        st = _wait_status(
            kubectl,
            ns,
            name,
            lambda s: any(f.get("reason") == "Drained" for f in s.get("failures", [])),
            120,
            "a Drained failure",
        )
        detected_s = time.monotonic() - drained_at
        f = next(f for f in st["failures"] if f.get("reason") == "Drained")
        assert f["node"] == b, f
        assert st.get("drainRestarts") == 1, st
        # Whole-node ranks: the new attempt waits for a second node, and says why.
        _wait_status(kubectl, ns, name, lambda s: s.get("reason") == "Unschedulable", 300, "Unschedulable")
        uncordoned_s = time.monotonic() - drained_at
    finally:
        node.uncordon_node(node_cluster.kubeconfig, b)
        # The interrupted attempt's pods are gone once the new one waits: its rank 0 printed its last line.
        stopped = reliability.last_step(follower.stop(wait_s=30))
    st = _wait_status(
        kubectl,
        ns,
        name,
        _training_again,
        JOB_TIMEOUT,
        "training again after the drain",
    )
    training_s = time.monotonic() - drained_at
    done = _wait_status(kubectl, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), JOB_TIMEOUT, "end")
    assert done["phase"] == "Succeeded", done
    assert done["restartCount"] == 1 and done["drainRestarts"] == 1, done
    metrics = json.loads((host / name / ns / name / "metrics.json").read_text())
    resumed = checkpoints.checkpoint_step(Path(metrics["resumedFrom"]))
    # Not the last periodic checkpoint (there is none): the step the drain interrupted, or a later one.
    assert resumed is not None and resumed >= at_drain, (metrics["resumedFrom"], at_drain)
    assert stopped is not None and stopped >= at_drain, (stopped, at_drain)
    row.detected_s = reliability.api_seconds(drained_wall, f["time"])
    row.detected_note = reliability.failure_note(f)
    row.training_s = reliability.seconds(drained_wall, _training_again_at(kubectl, ns, name, resumed))
    row.training_note = f"node B uncordoned after {uncordoned_s:.0f} s"
    row.steps_lost = max(0, stopped - resumed)
    row.steps_note = f"rank 0's last line before the drain stopped it: step {stopped}; resumed from {resumed}"
    row.goal = "drained work lost ≤ 1 step"
    row.goal_held = row.steps_lost <= 1
    row.goal_note = f"{row.steps_lost}"
    print(
        f"[ftjob-e2e] drain: detected {detected_s:.1f} s after the drain began, training again after "
        f"{training_s:.1f} s, "
        f"resumed from step {resumed} (step {at_drain} logged when it began)",
        flush=True,
    )


def test_node_lost_when_the_job_needs_it_waits_unschedulable_and_succeeds_once_it_is_back(
    kubectl: Kubectl, operator: str, node_cluster: NodeCluster, job_namespace: tuple[str, Path]
) -> None:
    """(b) Whole-node ranks, one per node: the job needs node B. Node B dies after a checkpoint; the group restarts
    as NodeLost; with one node left the new rank pod for node B's place waits and the job says Unschedulable with
    the scheduler's message; once node B is back (`restart_node`) the job resumes from the newest checkpoint and
    Succeeds, never with two pods of one rank."""
    ns, host = job_namespace
    b = node.NODE_B.name
    name, loss_s = "ja-node-back", 30
    row = reliability.disruption(
        "node lost (the job needs it)",
        f"node B dies after a checkpoint (as above), whole-node ranks need both nodes; the test restarts node B "
        f"once the job reports Unschedulable; runPolicy.nodeLossSeconds {loss_s}",
    )
    cluster = node_cluster.cluster
    _operator_on_node_a(kubectl, operator, node_cluster)
    ranks = RankWatch(node_cluster.kubeconfig, ns, name)
    ckpts = host / name / ns / name / "checkpoints"
    with ranks.running():
        kubectl("-n", ns, "apply", "-f", str(JOBS / f"{name}.yaml"))
        try:
            at_kill = int(
                wait_for(lambda: _newest_step(ckpts), timeout=JOB_TIMEOUT, interval=1.0, message="a first checkpoint")
            )
            placed = {p["spec"].get("nodeName") for p in _pods(kubectl, ns)}
            assert placed == set(node_cluster.nodes), placed
            step_at_kill = _last_logged_step(kubectl, ns, f"{name}-rank-0")
            killed_at, killed_wall = time.monotonic(), reliability.now()
            node.kill_node(cluster, b)
            # The restart's cause may be NodeLost, or rank 0 failing in a collective before node B is seen not
            # Ready; then NodeLost is recorded for that attempt once node B is lost. Either way it names node B.
            st = _wait_status(
                kubectl,
                ns,
                name,
                lambda s: (
                    s.get("restartCount", 0) >= 1
                    and s.get("reason") == "Unschedulable"
                    and any(f.get("reason") == "NodeLost" and f.get("node") == b for f in s.get("failures", []))
                ),
                NODE_MONITOR_GRACE_S + 30 + SLACK_S + 120,
                "the new attempt Unschedulable, node B's loss recorded",
            )
            assert "node" in st["message"], st["message"]  # the scheduler's own words, e.g. "0/2 nodes are available"
            not_ready = _not_ready_since(kubectl, b)
            restarted_s = time.monotonic() - killed_at
            node.restart_node(cluster, b)
        finally:
            if not any(x.process for x in cluster.components if x.name == f"kubelet{node.NODE_B.suffix}"):
                node.restart_node(cluster, b)  # the session's other tests need node B
        done = _wait_status(kubectl, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), JOB_TIMEOUT, "end")
    assert done["phase"] == "Succeeded" and done["restartCount"] == 1, done  # one restart, however it was caused
    metrics = json.loads((host / name / ns / name / "metrics.json").read_text())
    resumed = checkpoints.checkpoint_step(Path(metrics["resumedFrom"]))
    assert resumed is not None and resumed >= at_kill, (metrics["resumedFrom"], at_kill)
    assert ranks.events > 0 and not ranks.duplicates, ranks.duplicates
    # Detection: the restart's own entry (attempt 0), whatever its cause; the goal: the NodeLost entry.
    first = next(f for f in done["failures"] if f.get("attempt") == 0)
    lost = next(f for f in done["failures"] if f.get("reason") == "NodeLost" and f.get("node") == b)
    row.detected_s = reliability.api_seconds(killed_wall, first["time"])
    row.detected_note = f"{reliability.failure_note(first)}; node B not Ready after " + (
        f"{reliability.api_seconds(killed_wall, not_ready):.0f} s"
    )
    row.training_s = reliability.seconds(killed_wall, _training_again_at(kubectl, ns, name, resumed))
    row.training_note = f"node B restarted after {restarted_s:.0f} s"
    row.steps_lost = max(0, step_at_kill - resumed)
    row.steps_note = f"step {step_at_kill} logged, resumed from checkpoint {resumed}"
    _node_loss_goal(row, not_ready, lost["time"], loss_s)
