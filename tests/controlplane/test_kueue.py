"""Queueing through a real Kueue (v0.17.0, built from its Go module) on the real control plane.

Kueue runs as a host process with its CRDs and its own admission webhooks registered on the API server
(ftjob_cluster.kueue); the operator creates one Workload per queued job and creates pods only while Kueue
admits it (docs/operator.md, "Kueue"). Pod status comes from the test Kubelet, as in test_operator.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Cluster
from ftjobs import load_sample
from kubernetes import client
from operator_support import API, NO_KUBELET, Kubelet, install_crd, job_yaml, running_operator, status, two_rank_job

from finetune_operator.pacing import IDLE_REQUEUE_S
from ftjob_cluster.kueue import KueueProcess

ROOT = Path(__file__).resolve().parents[2]
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
def operator(
    kueue: KueueProcess, kubectl: Any, kubeconfig: Path, wait_for: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    install_crd(kubectl, wait_for)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(kubeconfig, wait_for, log):
        yield log
    print(f"operator log: {log}")


def namespace_queues(cq: str, lq: str, namespace: str, quota: dict[str, str]) -> list[dict[str, Any]]:
    """ClusterQueue `cq` for `namespace` alone, with `quota` of flavor `default`, and LocalQueue `lq` into it."""
    resources = [{"name": k, "nominalQuota": v} for k, v in sorted(quota.items())]
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {"coveredResources": sorted(quota), "flavors": [{"name": "default", "resources": resources}]}
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": lq, "namespace": namespace},
            "spec": {"clusterQueue": cq},
        },
    ]


@pytest.fixture
def queue(operator: Path, kubectl: Any, namespace: str, wait_for: Any) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue with QUOTA (for this namespace only) and a LocalQueue `lq`."""
    cq = f"cq-{namespace}"[:63]
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}}
    objs = [flavor, *namespace_queues(cq, "lq", namespace, QUOTA)]
    kubectl("apply", "-f", "-", input="\n---\n".join(job_yaml(o) for o in objs))
    active = "jsonpath={.status.conditions[?(@.type=='Active')].status}"
    wait_for(
        lambda: kubectl("get", "clusterqueue", cq, "-o", active).stdout == "True",
        timeout=120,
        message=f"ClusterQueue {cq} active",
    )
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
    return two_rank_job(name, queueName=queue, backoffLimit=2)


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
    queue: str, kubectl: Any, kube_api: client.ApiClient, kubelet: Kubelet, namespace: str, wait_for: Any, explain: Any
) -> None:
    with explain():
        ns = namespace
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("first", queue)))
        wl = wait_for(lambda: admitted(kube_api, ns, "first"), timeout=120, message="first admitted")
        assert wl["metadata"]["ownerReferences"][0]["kind"] == "FineTuneJob"  # type: ignore[index]
        wait_for(lambda: len(kubelet.live_pods("first")) == 2, timeout=120, message="first's pods")
        reserved_at = condition(wl, "QuotaReserved")["lastTransitionTime"]  # type: ignore[index,arg-type]

        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("second", queue)))
        st = wait_for(
            lambda: (
                (s := status(kube_api, ns, "second")).get("phase") == "Queued"
                and "insufficient" in s.get("message", "")
                and s
            ),
            timeout=120,
            message="second Queued with Kueue's reason",
        )
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
        wait_for(
            lambda: sorted(p.metadata.labels["finetune.dev/attempt"] for p in kubelet.live_pods("first")) == ["1", "1"],
            timeout=120,
            message="attempt 1 pods",
        )
        wl = admitted(kube_api, ns, "first")
        assert wl is not None, "the restart lost the admission"
        assert condition(wl, "QuotaReserved")["lastTransitionTime"] == reserved_at  # type: ignore[index]
        assert status(kube_api, ns, "second")["phase"] == "Queued" and kubelet.pods("second") == []

        # The first finishes: its Workload is Finished, the quota goes to the second, whose pods appear.
        for p in kubelet.live_pods("first"):
            kubelet.set_status(p.metadata.name, "Succeeded", exit_code=0)
        wait_for(lambda: status(kube_api, ns, "first").get("phase") == "Succeeded", timeout=120, message="first done")
        wait_for(
            lambda: (condition(workload(kube_api, ns, "first"), "Finished") or {}).get("status") == "True",
            timeout=120,
            message="first's Workload Finished",
        )
        wait_for(lambda: admitted(kube_api, ns, "second"), timeout=120, message="second admitted")
        wait_for(lambda: len(kubelet.live_pods("second")) == 2, timeout=120, message="second's pods")
        st = status(kube_api, ns, "second")
        assert st["phase"] in ("Pending", "Running")
        assert {c["type"]: c["status"] for c in st["conditions"]}["Queued"] == "False"


