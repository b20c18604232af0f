"""The nodes' build inputs and image plumbing, without starting a node (runs wherever the tier is collected); then,
on the session's two-node cluster, the nodes' identities, their network, and the node-fault tooling the
reliability tests use: `node.kill_node` / `node.restart_node` (an instance dies and comes back) and
`node.drain_node` (kubectl drain through the eviction API)."""

from __future__ import annotations

import io
import ipaddress
import json
import re
import tarfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from cluster_support import Kubectl
from conftest import NODE_MONITOR_GRACE_S, PULL_SECRET, NodeCluster, Release, delete_namespace

from ftjob_cluster import bins, node
from ftjob_cluster.localcluster import wait_for


def _tool_block(go_mod: str) -> set[str]:
    block = re.search(r"^tool \((.*?)^\)", go_mod, re.S | re.M)
    if block:
        return {line.strip() for line in block.group(1).splitlines() if line.strip()}
    return set(re.findall(r"^tool (\S+)$", go_mod, re.M))


def test_each_go_build_group_is_pinned_by_its_modules_tool_block() -> None:
    for build in bins.go_builds().values():
        tools = _tool_block((build.module / "go.mod").read_text())
        wanted = {p for p in build.packages.values() if not p.startswith("./")}
        assert wanted == tools, f"{build.module}/go.mod tool block {tools} != bins.py {wanted}"


def test_node_groups_leave_the_control_plane_stamp_alone() -> None:
    # The control plane's digest reads only its own module: node pieces never force its rebuild.
    builds = bins.go_builds()
    assert builds["control-plane"].module != builds["node"].module != builds["coredns"].module
    assert bins.go_inputs_digest("control-plane") != bins.go_inputs_digest("node")
    assert {"kubelet", "kube-proxy", "coredns"} <= set(bins.tool_names())


def test_pause_archive_is_a_docker_save_tarball() -> None:
    data = node._docker_archive({"pause": (b"\x7fELF", 0o755)}, node.PAUSE_IMAGE, {"Entrypoint": ["/pause"]})
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        manifest = json.loads(t.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert manifest[0]["RepoTags"] == [node.PAUSE_IMAGE]
        config = json.loads(t.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
        with tarfile.open(fileobj=t.extractfile(manifest[0]["Layers"][0])) as layer:
            assert layer.getmember("pause").mode == 0o755
    assert config["config"]["Entrypoint"] == ["/pause"]


# --- the two nodes, and the node-fault tooling (kill_node, restart_node, drain_node), on the live cluster -----


@pytest.fixture
def scratch_ns(kubectl: Kubectl) -> Iterator[str]:
    """A namespace of the test's own (no Pod Security level: the pause image runs as its own user)."""
    name = f"nodes-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    wait_for(lambda: kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0, timeout=60)
    try:
        yield name
    finally:
        delete_namespace(kubectl, name)


def _pinned(
    name: str, node_name: str, image: str, command: list[str] | None = None, pull_secret: str | None = None
) -> dict[str, Any]:
    """A one-replica Deployment whose pod runs on `node_name` only (a controller: kubectl drain evicts it). With
    `pull_secret`, its image is pulled from the registry with it; without, it must be on the node already."""
    pull = "IfNotPresent" if pull_secret else "Never"
    container: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": pull}
    if command:
        container |= {
            "command": command,
            "ports": [{"containerPort": 8080}],
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node_name},
                    **({"imagePullSecrets": [{"name": pull_secret}]} if pull_secret else {}),
                    "terminationGracePeriodSeconds": 2,
                    "containers": [container],
                },
            },
        },
    }


def _pods(kubectl: Kubectl, ns: str, app: str) -> list[dict[str, Any]]:
    out = kubectl("-n", ns, "get", "pods", "-l", f"app={app}", "-o", "json")
    return list(json.loads(out.stdout)["items"])


def _ready_pod(kubectl: Kubectl, ns: str, app: str, timeout: float = 180) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        for p in _pods(kubectl, ns, app):
            conds = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}
            if not p["metadata"].get("deletionTimestamp") and conds.get("Ready") == "True":
                return p
        return None

    return dict(wait_for(ready, timeout=timeout, message=f"a Ready pod of {app}"))  # type: ignore[arg-type]


def _node(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("get", "node", name, "-o", "json").stdout))


def _ready_status(node_obj: dict[str, Any]) -> str:
    return next(c["status"] for c in node_obj["status"]["conditions"] if c["type"] == "Ready")


