"""The chart's RBAC equals what the operator is seen to do: derived from the API server's audit log, not from a
hand-copied list.

A control plane of its own records every request of one user (the operator's identity here), bound to the
ClusterRoles the chart renders. The real operator then runs every path that talks to the API:
- a torchrun job through create, Running (progress read from rank 0's log), a rank failure and group restart,
  success and TTL deletion, with its NetworkPolicy (networkPolicy.enabled);
- an MPI job (its SSH Secret), and an operator restart while it exists (the new loop meets the Secret's 409 and
  reads it back);
- jobs whose child names are squatted by unlabelled objects of each kind (the 409 read-back that refuses to adopt);
- a namespaced-mode operator (`--namespace`: kopf reads namespaces);
- a job queued through Kueue (its Workload created and watched; admitted here by a status write standing in for
  Kueue, which test_kueue.py runs for real; the admission's ResourceFlavor read; PodsReady and Finished set),
  with spec.podTemplate.priorityClassName (its PriorityClass read for the Workload's priority);
- children whose managed-by label someone removed (a pod, the Service, the ConfigMap, the NetworkPolicy, a
  Workload): the create's 409 is read back and the labels patched back;
- a queued job whose queueName is removed: its Workload deleted;
- every run with the chart's leader election (`--leader-elect`, the pod's namespace being the release's): the
  first operator creates the Lease and renews it, each hands it over when stopped, the next reads and takes it.
The (group, resource, verb) triples in the log must equal the rendered grants: a grant never used fails, and so
does a use never granted."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Kubectl, make_kubectl
from failover_support import elected_operator
from kubernetes import client, config
from operator_support import API, NO_KUBELET, Kubelet, install_crd, job_yaml, two_rank_job

from ftjob_cluster import bins
from ftjob_cluster.auditlog import Permission, permissions_used, policy_for_user
from ftjob_cluster.kueue import KueueProcess
from ftjob_cluster.localcluster import Etcd, KubeApiserver, KubeControllerManager, LocalCluster, wait_for

ROOT = Path(__file__).resolve().parents[2]

USER = "audited-operator"
RELEASE_NS = "finetune-operator"  # the chart's release namespace: its leader-election Role is there
CHART = ROOT / "charts" / "finetune-operator"


def rendered_roles(*args: str) -> list[dict[str, Any]]:
    """ClusterRoles and Roles of `helm template` with these flags."""
    out = subprocess.run(
        [str(bins.ensure_binary("helm")), "template", *args, str(CHART)], check=True, capture_output=True, text=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] in ("ClusterRole", "Role")]


def grants(roles: list[dict[str, Any]]) -> set[Permission]:
    return {
        (group, resource, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@dataclass
class Audited:
    kubectl: Kubectl
    api: client.ApiClient
    operator_kubeconfig: Path
    log: Path
    work: Path
    granted: set[Permission]

    def used(self) -> set[Permission]:
        return permissions_used(self.log, USER)


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audited]:
    work = tmp_path_factory.mktemp("rbac-audit")
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(policy_for_user(USER)))
    log = work / "audit.log"
    apiserver = KubeApiserver(
        [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]
    )
    with LocalCluster(work / "cluster", [Etcd(), apiserver, KubeControllerManager()]) as cluster:
        kubectl = make_kubectl(bins.ensure_binary("kubectl"), cluster.kubeconfig)
        install_crd(kubectl, wait_for)
        KueueProcess(cluster.kubeconfig, work / "kueue").install_crds()  # the Workload API, without Kueue
        cluster_mode = rendered_roles(
            "finetune-operator", "--namespace", RELEASE_NS, "--set", "networkPolicy.enabled=true"
        )
        namespaced = [
            r
            for r in rendered_roles("nsmode", "--namespace", RELEASE_NS, "--set", "watchNamespaces={audit-ns}")
            if r["kind"] == "ClusterRole"
        ]
        kubectl("create", "namespace", RELEASE_NS)  # the leader election's Role and Lease live there
        for role in cluster_mode + namespaced:
            kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
            name = role["metadata"]["name"]
            if role["kind"] == "Role":
                ns = role["metadata"]["namespace"]
                kubectl("create", "rolebinding", f"audit-{name}", "-n", ns, f"--role={name}", f"--user={USER}")
            else:
                kubectl("create", "clusterrolebinding", f"audit-{name}", f"--clusterrole={name}", f"--user={USER}")
        assert cluster.ctx is not None
        api = config.new_client_from_config(str(cluster.kubeconfig))
        try:
            yield Audited(
                kubectl,
                api,
                cluster.ctx.write_kubeconfig("audited-operator", USER),
                log,
                work,
                grants(cluster_mode + namespaced),
            )
        finally:
            api.close()


def namespace(a: Audited, name: str) -> str:
    core = client.CoreV1Api(a.api)
    core.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=60,
        message=f"ServiceAccount default in {name}",
    )
    return name


def status(a: Audited, ns: str, name: str) -> dict[str, Any]:
    try:
        job = client.CustomObjectsApi(a.api).get_namespaced_custom_object(*API, ns, "finetunejobs", name)
    except client.exceptions.ApiException as e:
        if e.status == 404:
            return {"gone": True}
        raise
    return dict(job.get("status") or {})


def phase_is(a: Audited, ns: str, name: str, phase: str) -> Callable[[], bool]:
    return lambda: status(a, ns, name).get("phase") == phase


# What kopf put on every job while the operator's daemon asked for a finalizer (before this operator version).
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def apply(a: Audited, ns: str, job: dict[str, Any]) -> None:
    a.kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(job))


def squat(a: Audited, ns: str) -> list[str]:
    """Unlabelled objects (invisible to the operator's label-filtered watches) that take one child name of one
    job each: the create meets a 409, reads the object back and refuses it."""
    core, net = client.CoreV1Api(a.api), client.NetworkingV1Api(a.api)
    core.create_namespaced_service(ns, {"metadata": {"name": "sq-svc"}, "spec": {"ports": [{"port": 80}]}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "sq-cm-config"}})
    net.create_namespaced_network_policy(ns, {"metadata": {"name": "sq-np"}, "spec": {"podSelector": {}}})
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "sq-pod-rank-0"},
            "spec": {"nodeSelector": NO_KUBELET, "containers": [{"name": "c", "image": "registry.test/x:1"}]},
        },
    )
    jobs = ["sq-svc", "sq-cm", "sq-np", "sq-pod"]
    for name in jobs:
        apply(a, ns, two_rank_job(name))
    return jobs


def audited_operator(a: Audited, log: Path, *args: str) -> Any:
    """The operator as the chart runs it: elected, in the release namespace (tests/support/failover_support.py)."""
    return elected_operator(
        a.operator_kubeconfig,
        wait_for,
        log,
        identity=log.stem,
        namespace=RELEASE_NS,
        lease="finetune-operator",
        extra=list(args),
    )


def test_rbac_grants_exactly_what_the_operator_uses(audited: Audited, tmp_path: Path) -> None:
    a = audited
    ns = namespace(a, "audit-ns")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True}}))
    kubelet = Kubelet(a.api, ns)
    try:
        with audited_operator(a, tmp_path / "operator-1.log", "--config", str(cfg)):
            # A torchrun job's whole life: create, run (progress read), a rank fails, the group restarts, done,
            # and deleted by its TTL.
            apply(a, ns, two_rank_job("life", backoffLimit=1, ttlSecondsAfterFinished=0))
            wait_for(lambda: len(kubelet.live_pods("life")) == 2, timeout=60, message="pods of life")
            for pod in ("life-rank-0", "life-rank-1"):
                kubelet.set_status(pod, "Running")
            wait_for(phase_is(a, ns, "life", "Running"), timeout=60, message="life Running")
            wait_for(lambda: ("", "pods/log", "get") in a.used(), timeout=60, message="rank 0's log read")
            kubelet.set_status("life-rank-1", "Failed", exit_code=1, message="boom")
            wait_for(lambda: status(a, ns, "life").get("restartCount") == 1, timeout=60, message="restart")
            wait_for(
                lambda: (
                    len([p for p in kubelet.live_pods("life") if p.metadata.labels["finetune.dev/attempt"] == "1"]) == 2
                ),
                timeout=60,
                message="attempt 1 pods",
            )
            for pod in ("life-rank-0", "life-rank-1"):
                kubelet.set_status(pod, "Succeeded", exit_code=0, reason="Completed")
            wait_for(lambda: status(a, ns, "life").get("gone"), timeout=60, message="life deleted by its TTL")
            # An MPI job: its SSH Secret.
            apply(a, ns, two_rank_job("mpi", mpi=True))
            wait_for(lambda: len(kubelet.live_pods("mpi")) == 3, timeout=60, message="pods of mpi")
            # A queued job: Workload created and read while queued, status patched Finished at the end.
            # With spec.podTemplate.priorityClassName: the operator reads the class (cluster-scoped) for the
            # Workload's priority. Its pods carry the class, so the Priority admission plugin needs it too.
            client.SchedulingV1Api(a.api).create_priority_class(
                {"metadata": {"name": "audit-high"}, "value": 1000, "description": "rbac audit"}
            )
            queued = two_rank_job("queued", queueName="lq")
            queued["spec"]["podTemplate"] = {"priorityClassName": "audit-high"}
            apply(a, ns, queued)
            wl_api = ("kueue.x-k8s.io", "v1beta2", ns, "workloads", "queued")
            custom = client.CustomObjectsApi(a.api)
            wait_for(lambda: custom.get_namespaced_custom_object(*wl_api), timeout=60, message="queued's Workload")
            # Its admission names a ResourceFlavor, which the operator reads (cluster-scoped) for the pods.
            custom.create_cluster_custom_object(
                "kueue.x-k8s.io",
                "v1beta2",
                "resourceflavors",
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "ResourceFlavor",
                    "metadata": {"name": "default"},
                    "spec": {"nodeLabels": {"pool": "audit"}},
                },
            )
            now = "2026-12-03T00:00:00Z"
            custom.patch_namespaced_custom_object_status(
                *wl_api,
                {
                    "status": {
                        "conditions": [
                            {"type": t, "status": "True", "reason": t, "message": t, "lastTransitionTime": now}
                            for t in ("QuotaReserved", "Admitted")
                        ],
                        "admission": {
                            "clusterQueue": "cq",
                            "podSetAssignments": [
                                {
                                    "name": "rank",
                                    "count": 2,
                                    "flavors": {"cpu": "default", "memory": "default"},
                                    "resourceUsage": {"cpu": "4", "memory": "8Gi"},
                                }
                            ],
                        },
                    }
                },
            )
            wait_for(lambda: len(kubelet.live_pods("queued")) == 2, timeout=60, message="pods of queued")
            assert all(p.spec.node_selector["pool"] == "audit" for p in kubelet.live_pods("queued"))
            for pod in ("queued-rank-0", "queued-rank-1"):
                kubelet.set_status(pod, "Succeeded", exit_code=0, reason="Completed")
            wait_for(
                lambda: ("kueue.x-k8s.io", "workloads/status", "patch") in a.used(),
                timeout=60,
                message="queued's Workload marked Finished",
            )
            # Labels edited away: each child leaves the operator's watch, the create that follows meets a 409 and
            # patches the labels back (pods, services, configmaps, networkpolicies, workloads: patch).
            apply(a, ns, two_rank_job("tamper", queueName="lq"))
            wl_tamper = ("kueue.x-k8s.io", "v1beta2", ns, "workloads", "tamper")
            wait_for(lambda: custom.get_namespaced_custom_object(*wl_tamper), timeout=60, message="tamper's Workload")
            unlabel = "app.kubernetes.io/managed-by-"
            a.kubectl("label", "-n", ns, "workloads.kueue.x-k8s.io", "tamper", unlabel)
            wait_for(
                lambda: (
                    "app.kubernetes.io/managed-by"
                    in custom.get_namespaced_custom_object(*wl_tamper)["metadata"]["labels"]
                ),
                timeout=60,
                message="tamper's Workload relabelled",
            )
            # Its queue removed: the Workload goes (workloads: delete) and the job runs unqueued.
            a.kubectl(
                "patch",
                "-n",
                ns,
                "ftj",
                "tamper",
                "--type=json",
                "-p",
                '[{"op": "remove", "path": "/spec/runPolicy/queueName"}]',
            )
            wait_for(
                lambda: ("kueue.x-k8s.io", "workloads", "delete") in a.used(), timeout=60, message="Workload deleted"
            )
            wait_for(lambda: len(kubelet.live_pods("tamper")) == 2, timeout=60, message="pods of tamper")
            wait_for(
                lambda: a.kubectl("get", "-n", ns, "networkpolicy", "tamper", check=False).returncode == 0,
                timeout=60,
                message="tamper's NetworkPolicy",
            )
            for kind, name in (
                ("pod", "tamper-rank-0"),
                ("service", "tamper"),
                ("configmap", "tamper-config"),
                ("networkpolicy", "tamper"),
            ):
                a.kubectl("label", "-n", ns, kind, name, unlabel)
                wait_for(
                    lambda k=kind, n=name: (
                        "app.kubernetes.io/managed-by"
                        in a.kubectl("get", "-n", ns, k, n, "-o", "jsonpath={.metadata.labels}").stdout
                    ),
                    timeout=60,
                    message=f"{kind} {name} relabelled",
                )
            jobs = squat(a, ns)
            for name in jobs:
                wait_for(
                    lambda n=name: "not controlled by" in status(a, ns, n).get("message", ""),
                    timeout=60,
                    message=f"{name}'s squatted child refused",
                )
            # A job an earlier operator put its daemon's finalizer on: kopf takes it off (patch), so that the
            # job's deletion does not wait for it forever.
            legacy = two_rank_job("legacy")
            legacy["metadata"]["finalizers"] = [KOPF_FINALIZER]
            apply(a, ns, legacy)
            wait_for(
                lambda: (
                    not custom.get_namespaced_custom_object("finetune.dev", "v1alpha1", ns, "finetunejobs", "legacy")[
                        "metadata"
                    ].get("finalizers")
                ),
                timeout=60,
                message="the old finalizer removed",
            )
        # A restarted operator: a new loop for the MPI job creates its Secret again and reads the 409 back.
        with audited_operator(a, tmp_path / "operator-2.log", "--config", str(cfg)):
            wait_for(lambda: ("", "secrets", "get") in a.used(), timeout=60, message="the Secret read back")
        # Namespaced mode: kopf watches the namespaces it is given.
        with audited_operator(a, tmp_path / "operator-3.log", "--config", str(cfg), f"--namespace={ns}"):
            wait_for(lambda: ("", "namespaces", "watch") in a.used(), timeout=60, message="namespaces watched")
        # Each operator handed the lease over when it was stopped (a PUT), and the next one took it (a GET, a PUT).
        wait_for(
            lambda: {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")} <= a.used(),
            timeout=60,
            message="the Lease created, read and updated",
        )
    finally:
        kubelet.stop()

    used = a.used()
    assert not used - a.granted, f"used but not granted (the chart's RBAC lacks them): {sorted(used - a.granted)}"
    assert not a.granted - used, f"granted but never used (remove from the chart): {sorted(a.granted - used)}"