def test_deleting_a_queued_job_leaves_nothing_behind(
    queue: str, kubectl: Any, kube_api: client.ApiClient, kubelet: Kubelet, namespace: str, wait_for: Any, explain: Any
) -> None:
    with explain():
        ns = namespace
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("holder", queue)))
        wait_for(lambda: admitted(kube_api, ns, "holder"), timeout=120, message="holder admitted")
        # Its pods come with the pass that the admission's watch event wakes.
        wait_for(lambda: len(kubelet.live_pods("holder")) == 2, timeout=60, message="holder's pods")
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("waiting", queue)))
        wait_for(
            lambda: status(kube_api, ns, "waiting").get("phase") == "Queued" and workload(kube_api, ns, "waiting"),
            timeout=120,
            message="waiting Queued",
        )
        kubectl("delete", "-n", ns, "ftj", "waiting", "--wait=false")

        def nothing_left() -> bool:
            selector = "finetune.dev/job-name=waiting"
            leftovers = kubectl(
                "get",
                "-n",
                ns,
                "pods,services,configmaps,secrets,workloads.kueue.x-k8s.io",
                "-l",
                selector,
                "-o",
                "name",
            ).stdout.split()
            gone = kubectl("get", "-n", ns, "ftj", "waiting", check=False).returncode != 0
            return gone and not leftovers and workload(kube_api, ns, "waiting") is None

        wait_for(nothing_left, timeout=120, message="no trace of the deleted queued job")
        # The admitted job is untouched.
        assert admitted(kube_api, ns, "holder") and len(kubelet.live_pods("holder")) == 2


def test_neuron_queue_sample_admits_a_trn1_job_to_its_flavor(
    operator: Path, kubectl: Any, kube_api: client.ApiClient, namespace: str, wait_for: Any, explain: Any
) -> None:
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


# A flavor as a team's dedicated pool would be: its nodes carry the label and the taint, and the flavor
# tolerates the taint so that Kueue assigns it (flavorassigner: nodeTaints untolerated by the pod set and the
# flavor's own tolerations exclude a flavor).
POOL_LABEL = {"finetune.dev/test-pool": "blue"}
POOL_TAINT = {"key": "finetune.dev/test-dedicated", "value": "ml", "effect": "NoSchedule"}
POOL_TOLERATION = {"key": "finetune.dev/test-dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}


def apply_queue(kubectl: Any, wait_for: Any, namespace: str, name: str, flavor: dict[str, Any]) -> tuple[str, str]:
    """ResourceFlavor `flavor`, a ClusterQueue cq-<name>-<namespace> with QUOTA in it for this namespace only, and
    LocalQueue `name` pointing at it. Returns (ClusterQueue, ResourceFlavor) names."""
    cq = f"cq-{name}-{namespace}"[:63]
    objs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", **flavor},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cq},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {
                        "coveredResources": sorted(QUOTA),
                        "flavors": [
                            {
                                "name": flavor["metadata"]["name"],
                                "resources": [{"name": k, "nominalQuota": v} for k, v in sorted(QUOTA.items())],
                            }
                        ],
                    }
                ],
            },
        },
    ]
    kubectl("apply", "-f", "-", input="\n---\n".join(job_yaml(o) for o in objs))
    active = "jsonpath={.status.conditions[?(@.type=='Active')].status}"
    wait_for(
        lambda: kubectl("get", "clusterqueue", cq, "-o", active).stdout == "True",
        timeout=120,
        message=f"ClusterQueue {cq} active",
    )
    return cq, flavor["metadata"]["name"]


