"""Queueing through a real Kueue (v0.17.0, built from its Go module) on the real control plane.

Kueue runs as a host process with its CRDs and its own admission webhooks registered on the API server
(ftjob_cluster.kueue); the operator creates one Workload per queued job and creates pods only while Kueue
admits it (docs/operator.md, "Kueue"). Pod status comes from the test Kubelet, as in test_operator.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ftjobs import load_sample, make_job
from kubernetes import client
from operator_support import NO_KUBELET, Kubelet, install_crd, job_yaml, running_operator

from ftjob_cluster.kueue import KueueProcess
from ftjob_cluster.testing import Cluster

ROOT = Path(__file__).resolve().parents[2]
API = ("finetune.dev", "v1alpha1")
KUEUE = ("kueue.x-k8s.io", "v1beta2")
# Each test job is 2 pods of the cpu profile's default 2 CPUs / 4Gi: this quota fits one job, not two.
QUOTA = {"cpu": "6", "memory": "12Gi"}


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KueueProcess]:
    if not cluster.local:
        pytest.skip("Kueue runs as a host process whose webhooks only a local API server can reach")
    proc = KueueProcess(cluster.kubeconfig, tmp_path_factory.mktemp("kueue"))
    try:
        yield proc.start()
    finally:
        proc.stop()
        print(f"kueue log: {proc.log_path}")


@pytest.fixture(scope="module")
def operator(kueue: KueueProcess, kubectl: Any, kubeconfig: Path, wait_for: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    install_crd(kubectl, wait_for)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(kubeconfig, wait_for, log):
        yield log
    print(f"operator log: {log}")


@pytest.fixture
def queue(operator: Path, kubectl: Any, namespace: str, wait_for: Any) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue with QUOTA (for this namespace only) and a LocalQueue `lq`."""
    cq = f"cq-{namespace}"[:63]
    objs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                  "resourceGroups": [{"coveredResources": sorted(QUOTA), "flavors": [{"name": "default", "resources": [
                      {"name": k, "nominalQuota": v} for k, v in sorted(QUOTA.items())]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "lq", "namespace": namespace}, "spec": {"clusterQueue": cq}},
    ]  # fmt: skip
    kubectl("apply", "-f", "-", input="\n---\n".join(job_yaml(o) for o in objs))
    active = "jsonpath={.status.conditions[?(@.type=='Active')].status}"
    wait_for(lambda: kubectl("get", "clusterqueue", cq, "-o", active).stdout == "True", timeout=120,
             message=f"ClusterQueue {cq} active")
    yield "lq"
    kubectl("delete", "clusterqueue", cq, "--ignore-not-found", "--wait=false")


@pytest.fixture
def explain(operator: Path, kueue: KueueProcess, kubectl: Any, namespace: str) -> Any:
    """`with explain():` around a test body: on a failure, print what the operator and Kueue saw (jobs,
    Workloads, pods, both logs' tails) before the error propagates."""
    return contextlib.contextmanager(lambda: _explained(operator, kueue, kubectl, namespace))


def _explained(operator: Path, kueue: KueueProcess, kubectl: Any, namespace: str) -> Iterator[None]:
    try:
        yield
    except BaseException:
        for what in ("ftj,workloads.kueue.x-k8s.io", "pods"):
            print(kubectl("get", what, "-n", namespace, "-o", "yaml", check=False).stdout)
        for log in (operator, kueue.log_path):
            print(f"--- {log} (tail)\n" + "\n".join(log.read_text(errors="replace").splitlines()[-80:]))
        raise


@pytest.fixture
def kubelet(kube_api: client.ApiClient, namespace: str) -> Iterator[Kubelet]:
    k = Kubelet(kube_api, namespace)
    yield k
    k.stop()


def queued_job(name: str, queue: str) -> dict[str, Any]:
    return (make_job(name).nodes(2).classification().set("spec.hardware.nodeSelector", NO_KUBELET)
            .run_policy(queueName=queue, backoffLimit=2).build())  # fmt: skip


def status(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(*API, ns, "finetunejobs", name)
    return dict(obj.get("status") or {})


def workload(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(client.CustomObjectsApi(api).get_namespaced_custom_object(*KUEUE, ns, "workloads", name))
    except client.exceptions.ApiException as e:
        if e.status == 404:
            return None
        raise


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return None


def admitted(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    wl = workload(api, ns, name)
    cond = condition(wl, "Admitted")
    return wl if cond and cond["status"] == "True" else None


def test_second_job_waits_for_quota_survives_no_restart_loss_and_starts_after_the_first(
        queue: str, kubectl: Any, kube_api: client.ApiClient, kubelet: Kubelet, namespace: str,
        wait_for: Any, explain: Any) -> None:  # fmt: skip
    with explain():
        ns = namespace
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("first", queue)))
        wl = wait_for(lambda: admitted(kube_api, ns, "first"), timeout=120, message="first admitted")
        assert wl["metadata"]["ownerReferences"][0]["kind"] == "FineTuneJob"  # type: ignore[index]
        wait_for(lambda: len(kubelet.live_pods("first")) == 2, timeout=120, message="first's pods")
        reserved_at = condition(wl, "QuotaReserved")["lastTransitionTime"]  # type: ignore[index,arg-type]

        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("second", queue)))
        st = wait_for(lambda: (s := status(kube_api, ns, "second")).get("phase") == "Queued"
                      and "insufficient" in s.get("message", "") and s, timeout=120,
                      message="second Queued with Kueue's reason")  # fmt: skip
        assert st["reason"] == "Queued"  # type: ignore[index]
        assert "LocalQueue lq" in st["message"]  # type: ignore[index]
        assert kubelet.pods("second") == []
        assert condition(workload(kube_api, ns, "second"), "QuotaReserved")["status"] == "False"  # type: ignore[index]

        # A rank fails: the group restarts under the same admission (the Workload is the job's, not its pods').
        for p in kubelet.live_pods("first"):
            kubelet.set_status(p.metadata.name, "Running")
        wait_for(lambda: status(kube_api, ns, "first").get("phase") == "Running", timeout=120, message="first Running")
        kubelet.set_status("first-rank-1", "Failed", exit_code=1, message="boom")
        wait_for(lambda: status(kube_api, ns, "first").get("restartCount") == 1, timeout=120, message="restart")
        wait_for(lambda: sorted(p.metadata.labels["finetune.dev/attempt"] for p in kubelet.live_pods("first"))
                 == ["1", "1"], timeout=120, message="attempt 1 pods")  # fmt: skip
        wl = admitted(kube_api, ns, "first")
        assert wl is not None, "the restart lost the admission"
        assert condition(wl, "QuotaReserved")["lastTransitionTime"] == reserved_at  # type: ignore[index]
        assert status(kube_api, ns, "second")["phase"] == "Queued" and kubelet.pods("second") == []

        # The first finishes: its Workload is Finished, the quota goes to the second, whose pods appear.
        for p in kubelet.live_pods("first"):
            kubelet.set_status(p.metadata.name, "Succeeded", exit_code=0)
        wait_for(lambda: status(kube_api, ns, "first").get("phase") == "Succeeded", timeout=120, message="first done")
        wait_for(lambda: (condition(workload(kube_api, ns, "first"), "Finished") or {}).get("status") == "True",
                 timeout=120, message="first's Workload Finished")  # fmt: skip
        wait_for(lambda: admitted(kube_api, ns, "second"), timeout=120, message="second admitted")
        wait_for(lambda: len(kubelet.live_pods("second")) == 2, timeout=120, message="second's pods")
        st = status(kube_api, ns, "second")
        assert st["phase"] in ("Pending", "Running")
        assert {c["type"]: c["status"] for c in st["conditions"]}["Queued"] == "False"


