"""End-to-end tier: a LocalCluster with two real nodes (kubelet, containerd, runc, CNI bridge and kube-proxy
each, in zones of their own; CoreDNS), the operator installed by Helm as a pod, and FineTuneJobs applied with
kubectl (docs/cluster.md).

The release path is a user's: the session starts an OCI registry (CNCF distribution, TLS from the cluster CA,
htpasswd) on NODE_IP, which both nodes reach; `hack/release.py release --no-build` pushes the built operator and
cpu images and the chart into it (`release` fixture); the operator is `helm install`ed from
oci://NODE_IP:5000/charts/finetune-operator, whose values name both images by digest; the operator pod and every
rank pod pull them from the registry with an imagePullSecret (the nodes' containerd trusts the registry's CA and
holds no credentials of its own). `ctr import` of the cpu image stays only as a cache warm-up: the pull then finds
its layers unpacked already (same diffIDs) and fetches the manifest and config alone (docs/cluster.md
"Registry").

The session skips, saying why, where this machine cannot run a node (not root, no cgroups, no containerd) or
the images are not built (`make test-e2e` builds them). Nothing here writes pod status or serves logs: the
kubelets do.

Fixtures: `node_cluster`, `release` (the registry and what was released into it), `kubectl`, `operator` (the
Helm release), `job_namespace` (restricted Pod Security, the pull Secret on its default ServiceAccount, with an
`output` claim on a hostPath ReadWriteMany volume that holds the examples' models and data).

The failure table: a test that injects a failure mode adds a row (`reliability.disruption`) with what it measured;
at the end of a session in which every test passed (or was skipped) and at least one row's test passed, the rows
of the tests that passed are written to the `e2e` section of $FTJOB_E2E_RELIABILITY_OUT (`make test-e2e`:
_out/reliability-e2e.md, or docs/reliability.md with E2E_RELIABILITY_OUT=docs/reliability.md), the rest of that
file left as it was; any other session writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import reliability
from cluster_support import Kubectl, make_kubectl

from finetune_operator.api.schema import CACHE_FOLDER
from ftjob_cluster import bins, node
from ftjob_cluster.localcluster import LocalCluster, wait_for
from ftjob_cluster.registry import Registry, docker_config, image_pull_secret

REPO = Path(__file__).resolve().parents[2]

# What mk/images.mk tags the built images with: the repository's VERSION.
VERSION = (REPO / "VERSION").read_text().strip()
RUNTIME_IMAGE = os.environ.get("FTJOB_E2E_IMAGE") or f"finetune-operator/cpu:{VERSION}"
OPERATOR_IMAGE = os.environ.get("FTJOB_E2E_OPERATOR_IMAGE") or f"finetune-operator/operator:{VERSION}"
OPERATOR_NS = "ftjob-system"
# The registry listens on NODE_IP (node B reaches it through its veth, as it reaches the API server) at a fixed
# port: Docker remembers which layers it pushed to a repository by the repository's name, port included, so a fixed
# name lets a later session's push skip every layer the registry's storage (kept in the cache) already has.
REGISTRY_PORT = 5000
REGISTRY_STORAGE = bins.cache_root() / "e2e-registry" / "storage"
PULL_SECRET = "registry-pull"
# The values the session installs its release with (`operator`), each a --set; test_upgrade upgrades with them.
OPERATOR_VALUES = (f"operator.imagePullSecrets[0].name={PULL_SECRET}",)
RELEASE_NAME = "ftjob"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


# The nodes pose as this instance type of the cpu profile (node.kubernetes.io/instance-type), so that a job asks
# for whole nodes as on EKS (hardware.instanceType; pods.scheduling then spreads its ranks one per node). Their
# capacity is this machine's, so the jobs set small resources of their own.
INSTANCE_TYPE = "m7i.xlarge"
# The controller-manager's node-monitor grace period (default 50 s): a killed node is seen NotReady in about
# this much (docs/cluster.md "Node faults").
NODE_MONITOR_GRACE_S = 20


@dataclass(frozen=True)
class NodeCluster:
    cluster: LocalCluster
    kubeconfig: Path
    volumes: Path  # host directory under which the hostPath PersistentVolumes live
    nodes: tuple[str, ...]  # node names, node A first


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The registry's pull tests run first: they look for the session's first pulls of the released images. The
    tests that kill, drain and restart node B run last, so that every other test (test_node_tooling's check that
    both nodes stayed Ready since they registered included) runs on nodes no test has disrupted yet. Just before
    them, test_upgrade, which takes the session's release down to the previous one and upgrades it back."""
    items.sort(
        key=lambda item: (
            item.path.name == "test_disruptions.py",
            item.path.name == "test_upgrade.py",
            item.path.name != "test_registry_pull.py",
        )
    )