@pytest.fixture
def pool_flavor(namespace: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"blue-{namespace}"[:63]},
        "spec": {"nodeLabels": POOL_LABEL, "nodeTaints": [POOL_TAINT], "tolerations": [POOL_TOLERATION]},
    }


@pytest.fixture
def pool_queue(kubectl: Any, wait_for: Any, namespace: str, pool_flavor: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """LocalQueue `pool` on a ClusterQueue of the blue pool's flavor: (ClusterQueue, ResourceFlavor). The
    namespace's jobs, the ClusterQueue and the flavor are deleted afterwards (both are cluster-scoped)."""
    cq, flavor = apply_queue(kubectl, wait_for, namespace, "pool", pool_flavor)
    yield cq, flavor
    kubectl("delete", "-n", namespace, "ftj", "--all", "--wait=false")
    kubectl("delete", "clusterqueue", cq, "--ignore-not-found", "--wait=false")
    kubectl("delete", "resourceflavor", flavor, "--ignore-not-found", "--wait=false")


def test_admitted_pods_carry_their_flavors_node_labels_and_tolerations(
    operator: Path,
    kubectl: Any,
    kube_api: client.ApiClient,
    kubelet: Kubelet,
    namespace: str,
    wait_for: Any,
    explain: Any,
    pool_queue: tuple[str, str],
) -> None:
    """Kueue assigns the job's pod set to a flavor with nodeLabels, nodeTaints and tolerations: the pods get the
    labels in their node selector (beside the job's own) and the tolerations; the taints add nothing."""
    _, flavor = pool_queue
    with explain():
        ns = namespace
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("placed", "pool")))
        wl = wait_for(lambda: admitted(kube_api, ns, "placed"), timeout=120, message="placed admitted")
        [assignment] = wl["status"]["admission"]["podSetAssignments"]  # type: ignore[index]
        assert set(assignment["flavors"].values()) == {flavor}
        pods = wait_for(lambda: len(p := kubelet.live_pods("placed")) == 2 and p, timeout=120, message="placed's pods")
        for pod in pods:  # type: ignore[union-attr]
            assert pod.spec.node_selector == {**NO_KUBELET, **POOL_LABEL}
            tolerations = [kube_api.sanitize_for_serialization(t) for t in pod.spec.tolerations or []]
            assert tolerations.count(POOL_TOLERATION) == 1
            assert not [t for t in tolerations if t.get("key") == POOL_TAINT["key"] and t != POOL_TOLERATION]
        # The Workload still describes the job's own pod template: Kueue placed it, the pods carry it.
        [ps] = wl["spec"]["podSets"]  # type: ignore[index]
        assert ps["template"]["spec"]["nodeSelector"] == NO_KUBELET


def test_a_flavor_edited_to_contradict_the_jobs_selector_fails_it_at_its_next_pods(
    operator: Path,
    kubectl: Any,
    kube_api: client.ApiClient,
    kubelet: Kubelet,
    namespace: str,
    wait_for: Any,
    explain: Any,
    pool_queue: tuple[str, str],
) -> None:
    """Kueue assigns a job that selects pool=blue to the flavor of that pool. The flavor's nodeLabels are then
    edited to another pool (Kueue's webhook allows it): the running pods are left alone, but a group restart's
    pods would go where the job did not ask, so the job fails FlavorConflict, naming both, and its Workload is
    Finished to give the quota back (Kueue's own FailedToStart rule)."""
    _, flavor = pool_queue
    with explain():
        ns = namespace
        job = queued_job("edited", "pool")
        job["spec"]["hardware"]["nodeSelector"] = {**NO_KUBELET, **POOL_LABEL}
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(job))
        wait_for(lambda: len(kubelet.live_pods("edited")) == 2, timeout=120, message="edited's pods")
        for p in kubelet.live_pods("edited"):
            kubelet.set_status(p.metadata.name, "Running")
        wait_for(lambda: status(kube_api, ns, "edited").get("phase") == "Running", timeout=120, message="Running")
        kubectl(
            "patch",
            "resourceflavor",
            flavor,
            "--type=merge",
            "-p",
            '{"spec": {"nodeLabels": {"finetune.dev/test-pool": "red"}}}',
        )
        kubelet.set_status("edited-rank-1", "Failed", exit_code=1, message="boom")
        st = wait_for(
            lambda: (s := status(kube_api, ns, "edited")).get("phase") == "Failed" and s,
            timeout=120,
            message="edited Failed",
        )
        assert st["reason"] == "FlavorConflict", st  # type: ignore[index]
        msg = st["message"]  # type: ignore[index]
        assert "spec.hardware.nodeSelector sets finetune.dev/test-pool=blue" in msg
        assert f"ResourceFlavor(s) {flavor} with nodeLabels finetune.dev/test-pool=red" in msg
        wait_for(
            lambda: (condition(workload(kube_api, ns, "edited"), "Finished") or {}).get("status") == "True",
            timeout=120,
            message="edited's Workload Finished",
        )
        wait_for(lambda: kubelet.live_pods("edited") == [], timeout=120, message="no live pod")


