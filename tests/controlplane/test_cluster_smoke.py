"""Proves the control plane is the real thing: pinned version, CEL validation of a CRD, the scheduler
binding a pod, garbage collection by owner reference, and namespace finalization."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster_support import Cluster, Kubectl, KubectlError, Wait
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ftjob_cluster import bins


def _absent(read: Callable[[], object]) -> bool:
    """True once `read` answers 404 (the object is gone)."""
    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def test_server_version_is_the_pin(cluster: Cluster, kubectl: Kubectl) -> None:
    server = json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]
    if not cluster.local:
        pytest.skip(f"external cluster runs {server['gitVersion']}; the pin applies to the local one")
    assert server["gitVersion"] == bins.K8S_VERSION


def test_every_component_is_healthy(cluster: Cluster, kubectl: Kubectl) -> None:
    readyz = kubectl("get", "--raw", "/readyz?verbose").stdout
    assert "readyz check passed" in readyz
    # The RBAC bootstrap hook having run means the apiserver finished its post-start work.
    assert "[+]poststarthook/rbac/bootstrap-roles ok" in readyz
    if cluster.local:
        assert set(cluster.logs) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
        assert all(isinstance(p, Path) and p.exists() for p in cluster.logs.values())


@pytest.fixture(scope="session")
def widget_crd(kube_api: k8s_client.ApiClient, wait_for: Wait) -> Iterator[str]:
    """A namespaced CRD with a CEL rule; unique group per run so a kept cluster never collides.

    Session-scoped on purpose: deleting a CRD stalls the garbage collector until its next 30 s discovery
    resync, which would slow every later test that waits for garbage collection (docs/cluster.md)."""
    ext = k8s_client.ApiextensionsV1Api(kube_api)
    group = f"g{uuid.uuid4().hex[:8]}.smoke.ftjob.test"
    name = f"widgets.{group}"
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "minReplicas": {"type": "integer"},
                                        "replicas": {"type": "integer"},
                                    },
                                    "x-kubernetes-validations": [
                                        {
                                            "rule": "self.replicas >= self.minReplicas",
                                            "message": "replicas must be at least minReplicas",
                                            "fieldPath": ".replicas",
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(body)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(name)
        conds = crd.status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    wait_for(established, timeout=60, message=f"CRD {name} Established")
    try:
        yield group
    finally:
        ext.delete_custom_resource_definition(name)


def test_crd_cel_rule_rejects_bad_object(widget_crd: str, namespace: str, kubectl: Kubectl) -> None:
    def widget(name: str, replicas: int) -> str:
        return json.dumps(
            {
                "apiVersion": f"{widget_crd}/v1",
                "kind": "Widget",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"minReplicas": 2, "replicas": replicas},
            }
        )

    # The good object first: it proves the type is served, so the bad one's failure can only be the rule.
    kubectl("apply", "-f", "-", input=widget("good", 3))
    with pytest.raises(KubectlError) as err:
        kubectl("apply", "-f", "-", input=widget("bad", 1))
    assert "spec.replicas" in err.value.stderr
    assert "replicas must be at least minReplicas" in err.value.stderr
    assert kubectl("get", f"widgets.{widget_crd}", "-n", namespace, "-o", "name").stdout.split() == [
        f"widget.{widget_crd}/good"
    ]


def test_scheduler_binds_pod_to_node(kube_api: k8s_client.ApiClient, namespace: str, wait_for: Wait) -> None:
    """No kubelet runs, so a Node object is made through the API; the scheduler must bind a pod to it."""
    core = k8s_client.CoreV1Api(kube_api)
    node_name = f"fake-node-{uuid.uuid4().hex[:6]}"
    core.create_node(
        k8s_client.V1Node(metadata=k8s_client.V1ObjectMeta(name=node_name, labels={"ftjob.test/fake": node_name}))
    )
    try:
        # Capacity lives in status, which only the status subresource sets.
        capacity = {"cpu": "4", "memory": "8Gi", "pods": "10"}
        core.patch_node_status(
            node_name,
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Test", "message": "fake"}],
                }
            },
        )
        pod = k8s_client.V1Pod(
            metadata=k8s_client.V1ObjectMeta(name="sched-probe"),
            spec=k8s_client.V1PodSpec(
                # On kind, real nodes exist too: the selector makes the fake node the only fit. The fake
                # node gets not-ready/unreachable taints from the node lifecycle controller (no kubelet
                # heartbeats), hence tolerate everything.
                node_selector={"ftjob.test/fake": node_name},
                tolerations=[k8s_client.V1Toleration(operator="Exists")],
                containers=[
                    k8s_client.V1Container(
                        name="c",
                        image="registry.invalid/none:0",
                        resources=k8s_client.V1ResourceRequirements(requests={"cpu": "1", "memory": "1Gi"}),
                    )
                ],
            ),
        )
        core.create_namespaced_pod(namespace, pod)

        def bound() -> bool:
            p = core.read_namespaced_pod("sched-probe", namespace)
            conds = p.status.conditions or []
            scheduled = any(c.type == "PodScheduled" and c.status == "True" for c in conds)
            return bool(p.spec.node_name == node_name and scheduled)

        wait_for(bound, timeout=60, message=f"pod bound to {node_name}")
    finally:
        core.delete_namespaced_pod("sched-probe", namespace, grace_period_seconds=0)
        core.delete_node(node_name)


def test_garbage_collector_deletes_owned_child(kube_api: k8s_client.ApiClient, namespace: str, wait_for: Wait) -> None:
    core = k8s_client.CoreV1Api(kube_api)
    parent = core.create_namespaced_config_map(
        namespace, k8s_client.V1ConfigMap(metadata=k8s_client.V1ObjectMeta(name="parent"))
    )
    owner = k8s_client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="parent", uid=parent.metadata.uid, block_owner_deletion=True
    )
    core.create_namespaced_config_map(
        namespace,
        k8s_client.V1ConfigMap(
            metadata=k8s_client.V1ObjectMeta(name="child", owner_references=[owner]), data={"k": "v"}
        ),
    )
    unowned = core.create_namespaced_config_map(
        namespace, k8s_client.V1ConfigMap(metadata=k8s_client.V1ObjectMeta(name="bystander"))
    )
    # Background propagation: the apiserver deletes the parent at once, the GC controller the child later.
    core.delete_namespaced_config_map("parent", namespace, propagation_policy="Background")
    wait_for(
        lambda: _absent(lambda: core.read_namespaced_config_map("child", namespace)),
        timeout=90,
        message="garbage collection of ConfigMap child",
    )
    still = core.read_namespaced_config_map("bystander", namespace)
    assert still.metadata.uid == unowned.metadata.uid


def test_namespace_deletion_finalizes(kube_api: k8s_client.ApiClient, wait_for: Wait) -> None:
    core = k8s_client.CoreV1Api(kube_api)
    name = f"t-finalize-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s_client.V1Namespace(metadata=k8s_client.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(
        name, k8s_client.V1ConfigMap(metadata=k8s_client.V1ObjectMeta(name="content"), data={"a": "b"})
    )
    core.delete_namespace(name)
    ns = core.read_namespace(name)
    # The namespace controller, not the apiserver, empties it and removes the `kubernetes` finalizer.
    assert ns.status.phase == "Terminating"
    assert "kubernetes" in (ns.spec.finalizers or [])
    wait_for(lambda: _absent(lambda: core.read_namespace(name)), timeout=90, message=f"namespace {name} gone")