@pytest.fixture(scope="session")
def node_cluster(request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    reason = node.unavailable_reason()
    if reason and reason == node.busy_reason():
        pytest.fail(f"the e2e tests cannot start their nodes: {reason}")  # they did not run: never a pass
    if reason:
        pytest.skip(f"no node on this machine: {reason}")
    for ref in (RUNTIME_IMAGE, OPERATOR_IMAGE):
        if not node.docker_has(ref):
            pytest.skip(f"image {ref} is not built (make image-cpu image-operator, or make test-e2e)")
    directory = Path(tempfile.mkdtemp(prefix="ftjob-e2e-"))
    cluster = node.node_cluster(
        directory,
        node_monitor_grace_s=NODE_MONITOR_GRACE_S,
        labels={"node.kubernetes.io/instance-type": INSTANCE_TYPE},
    )
    with node.node_lock():
        try:
            # The cpu image only, as a cache warm-up; the operator image reaches the nodes by a pull alone.
            times = node.start(cluster, [RUNTIME_IMAGE], detach=False)
            print(f"[ftjob-e2e] {', '.join(f'{k} {v:.1f}' for k, v in times.items())}", flush=True)
            volumes = directory / "volumes"
            volumes.mkdir()
            names = tuple(n.name for n in node.cluster_nodes(cluster))
            yield NodeCluster(cluster, cluster.kubeconfig, volumes, names)
        finally:
            node.stop(cluster, directory)
    left = node.leftovers(directory)
    assert not left, f"cluster-down left host changes behind: {left}"
    # Kept for a failed session only: etcd's data, the pods' logs and the jobs' models are a few hundred MB a run,
    # and a CI machine that runs the tier again and again filled its disk with them.
    if request.session.testsfailed:
        print(f"[ftjob-e2e] node stopped; a test failed: logs kept in {directory / 'logs'}", flush=True)
    else:
        shutil.rmtree(directory, ignore_errors=True)
        print(
            f"[ftjob-e2e] node stopped; {'could not remove ' if directory.exists() else 'removed '}{directory}",
            flush=True,
        )


@pytest.fixture(scope="session")
def runtime_image(release: Release) -> str:
    """The released cpu runtime image, by digest: any pod a test adds runs from it, pulled with the namespace's
    pull Secret (PULL_SECRET; job_namespace's ServiceAccount holds it)."""
    return release.image("cpu")


@pytest.fixture(scope="session")
def kubectl(node_cluster: NodeCluster) -> Kubectl:
    return make_kubectl(bins.ensure_binary("kubectl"), node_cluster.kubeconfig)


def delete_namespace(kubectl: Kubectl, name: str) -> None:
    """Delete namespace `name`: its jobs, Deployments, pods and claims first, waited for, then the namespace itself,
    not waited for.

    The namespace controller, when a pass finds pods still terminating, comes back only after half their longest
    grace period, plus a second (its ResourcesRemainingError estimate): a rank pod's is 120 s, so a job still training
    at teardown kept its namespace for 61 s or more after the pods had saved and exited. Deleting the jobs (their
    pods go with them) and the pods first, and waiting for them, is what frees the nodes for the next test; what is
    left (API objects only, after the controller's own 5 s delay) goes while the next test runs. Each step tolerates
    what the namespace lacks (one kind per call: kubectl refuses a whole list when one kind, the CRD's before the
    operator is installed, is unknown)."""
    for kind in ("finetunejobs", "deployments", "pods", "persistentvolumeclaims"):
        kubectl("-n", name, "delete", kind, "--all", "--wait=true", "--timeout=150s", check=False, timeout=180)
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def restricted_namespace(kubectl: Kubectl, name: str) -> None:
    """Namespace `name`, Pod Security restricted enforced, once its default ServiceAccount exists."""
    labels = {"name": name, "labels": RESTRICTED}
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": labels}
    kubectl("apply", "-f", "-", input=json.dumps(manifest))
    wait_for(
        lambda: kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0,
        timeout=60,
        message=f"default ServiceAccount in {name}",
    )


@dataclass(frozen=True)
class Release:
    """What the session released into its registry (hack/release.py's release.json) and how to reach it."""

    registry: Registry
    ca_file: Path
    helm_registry_config: Path  # helm's registry config, logged in
    docker_config: Path  # DOCKER_CONFIG folder, logged in (test_upgrade pushes the previous release's image)
    record: dict[str, Any]

    @property
    def chart(self) -> str:
        return str(self.record["chart"]["ref"])

    def image(self, flavor: str) -> str:
        """`host/finetune-operator/FLAVOR@sha256:...`: the reference the released chart gives the pods."""
        i = self.record["images"][f"finetune-operator/{flavor}"]
        return f"{i['image']}@{i['digest']}"

    def pull_secret(self, namespace: str) -> dict[str, Any]:
        r = self.registry
        return image_pull_secret(PULL_SECRET, namespace, r.host, r.user, r.password)

    def helm_args(self) -> list[str]:
        return [self.chart, "--version", VERSION, "--ca-file", str(self.ca_file)]

    def helm_env(self) -> dict[str, str]:
        return {**os.environ, "HELM_REGISTRY_CONFIG": str(self.helm_registry_config)}


@pytest.fixture(scope="session")
def release(node_cluster: NodeCluster) -> Iterator[Release]:
    """The registry on NODE_IP:REGISTRY_PORT, trusted by Docker (its certs.d) and both nodes' containerd (hosts.toml),
    with the operator and cpu images and the chart of VERSION released into it by hack/release.py."""
    cluster = node_cluster.cluster
    assert cluster.directory is not None
    work = cluster.directory / "release"
    ca = cluster.directory / "pki" / "ca.crt"
    REGISTRY_STORAGE.mkdir(parents=True, exist_ok=True)
    registry = Registry(
        work / "registry",
        cluster.directory / "pki",
        address=node.NODE_IP,
        port=REGISTRY_PORT,
        storage=REGISTRY_STORAGE,
        collect_garbage=True,
    ).start()
    docker_trust = node.DOCKER_CERTS_D / registry.host
    try:
        # Docker verifies a registry outside 127.0.0.0/8 with the CA in its certs.d folder (read at each push).
        docker_trust.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ca, docker_trust / "ca.crt")
        node.trust_registry(cluster, registry.host, ca)
        # What earlier sessions pulled from their registry goes, so that this session's pods pull for real.
        forgotten = node.forget_images(registry.host, node.cluster_nodes(cluster))
        forgotten += node.forget_repository(f"docker.io/{OPERATOR_IMAGE}", node.cluster_nodes(cluster))
        if forgotten:
            print(f"[ftjob-e2e] removed from the node stores: {', '.join(forgotten)}", flush=True)
        docker_dir = work / "docker"
        docker_dir.mkdir(parents=True)
        (docker_dir / "config.json").write_text(
            json.dumps(docker_config(registry.host, registry.user, registry.password))
        )
        helm_config = work / "helm" / "registry.json"
        helm_config.parent.mkdir(parents=True)
        helm = str(bins.ensure_binary("helm"))
        env = {**os.environ, "DOCKER_CONFIG": str(docker_dir), "HELM_REGISTRY_CONFIG": str(helm_config)}
        subprocess.run(
            [helm, "registry", "login", registry.host, "--ca-file", str(ca), "-u", registry.user, "--password-stdin"],
            input=registry.password,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        out = work / "out"
        subprocess.run(
            [
                sys.executable,
                str(REPO / "hack" / "release.py"),
                "release",
                "--registry",
                registry.host,
                "--images",
                "operator,cpu",
                "--no-build",
                "--helm",
                helm,
                "--ca-file",
                str(ca),
                "--out",
                str(out),
            ],
            env=env,
            check=True,
            timeout=3600,  # a first push of the cpu image (several GB, gzip on 2 cores); later ones skip its layers
        )
        record = json.loads((out / VERSION / "release.json").read_text())
        yield Release(registry, ca, helm_config, docker_dir, record)
    finally:
        registry.stop()
        shutil.rmtree(docker_trust, ignore_errors=True)
        for flavor in ("operator", "cpu"):
            subprocess.run(
                ["docker", "rmi", f"{registry.host}/finetune-operator/{flavor}:{VERSION}"], capture_output=True
            )


def helm(node_cluster: NodeCluster, release: Release, *args: str) -> subprocess.CompletedProcess[str]:
    """The pinned helm against the e2e cluster, logged in to the registry."""
    return subprocess.run(
        [str(bins.ensure_binary("helm")), *args, f"--kubeconfig={node_cluster.kubeconfig}"],
        check=True,
        capture_output=True,
        text=True,
        env=release.helm_env(),
    )


def upgrade_operator(node_cluster: NodeCluster, release: Release, *values: str) -> None:
    """`helm upgrade` of the session's release from the same released chart, keeping its values but `values`
    ("key=value", each a --set), and waiting for the rollout."""
    sets = [arg for value in values for arg in ("--set", value)]
    helm(
        node_cluster,
        release,
        "upgrade",
        RELEASE_NAME,
        *release.helm_args(),
        "-n",
        OPERATOR_NS,
        "--reuse-values",
        *sets,
        "--wait",
        "--timeout=600s",
    )


@pytest.fixture(scope="session")
def operator(node_cluster: NodeCluster, kubectl: Kubectl, release: Release) -> str:
    """`helm install` of the released chart from the registry, as the README's "On a cluster" says: its values name
    the operator and runtime images by digest; the pull Secret is the release namespace's. Returns the namespace."""
    restricted_namespace(kubectl, OPERATOR_NS)
    kubectl("apply", "-f", "-", input=json.dumps(release.pull_secret(OPERATOR_NS)))
    helm(
        node_cluster,
        release,
        "install",
        RELEASE_NAME,
        *release.helm_args(),
        "-n",
        OPERATOR_NS,
        *(arg for value in OPERATOR_VALUES for arg in ("--set", value)),
        "--wait",
        "--timeout=600s",  # a first start pulls and unpacks the image on 2 busy cores
    )
    return OPERATOR_NS


@pytest.fixture
def job_namespace(
    node_cluster: NodeCluster, kubectl: Kubectl, operator: str, release: Release
) -> Iterator[tuple[str, Path]]:
    """A restricted namespace whose default ServiceAccount holds the registry's pull Secret (the ServiceAccount
    admission plugin copies it into every pod: the rank pods pull the runtime image with it), with claims `results`
    and `inputs` (hostPath PVs, RWX, one host directory holding examples/); yields (ns, host dir)."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    restricted_namespace(kubectl, name)
    kubectl("apply", "-f", "-", input=json.dumps(release.pull_secret(name)))
    kubectl(
        "-n",
        name,
        "patch",
        "serviceaccount",
        "default",
        "-p",
        json.dumps({"imagePullSecrets": [{"name": PULL_SECRET}]}),
    )
    host = node_cluster.volumes / name
    # The compile-cache mount is the claim's CACHE_FOLDER, so the jobs find the staged examples at /cache/examples.
    shutil.copytree(REPO / "examples" / "models", host / CACHE_FOLDER / "examples" / "models")
    shutil.copytree(REPO / "examples" / "data", host / CACHE_FOLDER / "examples" / "data")
    os.chmod(host, 0o777)  # the pods run as uid 1000 (the images' ftjob user)
    for p in host.rglob("*"):
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    # Two claims on the same host directory: `results` for the outputs (each job mounts only its own
    # <path>/<namespace>/<job>), `inputs` as compileCache.claimName, whose CACHE_FOLDER is mounted at /cache.
    for claim in ("results", "inputs"):
        kubectl("apply", "-f", "-", input=json.dumps(hostpath_claim(name, claim, host)))
    try:
        yield name, host
    finally:
        delete_namespace(kubectl, name)
        for claim in ("results", "inputs"):
            kubectl("delete", "pv", f"{name}-{claim}", "--wait=false", check=False)


def hostpath_claim(namespace: str, claim: str, host: Path) -> dict[str, object]:
    """A static ReadWriteMany hostPath PV pre-bound to claim `claim` in `namespace`, and that claim."""
    pv_name = f"{namespace}-{claim}"
    common = {"accessModes": ["ReadWriteMany"], "storageClassName": "ftjob-hostpath"}
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv_name},
                "spec": {
                    **common,
                    "capacity": {"storage": "10Gi"},
                    "hostPath": {"path": str(host), "type": "Directory"},
                    "claimRef": {"namespace": namespace, "name": claim},
                    "persistentVolumeReclaimPolicy": "Retain",
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {**common, "volumeName": pv_name, "resources": {"requests": {"storage": "10Gi"}}},
            },
        ],
    }


# -- the failure table (docs/reliability.md, section `e2e`) ------------------------------------------------------------
SECTION = "e2e"
# Why the table was not written, for the terminal summary.
_NOT_WRITTEN = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    reliability.DISRUPTIONS.begin(item)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    reliability.DISRUPTIONS.observe(item, report)
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the failure table's rows to $FTJOB_E2E_RELIABILITY_OUT, only from a session that passed and measured
    something: a failed one (or one that skipped every row's test, as on a machine without nodes) leaves the last
    good table in place."""
    out = os.environ.get("FTJOB_E2E_RELIABILITY_OUT")
    records = reliability.DISRUPTIONS.records
    if not out or not records:
        return
    if exitstatus != pytest.ExitCode.OK:
        session.config.stash[_NOT_WRITTEN] = f"the session failed (exit status {int(exitstatus)})"
    elif not any(r.passed for r in records):
        session.config.stash[_NOT_WRITTEN] = "no test that measures a failure mode passed"
    else:
        reliability.write_section(Path(out), SECTION, reliability.render_disruptions(records))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    why = terminalreporter.config.stash.get(_NOT_WRITTEN, None)
    if why is None:
        return
    terminalreporter.write_line(f"failure table not written to {os.environ['FTJOB_E2E_RELIABILITY_OUT']}: {why}")
    for r in reliability.DISRUPTIONS.records:
        terminalreporter.write_line(f"  {r.mode}: {r.result or 'no pytest report'} {r.reason}".rstrip())