def test_a_deactivated_workload_evicts_the_job_which_starts_again_when_reactivated(
    queue: str, kubectl: Any, kube_api: client.ApiClient, kubelet: Kubelet, namespace: str, wait_for: Any, explain: Any
) -> None:
    """Eviction by the real Kueue (spec.active: false on the Workload, as `kueuectl stop workload` does): the
    job's pods go, it is Queued with Kueue's reason, the operator releases the quota, nothing is orphaned, and
    it is admitted and started again (same Workload, restartCount untouched) once reactivated."""
    with explain():
        ns = namespace
        cq = f"cq-{namespace}"[:63]
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("evicted", queue)))
        wl = wait_for(lambda: admitted(kube_api, ns, "evicted"), timeout=120, message="evicted admitted")
        uid = wl["metadata"]["uid"]  # type: ignore[index]
        wait_for(lambda: len(kubelet.live_pods("evicted")) == 2, timeout=120, message="evicted's pods")
        for p in kubelet.live_pods("evicted"):
            kubelet.set_status(p.metadata.name, "Running")
        wait_for(lambda: status(kube_api, ns, "evicted").get("phase") == "Running", timeout=120, message="Running")

        kubectl(
            "patch",
            "-n",
            ns,
            "workloads.kueue.x-k8s.io",
            "evicted",
            "--type=merge",
            "-p",
            '{"spec": {"active": false}}',
        )
        # Acted on by the pass that the Workload's watch event wakes, well before the idle safety-net pass (a
        # running job's only timer) could have noticed: the pods are stopped and the job is Queued.
        st = wait_for(
            lambda: (s := status(kube_api, ns, "evicted")).get("phase") == "Queued" and s,
            timeout=IDLE_REQUEUE_S / 3,
            message="evicted Queued, from the Workload's watch event",
        )
        assert "deactivated" in st["message"], st  # type: ignore[index]
        wait_for(lambda: kubelet.pods("evicted") == [], timeout=120, message="evicted's pods gone")
        # The operator released the reservation (Kueue's contract for a stopped job); the ClusterQueue holds none.
        wait_for(
            lambda: not (workload(kube_api, ns, "evicted") or {}).get("status", {}).get("admission"),
            timeout=120,
            message="admission cleared",
        )
        wl = workload(kube_api, ns, "evicted")
        assert wl is not None and wl["metadata"]["uid"] == uid
        assert condition(wl, "QuotaReserved")["status"] == "False"  # type: ignore[index]
        assert condition(wl, "Evicted")["status"] == "True"  # type: ignore[index]
        reserving = "jsonpath={.status.reservingWorkloads}"
        wait_for(
            lambda: kubectl("get", "clusterqueue", cq, "-o", reserving).stdout in ("", "0"),
            timeout=120,
            message="the ClusterQueue's reservation released",
        )
        # Nothing orphaned: whatever still carries the job's labels is controlled by it.
        job_uid = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(*API, ns, "finetunejobs", "evicted")[
            "metadata"
        ]["uid"]
        left = yaml.safe_load(
            kubectl(
                "get",
                "-n",
                ns,
                "pods,services,configmaps,secrets,workloads.kueue.x-k8s.io",
                "-l",
                "finetune.dev/job-name=evicted",
                "-o",
                "yaml",
            ).stdout
        )["items"]
        assert left and all(
            [r["uid"] for r in o["metadata"]["ownerReferences"] if r.get("controller")] == [job_uid] for o in left
        ), left
        assert status(kube_api, ns, "evicted")["restartCount"] == 0

        kubectl(
            "patch", "-n", ns, "workloads.kueue.x-k8s.io", "evicted", "--type=merge", "-p", '{"spec": {"active": true}}'
        )
        wait_for(lambda: admitted(kube_api, ns, "evicted"), timeout=120, message="evicted admitted again")
        wait_for(lambda: len(kubelet.live_pods("evicted")) == 2, timeout=120, message="evicted's pods again")
        st = status(kube_api, ns, "evicted")
        assert st["phase"] in ("Pending", "Running") and st["restartCount"] == 0
        assert {c["type"]: c["status"] for c in st["conditions"]}["Queued"] == "False"
        assert workload(kube_api, ns, "evicted")["metadata"]["uid"] == uid  # type: ignore[index]