def test_two_nodes_each_with_its_own_identity(node_cluster: NodeCluster, kubectl: Kubectl) -> None:
    nodes = [_node(kubectl, n) for n in node_cluster.nodes]
    assert [n["metadata"]["name"] for n in nodes] == [node.NODE_A.name, node.NODE_B.name]
    assert all(_ready_status(n) == "True" for n in nodes), [n["status"]["conditions"] for n in nodes]
    # Ready since they registered: the shortened node-monitor grace period (NODE_MONITOR_GRACE_S) never took a live
    # node for lost while the tests before this one (training jobs on both nodes) loaded the machine.
    for n in nodes:
        ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
        since = datetime.fromisoformat(ready["lastTransitionTime"]) - datetime.fromisoformat(
            n["metadata"]["creationTimestamp"]
        )
        assert since.total_seconds() < 60, (n["metadata"]["name"], ready, n["metadata"]["creationTimestamp"])
    zones = [n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes]
    assert zones == [node.NODE_A.zone, node.NODE_B.zone] and len(set(zones)) == 2
    ips = [next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP") for n in nodes]
    assert ips == [node.NODE_A.ip, node.NODE_B.ip]
    # Each node's own containerd answers on its own socket, and runs only its own node's pods.
    for spec in (node.NODE_A, node.NODE_B):
        assert node.ctr("version", node=spec).returncode == 0
    assert node.NODE_A.containerd_sock != node.NODE_B.containerd_sock


def test_leftovers_names_every_host_change_of_both_nodes_while_they_run(node_cluster: NodeCluster) -> None:
    """The check the session's teardown relies on (an empty list after cluster-down) sees each kind of change
    the two nodes make while they run: were one missing from leftovers(), its teardown would go unchecked."""
    found = "\n".join(node.leftovers(node_cluster.cluster.directory))
    b = node.NODE_B
    assert b.netns is not None and b.cgroup_root is not None
    for expected in (
        f"interface {node.DUMMY_IF}",
        f"interface {b.netns.host_if}",
        f"route {b.pod_cidr} via {b.ip}",
        f"route blackhole {node.NODE_NET}",
        f"-N {node.NODES_CHAIN}",
        f"-N {node.EGRESS_CHAIN}",
        f"mount {b.netns_file}",
        f"mount {b.mntns_file}",
        f"cgroup /sys/fs/cgroup/freezer{b.cgroup_root}",
        f"cgroup /sys/fs/cgroup/memory{b.cgroup_root}",
        f"path {b.run_dir}",
        f"path {node.NODE_A.run_dir}",
    ):
        assert expected in found, f"{expected!r} not in leftovers():\n{found}"


def test_pods_on_the_two_nodes_reach_each_other_by_pod_ip_and_service_name(
    node_cluster: NodeCluster, kubectl: Kubectl, scratch_ns: str, runtime_image: str, release: Release
) -> None:
    ns = scratch_ns
    kubectl("apply", "-f", "-", input=json.dumps(release.pull_secret(ns)))
    serve = ["python3", "-m", "http.server", "8080", "--directory", "/etc"]
    for app, where in (("on-a", node.NODE_A.name), ("on-b", node.NODE_B.name)):
        pinned = _pinned(app, where, runtime_image, serve, pull_secret=PULL_SECRET)
        kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(pinned))
        kubectl("-n", ns, "expose", "deployment", app, "--port=8080")
    pods = {app: _ready_pod(kubectl, ns, app) for app in ("on-a", "on-b")}
    assert {a: p["spec"]["nodeName"] for a, p in pods.items()} == {"on-a": node.NODE_A.name, "on-b": node.NODE_B.name}
    for src, dst in (("on-a", "on-b"), ("on-b", "on-a")):
        ip = pods[dst]["status"]["podIP"]
        subnet = ipaddress.ip_network(node.node_spec(pods[dst]["spec"]["nodeName"]).pod_cidr)
        assert ipaddress.ip_address(ip) in subnet, (ip, subnet)
        for target in (ip, f"{dst}.{ns}.svc"):  # by pod IP; by Service name (CoreDNS, then kube-proxy's DNAT)
            fetch = f"import urllib.request; print(urllib.request.urlopen('http://{target}:8080/hostname').read())"
            out = kubectl("-n", ns, "exec", pods[src]["metadata"]["name"], "--", "python3", "-c", fetch, timeout=60)
            assert pods[dst]["metadata"]["name"] in out.stdout, (src, target, out.stdout, out.stderr)


