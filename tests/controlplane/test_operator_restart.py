"""Restarting the operator (a Deployment rollout, a crash) must not disturb running jobs: the new process
rebuilds its view from the API (kopf lists and indexes pods before any handler runs) and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client
from operator_support import Kubelet, install_crd, job_yaml, running_operator, two_rank_job


def _status(kube_api: Any, ns: str, name: str) -> dict[str, Any]:
    job = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        "finetune.dev", "v1alpha1", ns, "finetunejobs", name
    )
    return dict(job.get("status") or {})


def test_restarted_operator_leaves_a_running_job_alone(
    kubectl: Any, kube_api: Any, namespace: str, kubeconfig: Path, wait_for: Any, tmp_path: Path
) -> None:
    install_crd(kubectl, wait_for)
    kubelet = Kubelet(kube_api, namespace)
    job = two_rank_job("steady")
    try:
        with running_operator(kubeconfig, wait_for, tmp_path / "first.log"):
            kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(job))
            wait_for(lambda: len(kubelet.live_pods("steady")) == 2, timeout=60, message="2 pods")
            for pod in kubelet.live_pods("steady"):
                kubelet.set_status(pod.metadata.name, "Running")
            wait_for(
                lambda: _status(kube_api, namespace, "steady").get("phase") == "Running", timeout=60, message="Running"
            )
        before_pods = {p.metadata.name: p.metadata.uid for p in kubelet.live_pods("steady")}
        before = _status(kube_api, namespace, "steady")
        events_before = _event_count(kubectl, namespace)

        second = tmp_path / "second.log"
        with running_operator(kubeconfig, wait_for, second) as op:
            # The new process's daemon makes a full pass at once. The counter goes up after the pass has applied
            # its plan, so whatever that pass wrote is in the API once it reads 1.
            wait_for(lambda: op.reconciles() >= 1, timeout=60, message="the new operator's first pass")
            after_pods = {p.metadata.name: p.metadata.uid for p in kubelet.live_pods("steady")}
            after = _status(kube_api, namespace, "steady")
        assert after_pods == before_pods, "a restart recreated pods"
        assert after["phase"] == "Running" and after["restartCount"] == before["restartCount"] == 0
        assert after["conditions"] == before["conditions"]
        assert _event_count(kubectl, namespace) == events_before, "a restart posted events (a phase flapped)"
        assert "reconcile of" not in second.read_text(), second.read_text()[-3000:]
    finally:
        kubelet.stop()


def _event_count(kubectl: Any, namespace: str) -> int:
    out = kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.kind=FineTuneJob", "-o", "json"
    ).stdout
    return sum(int(e.get("count") or 1) for e in json.loads(out)["items"])