# Kueue's waitForPodsReady timeout in the test below: short, so that a job never marked PodsReady is evicted
# while the test watches (it was, in a loop, before the operator set the condition).
PODS_READY_TIMEOUT_S = 20


@contextlib.contextmanager
def kueue_waiting_for_pods_ready(kueue: KueueProcess) -> Iterator[None]:
    """Kueue restarted with waitForPodsReady on for the body, and back as it was afterwards."""
    kueue.stop()
    kueue.wait_for_pods_ready = f"{PODS_READY_TIMEOUT_S}s"
    try:
        kueue.start()
        yield
    finally:
        kueue.stop()
        kueue.wait_for_pods_ready = None
        kueue.start()


def never_evicted(api: client.ApiClient, ns: str, name: str, until: float) -> bool:
    """True once `until` (monotonic) has passed; fails at once if the Workload was evicted meanwhile."""
    evicted = condition(workload(api, ns, name), "Evicted")
    assert not evicted or evicted["status"] != "True", f"Workload {name} evicted: {evicted}"
    return time.monotonic() > until


def pods_ready(api: client.ApiClient, ns: str, name: str) -> tuple[str, str] | None:
    cond = condition(workload(api, ns, name), "PodsReady")
    return (cond["status"], cond["reason"]) if cond else None


def test_with_wait_for_pods_ready_a_job_is_pods_ready_restarts_and_succeeds_without_eviction(
    queue: str,
    kueue: KueueProcess,
    kubectl: Any,
    kube_api: client.ApiClient,
    kubelet: Kubelet,
    namespace: str,
    wait_for: Any,
    explain: Any,
) -> None:
    """Kueue's all-or-nothing setting evicts an admitted Workload that is not PodsReady within the timeout. The
    operator sets PodsReady as Kueue's own integrations do: True (Started) once every rank pod is Ready, False
    (WaitForRecovery) during a group restart, True (Recovered) again; the job runs to success, never evicted."""
    with kueue_waiting_for_pods_ready(kueue), explain():
        ns = namespace
        kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(queued_job("steady", queue)))
        wl = wait_for(lambda: admitted(kube_api, ns, "steady"), timeout=120, message="steady admitted")
        uid = wl["metadata"]["uid"]  # type: ignore[index]
        past_timeout = time.monotonic() + PODS_READY_TIMEOUT_S + 10
        wait_for(lambda: len(kubelet.live_pods("steady")) == 2, timeout=60, message="steady's pods")
        for p in kubelet.live_pods("steady"):
            kubelet.set_status(p.metadata.name, "Running")
        wait_for(
            lambda: pods_ready(kube_api, ns, "steady") == ("True", "Started"),
            timeout=60,
            message="PodsReady=True (Started) on the Workload",
        )
        wait_for(
            lambda: never_evicted(kube_api, ns, "steady", past_timeout),
            timeout=PODS_READY_TIMEOUT_S + 60,
            message="the PodsReady timeout passed without an eviction",
        )
        # A rank fails: the group restarts, PodsReady is False until the new attempt's pods are Ready.
        kubelet.set_status("steady-rank-1", "Failed", exit_code=1, message="boom")
        wait_for(
            lambda: pods_ready(kube_api, ns, "steady") == ("False", "WaitForRecovery"),
            timeout=60,
            message="PodsReady=False (WaitForRecovery) during the group restart",
        )
        pods = wait_for(
            lambda: (
                len(ps := [p for p in kubelet.live_pods("steady") if p.metadata.labels["finetune.dev/attempt"] == "1"])
                == 2
                and ps
            ),
            timeout=60,
            message="attempt 1's pods",
        )
        for p in pods:  # type: ignore[union-attr]
            kubelet.set_status(p.metadata.name, "Running")
        wait_for(
            lambda: pods_ready(kube_api, ns, "steady") == ("True", "Recovered"),
            timeout=60,
            message="PodsReady=True (Recovered)",
        )
        for p in pods:  # type: ignore[union-attr]
            kubelet.set_status(p.metadata.name, "Succeeded", exit_code=0, reason="Completed")
        wait_for(lambda: status(kube_api, ns, "steady").get("phase") == "Succeeded", timeout=60, message="Succeeded")
        wl = wait_for(
            lambda: (
                (w := workload(kube_api, ns, "steady"))
                and (condition(w, "Finished") or {}).get("status") == "True"
                and w
            ),
            timeout=60,
            message="steady's Workload Finished",
        )
        assert wl["metadata"]["uid"] == uid and (condition(wl, "Evicted") or {}).get("status") != "True"  # type: ignore[index]
        assert status(kube_api, ns, "steady")["restartCount"] == 1


