"""The operator SIGKILLed at random points of its reconciliation, then started again: never a duplicate or
orphaned child, the status converges, and a group restart that was under way is counted exactly once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from faultlib import (
    LONG,
    SEED,
    DelayProxy,
    OperatorProcess,
    jobs,
    record,
    rng,
    server_port,
    violations,
    wait_until,
)
from kubernetes import client
from operator_support import Kubelet, job_yaml, two_rank_job

from finetune_operator import constants as c

# A targeted loop (e.g. just the rank failures before a kill): FTJOB_KILL_TRIALS=40 FTJOB_KILL_ACTIONS=fail-rank.
# With actions restricted, a trial creates a job when none of the allowed actions is possible yet.
TRIALS = int(os.environ.get("FTJOB_KILL_TRIALS") or (50 if LONG else 3))
ACTIONS = {a for a in (os.environ.get("FTJOB_KILL_ACTIONS") or "").split(",") if a}
HEALTHY_S = 120  # a new operator process's imports alone took 49 s at a load average of 13 on 2 cores
MAX_JOBS = 4  # more live jobs make every pass longer without adding new kill points
DELAY_S = 0.02  # per request chunk: a pass's creates and deletes spread over ~0.5 s, so kills land inside them


def _all_running(kube_api: Any, ns: str, kubelet: Kubelet) -> bool:
    """Plays the kubelet: every live pod Running; true once every job reports Running with all ranks ready."""
    for pod in kubelet.core.list_namespaced_pod(ns, label_selector=f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}").items:
        if not pod.metadata.deletion_timestamp and (pod.status.phase or "Pending") == "Pending":
            try:
                kubelet.set_status(pod.metadata.name, "Running")
            except client.exceptions.ApiException as e:
                if e.status != 404:
                    raise
    return all(
        (j.get("status") or {}).get("phase") == "Running"
        and j["status"]["ranks"]["ready"] == j["status"]["ranks"]["total"]
        for j in jobs(kube_api, ns).values()
    )


def _pods(kubelet: Kubelet, job: str) -> str:
    """The job's pods as name/attempt/phase/uid, for a failure message."""
    return ", ".join(
        f"{p.metadata.name}/a{p.metadata.labels.get(c.LABEL_ATTEMPT)}/{p.status.phase}/{p.metadata.uid[:8]}"
        for p in kubelet.pods(job)
    )


def test_operator_sigkilled_at_random_points(
    crd: None, kube_api: Any, kubectl: Any, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    rec = record(
        "test_operator_sigkilled_at_random_points",
        f"SIGKILL of the operator at a uniformly random 0-1.5 s after an action (create a torchrun or MPI "
        f"job, fail a running rank, delete a job), API traffic delayed {DELAY_S * 1000:.0f} ms per chunk; "
        "then a new operator process",
    )
    r = rng(rec.scenario)
    proxy = DelayProxy(server_port(kubeconfig), delay=DELAY_S)
    kc = proxy.kubeconfig(kubeconfig, tmp_path / "proxy.kubeconfig")
    kubelet = Kubelet(kube_api, namespace)
    log = tmp_path / "operator.log"
    op = OperatorProcess(kc, log)
    made = failures_injected = 0
    try:
        wait_until(op.healthy, HEALTHY_S, "operator /healthz")
        for trial in range(TRIALS):
            current = jobs(kube_api, namespace)
            running = [n for n, j in current.items() if (j.get("status") or {}).get("phase") == "Running"]
            choices = ["create", "create-mpi"] if len(current) < MAX_JOBS else ["delete"]
            choices += ["fail-rank"] * (2 if running else 0)
            if ACTIONS:
                choices = [a for a in choices if a in ACTIONS] or ["create", "create-mpi"]
            action = r.choice(choices)
            expect_restarts: dict[str, int] = {}
            if action.startswith("create"):
                made += 1
                job = two_rank_job(f"k{made}", mpi=action == "create-mpi", backoffLimit=1000)
                kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(job))
            elif action == "delete":
                victim = r.choice(sorted(current))
                client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
                    "finetune.dev",
                    "v1alpha1",
                    namespace,
                    "finetunejobs",
                    victim,
                    body=client.V1DeleteOptions(propagation_policy="Background"),
                )
            else:
                victim = r.choice(sorted(running))
                before = int(current[victim]["status"].get("restartCount") or 0)
                failed = r.choice(sorted(p.metadata.name for p in kubelet.live_pods(victim)))
                kubelet.set_status(failed, "Failed", exit_code=1, message="injected rank failure")
                expect_restarts[victim] = before + 1
                failures_injected += 1
            time.sleep(r.uniform(0.0, 1.5))
            op.kill()
            op = OperatorProcess(kc, log)
            wait_until(op.healthy, HEALTHY_S, "restarted operator /healthz")
            try:
                # violations() compares each status with the pods the API server holds: right after the restart
                # the status is what the killed process last wrote, and a rank failed after that is in no status
                # until the new process has made a pass.
                wait_until(lambda: not violations(kube_api, namespace), 90, "children and status to converge")
                wait_until(lambda: _all_running(kube_api, namespace, kubelet), 90, "every job Running")
                after = jobs(kube_api, namespace)
                for name, want in expect_restarts.items():
                    got = int(after[name]["status"].get("restartCount") or 0)
                    assert got == want, (
                        f"{name}: restartCount {got}, expected {want} (a restart lost or doubled; "
                        f"{failed} failed; pods now {_pods(kubelet, name)}); seed {SEED}; "
                        f"status {after[name]['status']}; events "
                        + kubectl("get", "events", "-n", namespace, "-o", "wide").stdout
                    )
            except AssertionError as e:  # recorded; the trials go on (a rate is worth more than the first miss)
                rec.failures.append(f"trial {trial} ({action}): {e}"[:300])
            finally:
                rec.trials += 1
        assert not rec.failures, f"{len(rec.failures)}/{rec.trials} trials failed (seed {SEED}):\n" + "\n".join(
            rec.failures
        )
        rec.notes.append(
            f"{made} jobs created, {failures_injected} rank failures injected, each counted exactly "
            "once; every trial converged with no duplicate or orphan"
        )
    finally:
        op.stop()
        kubelet.stop()
        proxy.close()
