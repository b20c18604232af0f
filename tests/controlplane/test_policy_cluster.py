"""The operator's allowlists (chart values `policy.*`) enforced by the real operator against a real API server:
a job that breaks them ends Failed/PolicyViolation, with an Event, and no child of it ever exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from operator_support import API, Kubelet, install_crd, job_yaml, running_operator, two_rank_job

POLICY = {
    "allowedImages": ["registry.test/finetune-operator/*"],
    "allowedServiceAccounts": ["default"],
    "allowedSecrets": ["hf-*"],
}


def _status(kube_api: Any, ns: str, name: str) -> dict[str, Any]:
    job = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(*API, ns, "finetunejobs", name)
    return dict(job.get("status") or {})


def _children(kubectl: Any, ns: str, name: str) -> list[str]:
    out = kubectl(
        "get", "pods,services,configmaps,secrets", "-n", ns, "-l", f"finetune.dev/job-name={name}", "-o", "name"
    ).stdout
    return out.split()


def test_allowlists_fail_a_job_before_any_child_and_pass_an_allowed_one(
    kubectl: Any, kube_api: Any, namespace: str, kubeconfig: Path, wait_for: Any, tmp_path: Path
) -> None:
    install_crd(kubectl, wait_for)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"policy": POLICY}))
    kubelet = Kubelet(kube_api, namespace)

    def job(name: str, **spec: Any) -> dict[str, Any]:
        j = two_rank_job(name)
        j["spec"].update(spec)
        return j

    bad = {
        "image": job("bad-image", image="docker.io/someone/miner:1"),
        "sa": job("bad-sa", serviceAccountName="deployer"),
        "secret": job("bad-secret", envFrom=[{"secretRef": {"name": "db-root"}}]),
        # spec.podTemplate: a hostPath volume (outside the default allowedVolumeTypes), a sidecar's image
        # (allowedImages, as allowedSidecarImages is not set).
        "volume": job("bad-volume", podTemplate={"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}),
        "sidecar": job(
            "bad-sidecar",
            podTemplate={"initContainers": [{"name": "s", "image": "docker.io/x/y:1", "restartPolicy": "Always"}]},
        ),
    }
    fields = {
        "image": "spec.image",
        "sa": "spec.serviceAccountName",
        "secret": "spec.envFrom[0].secretRef.name",
        "volume": "spec.podTemplate.volumes[0]",
        "sidecar": "spec.podTemplate.initContainers[0].image",
    }
    try:
        with running_operator(kubeconfig, wait_for, tmp_path / "operator.log", ["--config", str(config)]):
            for j in bad.values():
                kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(j))
            kubectl(
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                input=job_yaml(
                    job("fine", image="registry.test/finetune-operator/cpu:2", hfTokenSecretRef={"name": "hf-token"})
                ),
            )
            for key, j in bad.items():
                name = j["metadata"]["name"]
                wait_for(
                    lambda n=name: _status(kube_api, namespace, n).get("phase") == "Failed",
                    timeout=60,
                    message=f"{name} Failed",
                )
                st = _status(kube_api, namespace, name)
                assert st["reason"] == "PolicyViolation", st
                assert st["message"].startswith(fields[key] + " ") and "policy.allowed" in st["message"], st
                assert _children(kubectl, namespace, name) == [], f"{name} got children despite the policy"
            wait_for(lambda: len(kubelet.live_pods("fine")) == 2, timeout=60, message="the allowed job's pods")
            assert _status(kube_api, namespace, "fine").get("reason") != "PolicyViolation"
            events = json.loads(
                kubectl(
                    "get", "events", "-n", namespace, "--field-selector", "reason=PolicyViolation", "-o", "json"
                ).stdout
            )["items"]
            assert {e["involvedObject"]["name"] for e in events} == {j["metadata"]["name"] for j in bad.values()}
    finally:
        kubelet.stop()


# Issue 23: the lists a namespace-independent operator config can hold today (globs that match every namespace;
# rules for some namespaces only need the job's namespace in the reconcile pass, see policy.violations).
POLICY_23 = {
    "allowedClaims": [
        {"claims": ["results"], "purposes": ["output"]},
        {"claims": ["finetune-cache"], "purposes": ["compileCache"]},
    ],
    "allowedTolerationKeys": ["nvidia.com/*"],
    "allowedNodeLabels": ["finetune.dev/test-no-kubelet=true", "pool=team-a-*"],
    "allowedSchedulerNames": ["default-scheduler"],
    "queueRequiredNamespaces": ["*"],
}


def test_claims_scheduling_fields_and_required_queues_fail_a_job_before_any_child(
    kubectl: Any, kube_api: Any, namespace: str, kubeconfig: Path, wait_for: Any, tmp_path: Path
) -> None:
    install_crd(kubectl, wait_for)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"policy": POLICY_23}))

    def job(name: str, queue: bool = True, **spec: Any) -> dict[str, Any]:
        j = two_rank_job(name, **({"queueName": "lq"} if queue else {}))
        for key, value in spec.items():
            section, _, field = key.partition("__")
            if field:
                j["spec"].setdefault(section, {})[field] = value
            else:
                j["spec"][section] = value
        return j

    bad = {
        # The output claim every job writes to, mounted as a cache: the cross-tenant read of issue 23.
        "cache-is-output": (
            job("cache-is-output", compileCache={"claimName": "results"}),
            "spec.compileCache.claimName",
        ),
        "tolerate-all": (
            job("tolerate-all", hardware__tolerations=[{"operator": "Exists"}]),
            "spec.hardware.tolerations[0]",
        ),
        "control-plane": (
            job("control-plane", hardware__nodeSelector={"node-role.kubernetes.io/control-plane": ""}),
            "spec.hardware.nodeSelector[node-role.kubernetes.io/control-plane]",
        ),
        "scheduler": (job("scheduler", hardware__schedulerName="my-scheduler"), "spec.hardware.schedulerName"),
        "no-queue": (job("no-queue", queue=False), "spec.runPolicy.queueName"),
    }
    with running_operator(kubeconfig, wait_for, tmp_path / "operator.log", ["--config", str(config)]):
        for j, _ in bad.values():
            kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(j))
        for name, (_, field) in bad.items():
            wait_for(
                lambda n=name: _status(kube_api, namespace, n).get("phase") == "Failed",
                timeout=60,
                message=f"{name} Failed",
            )
            st = _status(kube_api, namespace, name)
            assert st["reason"] == "PolicyViolation", st
            assert st["message"].startswith(field + " "), st
            assert _children(kubectl, namespace, name) == [], f"{name} got children despite the policy"