def waiting_big_job(kubectl: Any, kube_api: client.ApiClient, ns: str, queue: str, wait_for: Any) -> None:
    """Job `big` (4 pods of 2 CPUs, more than the 6 CPUs of the test's ClusterQueue) applied in `queue`, once it is
    Queued and its Workload has no quota reserved."""
    big = queued_job("big", queue)
    big["spec"]["hardware"]["nodes"] = 4
    kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(big))
    wait_for(
        lambda: (
            status(kube_api, ns, "big").get("phase") == "Queued"
            and (condition(workload(kube_api, ns, "big"), "QuotaReserved") or {}).get("status") == "False"
        ),
        timeout=120,
        message=f"big Queued in {queue}, its Workload pending",
    )


def test_removing_the_queue_name_deletes_the_waiting_workload_and_the_job_runs_unqueued(
    queue: str, kubectl: Any, kube_api: client.ApiClient, kubelet: Kubelet, namespace: str, wait_for: Any, explain: Any
) -> None:
    """A job that no quota admits (4 pods of 2 CPUs against 6) has its queueName removed while waiting: its
    Workload goes, so Kueue can never admit it later and hold quota for a job that no longer waits for it."""
    with explain():
        ns = namespace
        waiting_big_job(kubectl, kube_api, ns, queue, wait_for)
        kubectl(
            "patch",
            "-n",
            ns,
            "ftj",
            "big",
            "--type=json",
            "-p",
            '[{"op": "remove", "path": "/spec/runPolicy/queueName"}]',
        )
        wait_for(lambda: workload(kube_api, ns, "big") is None, timeout=60, message="big's Workload deleted")
        wait_for(lambda: len(kubelet.live_pods("big")) == 4, timeout=60, message="big's pods, unqueued")
        cq = f"cq-{namespace}"[:63]
        pending = "jsonpath={.status.pendingWorkloads}"
        wait_for(
            lambda: kubectl("get", "clusterqueue", cq, "-o", pending).stdout in ("", "0"),
            timeout=60,
            message="nothing pending in the ClusterQueue",
        )