def test_deleting_a_queued_job_leaves_nothing_behind(
        queue: str, kubectl: Any, kube_api: client.ApiClient, kubelet: Kubelet, namespace: str,
        wait_for: Any, explain: Any) -> None:  # fmt: skip
    with explain():
        ns = namespace
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("holder", queue)))
        wait_for(lambda: admitted(kube_api, ns, "holder"), timeout=120, message="holder admitted")
        # Its pods come at the operator's next look at the Workload (reconcile.QUEUED_POLL_S).
        wait_for(lambda: len(kubelet.live_pods("holder")) == 2, timeout=60, message="holder's pods")
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("waiting", queue)))
        wait_for(lambda: status(kube_api, ns, "waiting").get("phase") == "Queued"
                 and workload(kube_api, ns, "waiting"), timeout=120, message="waiting Queued")  # fmt: skip
        kubectl("delete", "-n", ns, "ftj", "waiting", "--wait=false")

        def nothing_left() -> bool:
            selector = "finetune.dev/job-name=waiting"
            leftovers = kubectl("get", "-n", ns, "pods,services,configmaps,secrets,workloads.kueue.x-k8s.io",
                                "-l", selector, "-o", "name").stdout.split()  # fmt: skip
            gone = kubectl("get", "-n", ns, "ftj", "waiting", check=False).returncode != 0
            return gone and not leftovers and workload(kube_api, ns, "waiting") is None
        wait_for(nothing_left, timeout=120, message="no trace of the deleted queued job")
        # The admitted job is untouched.
        assert admitted(kube_api, ns, "holder") and len(kubelet.live_pods("holder")) == 2


def test_neuron_queue_sample_admits_a_trn1_job_to_its_flavor(
        operator: Path, kubectl: Any, kube_api: client.ApiClient, namespace: str, wait_for: Any,
        explain: Any) -> None:  # fmt: skip
    """manifests/samples/kueue/trn1-queue.yaml as docs/eks.md applies it, and a trn1 sample job queued in it."""
    with explain():
        sample = ROOT / "manifests" / "samples" / "kueue" / "trn1-queue.yaml"
        objs = [o for o in yaml.safe_load_all(sample.read_text()) if o]
        for o in objs:
            if o["kind"] == "LocalQueue":
                o["metadata"]["namespace"] = namespace
        kubectl("apply", "-f", "-", input="\n---\n".join(job_yaml(o) for o in objs))
        try:
            job = load_sample("trn1-bert-ja-1core-bf16")
            job["spec"]["hardware"]["nodeSelector"] = NO_KUBELET
            job["spec"].setdefault("runPolicy", {})["queueName"] = "trn1"
            kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(job))
            name = job["metadata"]["name"]
            wl = wait_for(lambda: admitted(kube_api, namespace, name), timeout=120, message="trn1 job admitted")
            [assignment] = wl["status"]["admission"]["podSetAssignments"]  # type: ignore[index]
            assert assignment["flavors"]["aws.amazon.com/neuroncore"] == "trn1-2xl"
            assert assignment["resourceUsage"]["aws.amazon.com/neuroncore"] == "1"
        finally:
            kubectl("delete", "-n", namespace, "ftj", "--all", "--wait=false")
            kubectl("delete", "clusterqueue", "trn1", "--ignore-not-found", "--wait=false")
