"""`helm upgrade` from the previous release to the one this session released, while a job trains on the two nodes.

The previous release is the commit `hack/release.py previous` names (its rule is in its docstring). What a cluster that
runs it has is made as a user made it: the chart from that commit (`git archive`), and its operator image built from the
same archive (that commit's images/base `base` and `builder` targets, which build its operator wheel, then its
images/operator/Dockerfile; tagged `previous-<commit>`, so the current build's tags stay as they are), pushed to the
session's registry. The session's release is uninstalled and the CRD deleted (the tests before this one left no job),
then `helm install` of the previous chart with that image, the session's pull Secret, and the runtime images from the
registry by tag; its CRD comes from that chart (crds/, for the first release).

ja-long trains under the previous operator. Then the upgrade, as the chart README says: where the
previous chart installed the CRD from crds/, Helm refuses to adopt it until the README's one command (crd_adoption),
which the test runs; then the README's `helm upgrade oci://.../finetune-operator --version VERSION
--reset-then-reuse-values`: the install's values are kept, the previous image's repository and tag among them, and the
released chart's digest must still decide the image. The chart's RollingUpdate starts the new operator as a standby; the
old one releases the Lease as it stops. Checked: the CRD is this chart's (its schema, Helm's ownership,
`helm.sh/resource-policy: keep`), the operator pod runs the released image by digest and holds the Lease, the job's
pods, Service and ConfigMap are the same objects throughout, and the job Succeeds with no restart. The session's release
then runs what the `operator` fixture installed, for the tests after this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster_support import Kubectl
from conftest import OPERATOR_NS, OPERATOR_VALUES, PULL_SECRET, RELEASE_NAME, REPO, VERSION, NodeCluster, Release, helm
from crd_adoption import CRD_NAME, NOT_ADOPTABLE, adoption_command, differs
from yaml12 import load_all_documents

from finetune_operator import constants as c
from finetune_operator.progress import parse_line
from ftjob_cluster.localcluster import wait_for

JOBS = Path(__file__).resolve().parent / "jobs"
JOB = "ja-long"
JOB_TIMEOUT = 1200.0
LEASE = f"{RELEASE_NAME}-finetune-operator"
SELECTOR = f"app.kubernetes.io/name=finetune-operator,app.kubernetes.io/instance={RELEASE_NAME}"
# Behind a TLS-intercepting proxy the builds need the host's CA: a build secret, never stored in an image.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BASE = "finetune-operator/base:bookworm"  # the current shared base, which make image-operator built


@dataclass(frozen=True)
class Previous:
    commit: str
    chart: Path  # the previous commit's charts/finetune-operator
    image: str  # its operator image in the session's registry, by tag


def _docker(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    """A Docker command; `build` goes through the image scripts' choice of CLI (images/scripts/docker.sh: one that
    builds with BuildKit into the daemon's image store, where the operator's build finds the base images)."""
    if args[0] == "build":
        script = f'source {REPO}/images/scripts/docker.sh && ftjob_find_docker && "${{DOCKER_BUILD[@]}}" "$@"'
        command = ["bash", "-c", script, "docker-build", *args[1:]]
    else:
        command = ["docker", *args]
    out = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert out.returncode == 0, f"docker {' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
    return out.stdout


def _base_image() -> str:
    """What the current shared base was built from (its label): the previous release's base starts from the same
    image (the debootstrapped one where no registry is reachable, images/scripts/build.sh)."""
    label = _docker("inspect", "-f", '{{index .Config.Labels "org.opencontainers.image.base.name"}}', BASE)
    assert label.strip(), f"{BASE} has no base.name label: build it first (make image-operator)"
    return label.strip()


@pytest.fixture(scope="module")
def previous(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Previous]:
    """The previous release's chart, and its operator image built from the same commit and pushed to the session's
    registry."""
    tool = subprocess.run(
        [sys.executable, str(REPO / "hack" / "release.py"), "previous"], capture_output=True, text=True, check=True
    )
    commit = tool.stdout.split()[-1]
    src = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    tag = f"previous-{commit[:12]}"
    image = f"{release.registry.host}/finetune-operator/operator:{tag}"
    env = {**os.environ, "DOCKER_CONFIG": str(release.docker_config)}
    secret = ["--secret", f"id=ca,src={CA_BUNDLE}"] if CA_BUNDLE.is_file() else []
    base_image = _base_image()
    local = {target: f"finetune-operator/{target}:{tag}" for target in ("base", "builder")}
    try:
        # As that commit's images/scripts/build.sh builds the operator, with tags of its own.
        for target, name in local.items():
            base_file = ["-f", "images/base/Dockerfile", "--target", target, "--build-arg", f"BASE_IMAGE={base_image}"]
            _docker("build", *base_file, *secret, "-t", name, ".", cwd=src, env=env)
        args = ["--build-arg", f"BASE={local['base']}", "--build-arg", f"BUILDER={local['builder']}"]
        _docker("build", "-f", "images/operator/Dockerfile", *args, *secret, "-t", image, ".", cwd=src, env=env)
        _docker("push", image, env=env)
        yield Previous(commit, src / "charts" / "finetune-operator", image)
    finally:
        subprocess.run(["docker", "rmi", image, *local.values()], capture_output=True, check=False)


def _json(kubectl: Kubectl, *args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)


def _children(kubectl: Kubectl, ns: str, uid: str) -> dict[str, str]:
    """kind/name -> uid of every pod, Service and ConfigMap in `ns` whose controller is the object `uid`."""
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["uid"]
        for o in _json(kubectl, "-n", ns, "get", "pods,services,configmaps")["items"]
        if any(r.get("controller") and r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
    }


def _job(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    return dict(_json(kubectl, "-n", ns, "get", "ftj", JOB))


def _last_logged_step(kubectl: Kubectl, ns: str) -> int:
    out = kubectl("-n", ns, "logs", f"{JOB}-rank-0", "-c", c.CONTAINER_TRAINER, "--tail=200", check=False).stdout
    steps = [p.get("step", 0) for line in out.splitlines() if (p := parse_line(line)) and p.get("event") == "train"]
    return max(steps, default=0)


def _operator_pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    pods = _json(kubectl, "-n", OPERATOR_NS, "get", "pods", "-l", SELECTOR)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _rendered_crd(node_cluster: NodeCluster, release: Release) -> dict[str, Any]:
    out = helm(node_cluster, release, "template", RELEASE_NAME, *release.helm_args(), "-n", OPERATOR_NS).stdout
    # Go's YAML, as the API server reads it (PyYAML would read a default such as 5e-05 as a string).
    (crd,) = [o for o in load_all_documents(out) if o["kind"] == "CustomResourceDefinition"]
    return dict(crd)


def test_upgrade_from_the_previous_release_keeps_the_training_job_and_its_pods(
    node_cluster: NodeCluster,
    kubectl: Kubectl,
    release: Release,
    previous: Previous,
    job_namespace: tuple[str, Path],
) -> None:
    ns, _ = job_namespace
    # The cluster as the previous release left it: no release of this session, no CRD of this chart.
    helm(node_cluster, release, "uninstall", RELEASE_NAME, "-n", OPERATOR_NS, "--wait", "--timeout=300s")
    kubectl("delete", "crd", CRD_NAME, "--wait=true", "--timeout=120s")
    old_values = [
        f"operator.image.repository={previous.image.rsplit(':', 1)[0]}",
        f"operator.image.tag={previous.image.rsplit(':', 1)[1]}",
        f"runtimeImages.registry={release.registry.host}",
        f"runtimeImages.tag={VERSION}",
        *OPERATOR_VALUES,
    ]
    sets = [arg for value in old_values for arg in ("--set", value)]
    helm(
        node_cluster,
        release,
        "install",
        RELEASE_NAME,
        str(previous.chart),
        "-n",
        OPERATOR_NS,
        *sets,
        "--wait",
        "--timeout=600s",
    )
    crds_layout = (previous.chart / "crds").is_dir()
    new_crd = _rendered_crd(node_cluster, release)
    assert differs(new_crd["spec"], _json(kubectl, "get", "crd", CRD_NAME)["spec"]), "the previous CRD is this one"

    kubectl("-n", ns, "apply", "-f", str(JOBS / f"{JOB}.yaml"))
    wait_for(lambda: _last_logged_step(kubectl, ns) >= 10, timeout=JOB_TIMEOUT, interval=2.0, message="training")
    job = _job(kubectl, ns)
    assert job["status"]["phase"] == "Running", job["status"]
    uid = job["metadata"]["uid"]
    before = _children(kubectl, ns, uid)
    assert sorted(k.split("/")[0] for k in before) == ["ConfigMap", "Pod", "Pod", "Service"], before
    (old_pod,) = _operator_pods(kubectl)

    # The chart README's command: the values set at install are kept (the previous image's repository and tag
    # among them: the released chart's digest takes precedence over a tag), the new chart's defaults for the rest.
    upgrade = ["upgrade", RELEASE_NAME, *release.helm_args(), "-n", OPERATOR_NS, "--reset-then-reuse-values"]
    if crds_layout:
        # A CRD from crds/ has no ownership metadata: Helm refuses it until the README's one command.
        with pytest.raises(subprocess.CalledProcessError) as refused:
            helm(node_cluster, release, *upgrade)
        assert NOT_ADOPTABLE in refused.value.stderr, refused.value.stderr
        kubectl(*adoption_command(RELEASE_NAME, OPERATOR_NS))
    step_at_upgrade = _last_logged_step(kubectl, ns)
    helm(node_cluster, release, *upgrade, "--wait", "--timeout=600s")

    live = _json(kubectl, "get", "crd", CRD_NAME)
    assert differs(new_crd["spec"], live["spec"]) is None, "helm upgrade did not apply this chart's CRD"
    annotations = live["metadata"]["annotations"]
    assert annotations["helm.sh/resource-policy"] == "keep"
    assert annotations["meta.helm.sh/release-name"] == RELEASE_NAME

    def new_operator_leads() -> str | None:
        pods = _operator_pods(kubectl)
        if len(pods) != 1 or pods[0]["metadata"]["name"] == old_pod["metadata"]["name"]:
            return None
        lease = _json(kubectl, "-n", OPERATOR_NS, "get", "lease", LEASE)
        name = str(pods[0]["metadata"]["name"])
        return name if lease["spec"].get("holderIdentity") == name else None

    leader = wait_for(new_operator_leads, timeout=300, interval=1.0, message="the upgraded operator leads")
    (pod,) = [p for p in _operator_pods(kubectl) if p["metadata"]["name"] == leader]
    assert pod["spec"]["containers"][0]["image"] == release.image("operator"), pod["spec"]["containers"][0]
    assert pod["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}]
    assert _job(kubectl, ns)["status"]["phase"] == "Running"
    assert _children(kubectl, ns, uid) == before, "the upgraded operator replaced a child of the running job"
    print(f"[ftjob-e2e] upgraded from {previous.commit[:12]} at training step {step_at_upgrade}", flush=True)

    end = wait_for(
        lambda: (j := _job(kubectl, ns))["status"].get("phase") in ("Succeeded", "Failed") and j,
        timeout=JOB_TIMEOUT,
        interval=2.0,
        message=f"{JOB} to finish",
    )
    assert end["status"]["phase"] == "Succeeded" and end["status"].get("restartCount", 0) == 0, end["status"]
    assert _children(kubectl, ns, uid) == before
