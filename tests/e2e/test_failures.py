"""Failures the kubelet and the runtime really produce: a rank's container killed through containerd after a
checkpoint, an OOM kill under a cgroup memory limit, and the operator pod deleted mid-training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import reliability
from cluster_support import Kubectl

from finetune_operator import constants as c
from finetune_runtime.checkpoints import checkpoint_step
from ftjob_cluster import node
from ftjob_cluster.localcluster import wait_for

JOBS = Path(__file__).resolve().parent / "jobs"
JOB_TIMEOUT = 1200.0


def _job(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("-n", ns, "get", "ftj", name, "-o", "json").stdout))


def _status(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return dict(_job(kubectl, ns, name).get("status", {}))


def _rank_pods(kubectl: Kubectl, ns: str, job: str) -> list[dict[str, Any]]:
    pods = json.loads(kubectl("-n", ns, "get", "pods", "-o", "json").stdout)["items"]
    owned = [p for p in pods if any(o.get("name") == job for o in p["metadata"].get("ownerReferences", []))]
    return sorted(owned, key=lambda p: p["metadata"]["name"])


def _job_pod(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("-n", ns, "get", "pod", name, "-o", "json").stdout))


def _wait_phase(kubectl: Kubectl, ns: str, name: str, phases: tuple[str, ...], timeout: float) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        st = _status(kubectl, ns, name)
        return st if st.get("phase") in phases else None

    try:
        return dict(wait_for(check, timeout=timeout, interval=2.0, message=f"{name} phase in {phases}"))  # type: ignore[arg-type]
    except TimeoutError:
        pods = kubectl("-n", ns, "get", "pods", "-o", "wide", check=False).stdout
        pytest.fail(f"{name} never reached {phases}: {_status(kubectl, ns, name)}\n{pods}")


def test_rank_killed_after_checkpoint_restarts_group_and_resumes(
    kubectl: Kubectl, job_namespace: tuple[str, Path]
) -> None:
    ns, host = job_namespace
    row = reliability.disruption(
        "rank killed", "rank 1's container SIGKILLed through its node's containerd (exit 137) after a checkpoint"
    )
    kubectl("-n", ns, "apply", "-f", str(JOBS / "ja-resume.yaml"))
    checkpoints = host / "ja-resume" / ns / "ja-resume" / "checkpoints"  # checkpoints/<job uid>/checkpoint-<step>
    wait_for(
        lambda: any(checkpoints.glob("*/checkpoint-*")),
        timeout=JOB_TIMEOUT,
        interval=1.0,
        message="a first checkpoint in the output volume",
    )
    victim = _rank_pods(kubectl, ns, "ja-resume")[-1]
    cid = victim["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    rank0 = _rank_pods(kubectl, ns, "ja-resume")[0]["metadata"]["name"]
    step_at_kill = reliability.last_step(reliability.progress_log(kubectl, ns, rank0, c.CONTAINER_TRAINER)) or 0
    killed_wall = reliability.now()
    # Through the runtime of the victim's node, as an OOM killer or a crash would: the kubelet sees exit code 137.
    node.ctr("tasks", "kill", "-s", "KILL", cid, node=node.node_spec(victim["spec"]["nodeName"]))
    st = _wait_phase(kubectl, ns, "ja-resume", ("Succeeded", "Failed"), JOB_TIMEOUT)
    assert st["phase"] == "Succeeded", st
    assert st.get("restartCount", 0) >= 1, st
    failure = st["failures"][0]
    assert failure["pod"] == victim["metadata"]["name"] and failure["exitCode"] == 137, st["failures"]
    metrics = json.loads((host / "ja-resume" / ns / "ja-resume" / "metrics.json").read_text())
    assert metrics["resumedFrom"] and "checkpoint-" in metrics["resumedFrom"], metrics
    resumed = checkpoint_step(Path(metrics["resumedFrom"]))
    assert resumed is not None, metrics
    row.detected_s = reliability.api_seconds(killed_wall, failure["time"])
    row.detected_note = reliability.failure_note(failure)
    # The last attempt's rank 0 (the job's pods are kept after it Succeeded).
    again = reliability.first_step_after(reliability.progress_log(kubectl, ns, rank0, c.CONTAINER_TRAINER), resumed)
    assert again is not None, f"no progress line past step {resumed} in {rank0}'s log"
    row.training_s = reliability.seconds(killed_wall, again[0])
    row.training_note = f"{st['restartCount']} restart(s)" if st["restartCount"] != 1 else ""
    row.steps_lost = max(0, step_at_kill - resumed)
    row.steps_note = f"step {step_at_kill} logged, resumed from checkpoint {resumed}"


def test_oom_killed_rank_is_recorded_and_backoff_limit_honoured(
    kubectl: Kubectl, job_namespace: tuple[str, Path]
) -> None:
    ns, _ = job_namespace
    row = reliability.disruption(
        "OOM", "a memory limit (256Mi) too small for the job: the kernel's OOM killer ends the ranks; backoffLimit 1"
    )
    kubectl("-n", ns, "apply", "-f", str(JOBS / "ja-oom.yaml"))
    st = _wait_phase(kubectl, ns, "ja-oom", ("Succeeded", "Failed"), JOB_TIMEOUT)
    assert st["phase"] == "Failed", st
    assert any(f.get("reason") == "OOMKilled" for f in st.get("failures", [])), st.get("failures")
    assert st.get("restartCount") == 1, st  # backoffLimit: 1 -> one group restart, then Failed
    wait_for(
        lambda: not [p for p in _rank_pods(kubectl, ns, "ja-oom") if p["status"].get("phase") == "Running"],
        timeout=120,
        message="no rank pod of the failed job running",
    )
    # The fault's time: the kubelet's finishedAt of the OOM-killed container the last failure names (its pod is
    # kept for its logs).
    last = next(f for f in reversed(st["failures"]) if f.get("reason") == "OOMKilled")
    pod = _job_pod(kubectl, ns, last["pod"])
    killed = [
        s["state"]["terminated"]["finishedAt"]
        for s in [*pod["status"].get("initContainerStatuses", []), *pod["status"].get("containerStatuses", [])]
        if (s.get("state", {}).get("terminated") or {}).get("reason") == "OOMKilled"
    ]
    assert killed, pod["status"]
    row.detected_s = reliability.api_seconds(reliability.utc(killed[0]), last["time"])
    row.detected_note = f"{reliability.failure_note(last)}, from the kubelet's finishedAt"
    row.training_note = "never: the limit is too small to start; backoffLimit reached, Failed with reason OOMKilled"
    row.steps_note = "killed before its first step"


def test_operator_pod_deleted_mid_training_job_continues_with_same_pods(
    kubectl: Kubectl, operator: str, job_namespace: tuple[str, Path]
) -> None:
    ns, _ = job_namespace
    kubectl("-n", ns, "apply", "-f", str(JOBS / "ja-sentiment-torchrun.yaml"))
    _wait_phase(kubectl, ns, "ja-sentiment", ("Running",), JOB_TIMEOUT)
    before = {p["metadata"]["uid"] for p in _rank_pods(kubectl, ns, "ja-sentiment")}
    old = json.loads(kubectl("-n", operator, "get", "pods", "-o", "json").stdout)["items"][0]["metadata"]["name"]
    kubectl("-n", operator, "delete", "pod", old, "--wait=false")
    kubectl("-n", operator, "rollout", "status", "deployment", "--timeout=300s", timeout=320)
    st = _wait_phase(kubectl, ns, "ja-sentiment", ("Succeeded", "Failed"), JOB_TIMEOUT)
    assert st["phase"] == "Succeeded", st
    after = {p["metadata"]["uid"] for p in _rank_pods(kubectl, ns, "ja-sentiment")}
    assert after == before and len(after) == 2, (before, after)
    assert st.get("restartCount", 0) == 0, st