def test_a_queue_name_changed_while_waiting_moves_the_job_to_the_new_queue(
    queue: str, kubectl: Any, kube_api: client.ApiClient, kubelet: Kubelet, namespace: str, wait_for: Any, explain: Any
) -> None:
    """A job that its queue cannot admit (4 pods of 2 CPUs against 6) is moved to a LocalQueue whose ClusterQueue
    has room while it waits: its Workload is replaced by one in the new queue, which Kueue admits, and it runs."""
    with explain():
        ns = namespace
        cq = f"cq-big-{namespace}"[:63]
        objs = namespace_queues(cq, "lq-big", namespace, {"cpu": "16", "memory": "64Gi"})
        kubectl("apply", "-f", "-", input="\n---\n".join(job_yaml(o) for o in objs))
        try:
            waiting_big_job(kubectl, kube_api, ns, queue, wait_for)
            old = workload(kube_api, ns, "big")
            assert old is not None and old["spec"]["queueName"] == queue
            kubectl(
                "patch",
                "-n",
                ns,
                "ftj",
                "big",
                "--type=merge",
                "-p",
                '{"spec": {"runPolicy": {"queueName": "lq-big"}}}',
            )
            wait_for(
                lambda: (admitted(kube_api, ns, "big") or {}).get("spec", {}).get("queueName") == "lq-big",
                timeout=120,
                message="big's Workload replaced in lq-big and admitted",
            )
            now = workload(kube_api, ns, "big")
            assert now is not None and now["metadata"]["uid"] != old["metadata"]["uid"]
            wait_for(lambda: len(kubelet.live_pods("big")) == 4, timeout=60, message="big's pods after admission")
        finally:
            kubectl("delete", "-n", ns, "ftj", "big", "--ignore-not-found", "--wait=false")
            kubectl("delete", "clusterqueue", cq, "--ignore-not-found", "--wait=false")


def test_a_job_queued_after_kueue_came_after_the_operator_is_admitted_within_seconds(
    tmp_path: Path, wait_for: Any
) -> None:
    """A control plane of its own, without Kueue when the operator starts, so it does not watch Workloads (kopf
    would resolve them only on a CRD event that comes after discovery lists them, which may never come). Kueue's
    CRDs installed later: a queued job reads its Workload every few seconds, so an admission (written here as Kueue
    would) starts it well before the idle safety-net pass, without an operator restart; the log says a restart
    turns the watch on."""
    from cluster_support import make_kubectl
    from kubernetes import config as k8s_config

    from ftjob_cluster import bins
    from ftjob_cluster.localcluster import Etcd, KubeApiserver, KubeControllerManager, LocalCluster

    with LocalCluster(tmp_path / "cluster", [Etcd(), KubeApiserver(), KubeControllerManager()]) as cluster:
        own = make_kubectl(bins.ensure_binary("kubectl"), cluster.kubeconfig)
        install_crd(own, wait_for)
        api = k8s_config.new_client_from_config(str(cluster.kubeconfig))
        log = tmp_path / "operator.log"
        try:
            with running_operator(cluster.kubeconfig, wait_for, log):
                KueueProcess(cluster.kubeconfig, tmp_path / "kueue").install_crds()  # the API only
                own("create", "namespace", "late")
                wait_for(
                    lambda: own("get", "serviceaccount", "default", "-n", "late", check=False).returncode == 0,
                    timeout=60,
                    message="ServiceAccount default in late",
                )
                own("apply", "-n", "late", "-f", "-", input=job_yaml(queued_job("late", "lq")))
                wait_for(lambda: workload(api, "late", "late"), timeout=60, message="the job's Workload")
                now = "2026-12-03T00:00:00Z"
                client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
                    *KUEUE,
                    "late",
                    "workloads",
                    "late",
                    {
                        "status": {
                            "conditions": [
                                {"type": t, "status": "True", "reason": t, "message": t, "lastTransitionTime": now}
                                for t in ("QuotaReserved", "Admitted")
                            ],
                            "admission": {
                                "clusterQueue": "cq",
                                "podSetAssignments": [{"name": "rank", "count": 2, "flavors": {}}],
                            },
                        }
                    },
                )
                core = client.CoreV1Api(api)
                wait_for(
                    lambda: len(core.list_namespaced_pod("late").items) == 2,
                    timeout=IDLE_REQUEUE_S / 3,
                    message="the admitted job's pods, from the Workload read while queued",
                )
                assert "restart the operator after installing Kueue" in log.read_text(errors="replace")
        except BaseException:
            print(log.read_text(errors="replace")[-5000:])
            raise
        finally:
            api.close()


# -- spec.podTemplate: the Workload's priority and pod set metadata, read by the real Kueue ------------------------

TEMPLATE_META = {"labels": {"team": "nlp"}, "annotations": {"karpenter.sh/do-not-disrupt": "true"}}


