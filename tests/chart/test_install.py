"""`helm install` of the chart into a real control plane, then the operator reconciling with what it installed.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler from tools/cluster) has no
kubelet, so the operator Deployment's pod never runs; the operator runs here as a local process instead, but
with exactly what the chart gives it in a cluster:
- its credentials are a token of the chart's ServiceAccount, so every API call goes through the chart's
  RBAC (a missing verb shows up as a 403 and a job that never gets its children);
- its --config is the chart's ConfigMap content, read back from the cluster;
- its --namespace flags are the Deployment's args.
The release namespace enforces the restricted Pod Security Standard, so the real PodSecurity admission
plugin decides whether the Deployment's pod may be created.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import CHART, REPO, load_all
from crd_adoption import CRD_NAME
from installlib import (
    ChartOperator,
    Kubectl,
    adopt_crd,
    chart_operator,
    http_get,
)

from ftjob_cluster import bins
from ftjob_cluster.localcluster import LocalCluster, wait_for

pytestmark = pytest.mark.controlplane
SAMPLES = REPO / "manifests" / "samples"
RELEASE = "ftop"
FULLNAME = f"{RELEASE}-finetune-operator"  # release name + chart name (_helpers.tpl)
# The chart's runtimeImages (registry and tag) in front of and behind the cpu profile's repository.
REGISTRY, TAG = "registry.example:5000/ft", "chart-test"
CPU_IMAGE = f"{REGISTRY}/finetune-operator/cpu:{TAG}"
POD_NAME = f"{FULLNAME}-7c9d8-x2x4q"  # the name the operator process is given as its pod's (the Lease's holder)


@pytest.fixture(scope="module")
def admin_kubeconfig() -> Iterator[Path]:
    """A cluster for this module: $FTJOB_KUBECONFIG when set (e.g. kind), else a LocalCluster."""
    external = os.environ.get("FTJOB_KUBECONFIG")
    if external:
        yield Path(external)
        return
    # Other tiers may share the CPUs; a loaded 2-core machine can need more than the default to start.
    cluster = LocalCluster(ready_timeout=300).start()
    failed = True
    try:
        yield cluster.kubeconfig
        failed = False
    finally:
        cluster.stop(keep_directory=failed)


@pytest.fixture(scope="module")
def kubectl(admin_kubeconfig: Path) -> Kubectl:
    return Kubectl(str(bins.ensure_binary("kubectl")), admin_kubeconfig)


@pytest.fixture(scope="module", params=["namespaced", "cluster"])
def installed(request: pytest.FixtureRequest, kubectl: Kubectl, helm: str) -> Iterator[dict[str, str]]:
    """One release per mode; pytest runs every test of the module for one mode before the other."""
    mode = str(request.param)
    suffix = uuid.uuid4().hex[:6]
    release_ns, jobs_ns = f"ftop-{suffix}", f"jobs-{suffix}"
    for ns in (release_ns, jobs_ns):
        kubectl("create", "namespace", ns)
    kubectl("label", "namespace", release_ns, "pod-security.kubernetes.io/enforce=restricted")
    # The previous mode's release, uninstalled, left its CRD (crds.keep), owned by a release in another namespace:
    # the chart README's one command lets this release take it over.
    kept = kubectl.get("crd", CRD_NAME)
    if kept:
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        adopt_crd(kubectl, RELEASE, release_ns)
    cmd = [
        helm,
        "install",
        RELEASE,
        str(CHART),
        "--kubeconfig",
        str(kubectl.kubeconfig),
        "-n",
        release_ns,
        "--set",
        "cachePVC.create=true",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        f"runtimeImages.registry={REGISTRY}",
        "--set",
        f"runtimeImages.tag={TAG}",
    ]
    if mode == "namespaced":
        cmd += ["--set", f"watchNamespaces={{{jobs_ns}}}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    try:
        yield {"mode": mode, "release": release_ns, "jobs": jobs_ns, "notes": out.stdout}
    finally:
        subprocess.run(
            [helm, "uninstall", RELEASE, "--kubeconfig", str(kubectl.kubeconfig), "-n", release_ns],
            capture_output=True,
            text=True,
            timeout=300,
        )
        # No kubelet confirms graceful pod deletion here: remove pods at once, then the namespaces.
        for ns in (jobs_ns, release_ns):
            kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_install_creates_the_chart_objects(kubectl: Kubectl, installed: dict[str, str]) -> None:
    release_ns, jobs_ns = installed["release"], installed["jobs"]
    crd = kubectl.get("crd", "finetunejobs.finetune.dev")
    assert crd["spec"]["versions"][0]["name"] == "v1alpha1"
    if installed["mode"] == "namespaced":
        assert kubectl.get("role", FULLNAME, "-n", jobs_ns)["rules"]
        assert kubectl.get("rolebinding", FULLNAME, "-n", jobs_ns)["subjects"][0]["namespace"] == release_ns
        assert kubectl.get("clusterrole", FULLNAME) is None
        claim_ns = jobs_ns
        assert "Mode: namespaced" in installed["notes"]
    else:
        assert kubectl.get("clusterrolebinding", FULLNAME)["subjects"][0]["namespace"] == release_ns
        claim_ns = release_ns
        assert "Mode: cluster" in installed["notes"]
    assert kubectl.get("pvc", "finetune-cache", "-n", claim_ns)["spec"]["accessModes"] == ["ReadWriteMany"]
    config = yaml.safe_load(kubectl.get("configmap", f"{FULLNAME}-config", "-n", release_ns)["data"]["config.yaml"])
    assert config["networkPolicy"]["enabled"] is True  # the operator makes one policy per job


def test_chart_crd_admits_every_sample(kubectl: Kubectl, installed: dict[str, str]) -> None:
    """The CRD as the chart installs it (schema + CEL rules, checked by the apiserver) accepts the samples."""
    out = kubectl("apply", "--dry-run=server", "-n", installed["jobs"], "-f", str(SAMPLES))
    created = [line for line in out.splitlines() if "created (server dry run)" in line]
    assert len(created) == len(list(SAMPLES.glob("*.yaml"))), out


# (verb, resource) pairs the operator uses in a namespace it handles, as the apiserver's RBAC evaluates them.
OPERATOR_CAN = [
    *[(v, "finetunejobs.finetune.dev") for v in ("get", "list", "watch", "patch", "delete")],
    ("patch", "finetunejobs.finetune.dev/status"),  # resource/subresource
    *[(v, "pods") for v in ("get", "list", "watch", "create", "delete", "patch")],  # patch: labels put back
    *[(v, r) for r in ("services", "configmaps") for v in ("get", "list", "watch", "create", "patch")],
    ("get", "secrets"),
    ("create", "secrets"),
    ("get", "pods/log"),
    *[(v, "events") for v in ("create", "patch")],
    # Installed with networkPolicy.enabled: one NetworkPolicy per job.
    *[(v, "networkpolicies.networking.k8s.io") for v in ("get", "list", "watch", "create", "patch")],
    # Kueue's workloads are not asked here: `can-i` cannot resolve them without Kueue's CRDs (test_render.py pins
    # those grants, tests/controlplane/test_rbac_audit.py sees them used).
]
# What it must not be able to do there: least privilege, not just enough privilege.
OPERATOR_CANNOT = [
    ("create", "finetunejobs.finetune.dev"),
    ("update", "finetunejobs.finetune.dev"),
    ("update", "pods"),
    ("patch", "secrets"),
    ("create", "pods/exec"),
    ("list", "secrets"),
    ("watch", "secrets"),
    ("delete", "secrets"),
    ("delete", "configmaps"),
    ("delete", "services"),
    ("delete", "networkpolicies.networking.k8s.io"),
    ("update", "finetunejobs.finetune.dev/status"),
    ("create", "events.events.k8s.io"),
    ("create", "deployments.apps"),
    ("create", "roles.rbac.authorization.k8s.io"),
]


def can_i(kubectl: Kubectl, sa: str) -> Callable[..., bool]:
    """`can(verb, resource[/subresource], *scope)`: what `kubectl auth can-i --as=<sa>` answers."""

    def can(verb: str, resource: str, *scope: str) -> bool:
        resource, _, sub = resource.partition("/")
        extra = [f"--subresource={sub}"] if sub else []
        out = kubectl("auth", "can-i", verb, resource, *extra, f"--as={sa}", *scope, check=False)
        return out.strip() == "yes"

    return can


def test_service_account_has_exactly_the_operator_permissions(kubectl: Kubectl, installed: dict[str, str]) -> None:
    can = can_i(kubectl, f"system:serviceaccount:{installed['release']}:{FULLNAME}")

    jobs = ["-n", installed["jobs"]]
    for verb, resource in OPERATOR_CAN:
        assert can(verb, resource, *jobs), f"cannot {verb} {resource} in the jobs namespace"
    for verb, resource in OPERATOR_CANNOT:
        assert not can(verb, resource, *jobs), f"can {verb} {resource}: more than the operator needs"
    assert can("list", "customresourcedefinitions.apiextensions.k8s.io")
    assert not can("create", "customresourcedefinitions.apiextensions.k8s.io")
    assert not can("get", "customresourcedefinitions.apiextensions.k8s.io")
    # Nodes, in both modes: read only (node loss), never written.
    assert can("watch", "nodes") and not can("patch", "nodes") and not can("delete", "nodes")
    namespaced = installed["mode"] == "namespaced"
    # kopf reads namespaces only when given --namespace flags (see templates/rbac.yaml).
    assert can("watch", "namespaces") is namespaced
    # Its Lease, in its own namespace only, and only read by name and written by compare-and-swap.
    release = ["-n", installed["release"]]
    for verb in ("get", "create", "update"):
        assert can(verb, "leases.coordination.k8s.io", *release), f"cannot {verb} its Lease"
    for verb in ("list", "watch", "patch", "delete"):
        assert not can(verb, "leases.coordination.k8s.io", *release), f"can {verb} leases"
    assert not can("update", "leases.coordination.k8s.io", *jobs), "a Lease grant outside its namespace"
    # Outside the watched namespace a namespaced-mode operator can do nothing.
    assert can("create", "pods", "-n", "kube-system") is not namespaced
    assert can("get", "secrets", "-n", "kube-system") is not namespaced


def test_operator_pod_passes_restricted_pod_security_admission(kubectl: Kubectl, installed: dict[str, str]) -> None:
    """The ReplicaSet controller creates the pod only if PodSecurity admission (enforce=restricted) allows it."""
    ns = installed["release"]

    def pod_or_rejection() -> str | None:
        pods = kubectl.get("pods", "-n", ns, "-l", "app.kubernetes.io/instance=" + RELEASE)
        if pods and pods["items"]:
            return "created"
        for rs in (kubectl.get("replicasets", "-n", ns) or {}).get("items", []):
            for cond in rs.get("status", {}).get("conditions", []):
                if cond["type"] == "ReplicaFailure":
                    return f"rejected: {cond.get('message', '')}"
        return None

    assert wait_for(pod_or_rejection, timeout=90, message="operator pod or ReplicaFailure") == "created"


@pytest.fixture(scope="module")
def operator(kubectl: Kubectl, installed: dict[str, str]) -> Iterator[ChartOperator]:
    work = Path(tempfile.mkdtemp(prefix="ftop-chart-"))
    try:
        with chart_operator(kubectl, installed["release"], FULLNAME, work, POD_NAME) as running:
            try:
                yield running
            finally:
                # Deleted while the operator still runs, so kopf removes its finalizers and nothing is left behind
                # for the next mode's operator to pick up.
                kubectl("delete", "finetunejobs", "--all", "-n", installed["jobs"], "--wait=false", check=False)
                with contextlib.suppress(Exception):
                    wait_for(
                        lambda: not (kubectl.get("finetunejobs", "-n", installed["jobs"]) or {}).get("items"),
                        timeout=60,
                        message="FineTuneJobs deleted",
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def operator_log(operator: ChartOperator) -> str:
    return operator.log_text()


def alive(operator: ChartOperator) -> Callable[[], None]:
    return operator.check_alive


def test_operator_leads_through_the_chart_lease_role(
    kubectl: Kubectl, operator: ChartOperator, installed: dict[str, str]
) -> None:
    """The Deployment's election flags and env, with the chart's Role: the operator creates its Lease in the
    release namespace, as its pod, and keeps renewing it."""
    check = alive(operator)

    def lease() -> Any:
        check()
        return kubectl.get("lease", FULLNAME, "-n", installed["release"])

    held = wait_for(
        lambda: (lease() or {}).get("spec", {}).get("holderIdentity") == POD_NAME, timeout=90, message="the Lease"
    )
    assert held
    first = lease()["spec"]["renewTime"]
    wait_for(lambda: lease()["spec"]["renewTime"] != first, timeout=60, message="a renewal")


def test_operator_serves_health_and_metrics(operator: ChartOperator, installed: dict[str, str]) -> None:
    namespace_args = [a for a in operator.args if a.startswith("--namespace")]
    assert namespace_args == ([f"--namespace={installed['jobs']}"] if installed["mode"] == "namespaced" else [])
    check = alive(operator)

    def healthy() -> bool:
        check()
        return http_get(f"http://127.0.0.1:{operator.health}/healthz")[0] == 200

    wait_for(healthy, timeout=90, message="operator /healthz")
    status, body = http_get(f"http://127.0.0.1:{operator.metrics}/metrics")
    assert status == 200 and "# TYPE" in body


@pytest.mark.parametrize(
    ("sample", "children"),
    [
        (
            "cpu-bert-ja.yaml",
            ["Service/{job}", "ConfigMap/{job}-config", "NetworkPolicy/{job}", "Pod/{job}-rank-0", "Pod/{job}-rank-1"],
        ),
        (
            "cpu-distilbert-squad-mpi.yaml",
            [
                "Service/{job}",
                "ConfigMap/{job}-config",
                "Secret/{job}-ssh",
                "NetworkPolicy/{job}",
                "Pod/{job}-launcher",
                "Pod/{job}-worker-0",
                "Pod/{job}-worker-1",
            ],
        ),
    ],
)
def test_operator_reconciles_a_sample_with_the_chart_rbac(
    kubectl: Kubectl, installed: dict[str, str], operator: ChartOperator, sample: str, children: list[str]
) -> None:
    jobs_ns = installed["jobs"]
    (job,) = load_all((SAMPLES / sample).read_text())
    name = job["metadata"]["name"]
    kubectl("apply", "-n", jobs_ns, "-f", "-", input=yaml.safe_dump(job))
    uid = kubectl.get("finetunejob", name, "-n", jobs_ns)["metadata"]["uid"]
    check = alive(operator)
    wanted = [c.format(job=name) for c in children]

    def all_children() -> list[dict[str, Any]] | None:
        check()
        found = []
        for ident in wanted:
            kind, child = ident.split("/")
            obj = kubectl.get(kind.lower(), child, "-n", jobs_ns)
            if not obj:
                return None
            found.append(obj)
        return found

    objs = wait_for(all_children, timeout=120, message=f"children of {name}: {wanted}")
    assert isinstance(objs, list)
    for obj in objs:
        owners = obj["metadata"].get("ownerReferences", [])
        assert any(o["uid"] == uid and o.get("controller") for o in owners), obj["metadata"]["name"]
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "finetune-operator"  # what the NetworkPolicies select
        assert labels["finetune.dev/job-name"] == name
    pods = [o for o in objs if o["kind"] == "Pod"]
    # The operator took the registry and tag from the chart's ConfigMap, not its built-in default.
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {CPU_IMAGE}

    def phase() -> str | None:
        status = (kubectl.get("finetunejob", name, "-n", jobs_ns) or {}).get("status") or {}
        return status.get("phase")

    assert wait_for(phase, timeout=60, message=f"{name} status.phase") in {"Pending", "Running"}
    log = operator_log(operator)
    assert " 403" not in log and "Forbidden" not in log, log[-4000:]


def test_uninstall_keeps_the_cache_claim(kubectl: Kubectl, helm: str, installed: dict[str, str]) -> None:
    release_ns, jobs_ns = installed["release"], installed["jobs"]
    out = subprocess.run(
        [helm, "uninstall", RELEASE, "--kubeconfig", str(kubectl.kubeconfig), "-n", release_ns],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    wait_for(
        lambda: kubectl.get("deployment", FULLNAME, "-n", release_ns) is None, timeout=60, message="Deployment removed"
    )
    claim_ns = jobs_ns if installed["mode"] == "namespaced" else release_ns
    assert kubectl.get("pvc", "finetune-cache", "-n", claim_ns), "helm.sh/resource-policy: keep was ignored"
    # The CRD stays too (crds.keep: helm.sh/resource-policy: keep), so existing FineTuneJobs survive an operator
    # reinstall; the admission policy, which holds no data, goes with the release.
    assert kubectl.get("crd", CRD_NAME)
    assert kubectl.get("validatingadmissionpolicy", CRD_NAME) is None


def test_kustomize_manifests_apply_to_a_real_apiserver(kubectl: Kubectl) -> None:
    """`kubectl apply -k manifests/` works as the README says, and its Namespace enforces restricted PSS."""
    kubectl("apply", "--server-side", "--force-conflicts", "-k", str(REPO / "manifests"))
    try:
        ns = "finetune-operator"
        labels = kubectl.get("namespace", ns)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        for kind in ("clusterrole", "clusterrolebinding"):
            assert kubectl.get(kind, "finetune-operator") and kubectl.get(kind, "finetune-operator-cluster")

        def pod_created() -> bool:
            pods = kubectl.get("pods", "-n", ns, "-l", "app.kubernetes.io/instance=finetune-operator")
            return bool(pods and pods["items"])

        wait_for(pod_created, timeout=90, message="operator pod admitted under enforce=restricted")
    finally:
        # Everything but the CRD, which other tests of this module share.
        kubectl("delete", "pods", "--all", "-n", "finetune-operator", "--grace-period=0", "--force", check=False)
        kubectl("delete", "namespace", "finetune-operator", "--wait=false", check=False)
        kubectl(
            "delete", "clusterrolebinding,clusterrole", "finetune-operator", "finetune-operator-cluster", check=False
        )


def test_namespaced_overlay_confines_the_operator_to_its_namespace(kubectl: Kubectl) -> None:
    """`kubectl apply -k manifests/overlays/namespaced/`: the operator's ServiceAccount may run jobs in ml-team
    and nowhere else, and the Deployment tells kopf to watch only ml-team."""
    # The previous test's namespace of the same name may still be terminating.
    wait_for(
        lambda: kubectl.get("namespace", "finetune-operator") is None,
        timeout=120,
        message="namespace finetune-operator gone before re-creating it",
    )
    kubectl("apply", "--server-side", "--force-conflicts", "-k", str(REPO / "manifests" / "overlays" / "namespaced"))
    try:
        can = can_i(kubectl, "system:serviceaccount:finetune-operator:finetune-operator")
        # The base is the chart's default render: networkPolicy.enabled is off, so no NetworkPolicy verbs.
        for verb, resource in (p for p in OPERATOR_CAN if not p[1].startswith("networkpolicies")):
            assert can(verb, resource, "-n", "ml-team"), f"cannot {verb} {resource} in ml-team"
        for ns in ("default", "kube-system", "finetune-operator"):
            assert not can("create", "pods", "-n", ns), f"can create pods in {ns}"
            assert not can("get", "secrets", "-n", ns), f"can read secrets in {ns}"
        assert can("watch", "namespaces") and not can("create", "namespaces")
        assert not can("create", "networkpolicies.networking.k8s.io", "-n", "ml-team")
        assert not kubectl.get("clusterrolebinding", "finetune-operator"), "per-namespace rules bound cluster-wide"
        deployment = kubectl.get("deployment", "finetune-operator", "-n", "finetune-operator")
        assert "--namespace=ml-team" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    finally:
        kubectl("delete", "namespace", "finetune-operator", "ml-team", "--wait=false", check=False)
        kubectl(
            "delete", "clusterrolebinding,clusterrole", "finetune-operator", "finetune-operator-cluster", check=False
        )