def test_drain_evicts_through_the_eviction_api(node_cluster: NodeCluster, kubectl: Kubectl, scratch_ns: str) -> None:
    """drain_node cordons node B and evicts its pods through the eviction API: a PodDisruptionBudget that allows
    no disruption stops it (a plain delete would not), and once the budget is gone the pod is evicted and its
    replacement waits for a node it may run on."""
    ns, b = scratch_ns, node.NODE_B.name
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(_pinned("drained", b, node.PAUSE_IMAGE)))
    first = _ready_pod(kubectl, ns, "drained")
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "drained"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "drained"}}},
    }
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(pdb))
    wait_for(
        lambda: (
            json.loads(kubectl("-n", ns, "get", "pdb", "drained", "-o", "json").stdout)
            .get("status", {})
            .get("currentHealthy")
            == 1
        ),
        timeout=60,
        message="the budget counts the pod",
    )
    try:
        blocked = node.drain_node(node_cluster.kubeconfig, b, timeout_s=12, check=False)
        assert blocked.returncode != 0 and "disruption budget" in blocked.stderr, blocked.stderr[-2000:]
        assert _node(kubectl, b)["spec"].get("unschedulable") is True  # cordoned first
        assert [p["metadata"]["uid"] for p in _pods(kubectl, ns, "drained")] == [first["metadata"]["uid"]]
        kubectl("-n", ns, "delete", "pdb", "drained")
        drained = node.drain_node(node_cluster.kubeconfig, b, timeout_s=120)
        assert f"pod/{first['metadata']['name']} evicted" in drained.stdout, drained.stdout
        assert first["metadata"]["uid"] not in {p["metadata"]["uid"] for p in _pods(kubectl, ns, "drained")}
        # The Deployment's replacement may run on node B only, which is cordoned: it waits, unscheduled.
        replacement = wait_for(lambda: _pods(kubectl, ns, "drained"), timeout=60, message="a replacement pod")
        assert all(not p["spec"].get("nodeName") for p in replacement), replacement  # type: ignore[union-attr]
    finally:
        node.uncordon_node(node_cluster.kubeconfig, b)
    assert _ready_pod(kubectl, ns, "drained")["spec"]["nodeName"] == b


def test_killed_node_is_lost_to_the_api_and_comes_back(
    node_cluster: NodeCluster, kubectl: Kubectl, scratch_ns: str
) -> None:
    """kill_node stops node B the way an instance dies: every process of it at once, no drain, the API objects as
    they were. The node controller sees it within the shortened grace period (the Ready condition turns
    Unknown, the unreachable taint appears) while the pod still reads Running; restart_node brings the node back
    Ready and the kubelet runs the same pod again in a new sandbox."""
    ns, b = scratch_ns, node.NODE_B
    cluster = node_cluster.cluster
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(_pinned("victim", b.name, node.PAUSE_IMAGE)))
    before = _ready_pod(kubectl, ns, "victim")
    container = before["status"]["containerStatuses"][0]["containerID"]
    try:
        began = time.monotonic()
        killed = node.kill_node(cluster, b.name)
        # containerd, kubelet, kube-proxy, and the pod's shim, pause and container processes at least.
        assert killed >= 5, killed
        assert not node.leftovers_of(b), node.leftovers_of(b)
        after = _pods(kubectl, ns, "victim")
        assert [(p["metadata"]["uid"], p["status"]["phase"]) for p in after] == [(before["metadata"]["uid"], "Running")]

        def lost() -> dict[str, Any] | None:
            obj = _node(kubectl, b.name)
            taints = {t["key"] for t in obj["spec"].get("taints", [])}
            return obj if _ready_status(obj) != "True" and "node.kubernetes.io/unreachable" in taints else None

        # The default grace period is 50 s; the e2e cluster's is NODE_MONITOR_GRACE_S.
        wait_for(lost, timeout=NODE_MONITOR_GRACE_S + 25, interval=0.5, message=f"{b.name} seen lost")
        print(f"[ftjob-e2e] {b.name} killed -> NotReady/unreachable in {time.monotonic() - began:.1f} s", flush=True)
        assert _pods(kubectl, ns, "victim")[0]["metadata"]["uid"] == before["metadata"]["uid"]  # nothing evicted
        back = node.restart_node(cluster, b.name)
        print(f"[ftjob-e2e] {b.name} restarted -> Ready in {back:.1f} s", flush=True)
    finally:
        if not any(c.process for c in cluster.components if c.name == f"kubelet{b.suffix}"):
            node.restart_node(cluster, b.name)  # the session's other tests need node B
    again = _ready_pod(kubectl, ns, "victim")
    assert again["metadata"]["uid"] == before["metadata"]["uid"]
    assert again["status"]["containerStatuses"][0]["containerID"] != container  # a new container after the "reboot"