def prioritized_job(name: str, queue: str, priority_class: str) -> dict[str, Any]:
    job = queued_job(name, queue)
    job["spec"]["podTemplate"] = {"metadata": TEMPLATE_META, "priorityClassName": priority_class}
    return job


def test_a_higher_priority_class_preempts_a_lower_one_through_the_workloads_priority(
    queue: str, kubectl: Any, kube_api: client.ApiClient, kubelet: Kubelet, namespace: str, wait_for: Any, explain: Any
) -> None:
    """spec.podTemplate.priorityClassName reaches the Workload as Kueue's own integrations put it there
    (priorityClassRef and the class's value as priority), with the template's labels and annotations on the pod
    sets; Kueue then preempts the lower-priority job for the higher one, which it could only do from that
    priority. A class that does not exist yet holds the Workload back, naming the field."""
    with explain():
        ns = namespace
        cq = f"cq-{namespace}"[:63]
        kubectl(
            "patch",
            "clusterqueue",
            cq,
            "--type=merge",
            "-p",
            '{"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}}',
        )
        scheduling = client.SchedulingV1Api(kube_api)
        low, high = f"{ns}-low"[:63], f"{ns}-high"[:63]
        try:
            scheduling.create_priority_class({"metadata": {"name": low}, "value": 100})
            kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(prioritized_job("low", queue, low)))
            wl = wait_for(lambda: admitted(kube_api, ns, "low"), timeout=120, message="low admitted")
            assert wl["spec"]["priority"] == 100  # type: ignore[index]
            assert wl["spec"]["priorityClassRef"] == {  # type: ignore[index]
                "group": "scheduling.k8s.io",
                "kind": "PriorityClass",
                "name": low,
            }
            [ps] = wl["spec"]["podSets"]  # type: ignore[index]
            assert ps["template"]["metadata"]["labels"] == TEMPLATE_META["labels"]
            assert ps["template"]["metadata"]["annotations"] == TEMPLATE_META["annotations"]
            assert ps["template"]["spec"]["priorityClassName"] == low
            wait_for(lambda: len(kubelet.live_pods("low")) == 2, timeout=120, message="low's pods")
            pods = kubelet.live_pods("low")
            for p in pods:
                # The Priority admission plugin resolved the class on the pod, as on the Workload.
                assert p.spec.priority_class_name == low and p.spec.priority == 100
                assert p.metadata.labels["team"] == "nlp"
                assert p.metadata.annotations["karpenter.sh/do-not-disrupt"] == "true"
                kubelet.set_status(p.metadata.name, "Running")
            wait_for(lambda: status(kube_api, ns, "low").get("phase") == "Running", timeout=120, message="low Running")

            # The higher class does not exist yet: no Workload, and the job says why.
            kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(prioritized_job("high", queue, high)))
            st = wait_for(
                lambda: (s := status(kube_api, ns, "high")).get("reason") == "PriorityClassNotFound" and s,
                timeout=120,
                message="high waits for its PriorityClass",
            )
            assert "spec.podTemplate.priorityClassName" in st["message"]  # type: ignore[index]
            assert workload(kube_api, ns, "high") is None and status(kube_api, ns, "low")["phase"] == "Running"
            scheduling.create_priority_class({"metadata": {"name": high}, "value": 1000})
            wl = wait_for(
                lambda: workload(kube_api, ns, "high"), timeout=60, message="high's Workload once its class exists"
            )
            assert wl["spec"]["priority"] == 1000  # type: ignore[index]
            # The quota fits one job: Kueue evicts the lower priority's Workload, whose pods the operator stops.
            wait_for(lambda: admitted(kube_api, ns, "high"), timeout=120, message="high admitted by preemption")
            evicted = condition(workload(kube_api, ns, "low"), "Evicted")
            assert evicted and evicted["status"] == "True" and evicted["reason"] == "Preempted", evicted
            wait_for(lambda: status(kube_api, ns, "low").get("phase") == "Queued", timeout=120, message="low Queued")
            wait_for(lambda: kubelet.live_pods("low") == [], timeout=120, message="low's pods gone")
            wait_for(lambda: len(kubelet.live_pods("high")) == 2, timeout=120, message="high's pods")
        finally:
            for name in (low, high):
                kubectl("delete", "priorityclass", name, "--ignore-not-found")
