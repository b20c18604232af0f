"""The operator's own image (images/operator, FTJOB_TEST_OPERATOR_IMAGE, default finetune-operator/operator:<the
repository's VERSION>): what the chart's Deployment relies on, and the image running for real against a
control plane (tools/cluster LocalCluster, or $FTJOB_KUBECONFIG).

`make test-images` builds the image (image-operator) and the control-plane binaries (k8s-bins) first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Kubectl, make_kubectl
from operator_support import free_port, install_crd

from ftjob_cluster import bins
from ftjob_cluster.localcluster import LocalCluster, wait_for

from .conftest import DEFAULT_IMAGE, FTJOB_UID, REPO, VERSION, Docker, built_image

OPERATOR_DIR = REPO / "images" / "operator"
DEFAULT_OPERATOR_IMAGE = f"finetune-operator/operator:{VERSION}"
CHART = REPO / "charts" / "finetune-operator"
SAMPLE = REPO / "manifests" / "samples" / "cpu-bert-ja.yaml"
# The chart gives the operator 512Mi and nothing in it needs torch; the runtime images are ~6.5 GB. Measured 232 MB
# (images/README.md): the slim offline base, no apt caches, no build tools, no kubernetes.aio.
MAX_IMAGE_BYTES = 250 * 1000 * 1000
SITE_PACKAGES = "/opt/venv/lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def operator_image(docker: Docker) -> str:
    return built_image(docker, "FTJOB_TEST_OPERATOR_IMAGE", DEFAULT_OPERATOR_IMAGE, "image-operator")


def _run(docker: Docker, image: str, *args: str, entrypoint: str | None = None, timeout: float = 120) -> str:
    """`docker run` the way the chart runs the operator: read-only root filesystem, only /tmp writable."""
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return docker.run(["run", "--rm", "--read-only", "--tmpfs", "/tmp", *extra, image, *args], timeout=timeout).stdout


# -- static: the Dockerfile and the chart's default -------------------------------------------------------------


def test_dockerfile_rules() -> None:
    text = (OPERATOR_DIR / "Dockerfile").read_text(encoding="utf-8")
    final = text[text.rindex("\nFROM ") :]
    # A thin FROM of the shared base (the layers the runtime images start with) and the builder's wheel; the
    # same fixed numeric user as the runtime images (runAsNonRoot needs a numeric USER).
    before_first_from = text[: text.index("\nFROM ")]
    assert re.search(r"^ARG BASE=finetune-operator/base:bookworm$", before_first_from, re.M)
    assert re.search(r"^ARG BUILDER=finetune-operator/builder:bookworm$", before_first_from, re.M)
    assert re.findall(r"^FROM .*$", text, re.M) == ["FROM ${BUILDER} AS builder", "FROM ${BASE}"]
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in final
    assert re.search(r"^USER 1000:1000$", final, re.M)
    # The chart sets command ["ftjob"] itself; a plain `docker run IMAGE` starts the operator too.
    assert re.search(r'^ENTRYPOINT \["ftjob"\]$', final, re.M)
    assert re.search(r'^CMD \["operator"\]$', final, re.M)
    assert "PYTHONDONTWRITEBYTECODE=1" in final
    assert "org.opencontainers.image.title" in final  # version and revision: build.sh's --label
    # The proxy CA only as a BuildKit secret, on every step that downloads.
    assert not re.search(r"^(COPY|ADD)\b.*(\.crt|\.pem|ca-cert)", text, re.M | re.I)
    for run in re.findall(r"^RUN (?:.*\\\n)*.*$", text, re.M):
        downloads = re.search(r"apt-get update|install-stack\.sh|uv build|uv pip install(?!.*--no-deps)", run)
        if downloads:
            assert "--mount=type=secret,id=ca,target=/run/secrets/ca" in run, run.splitlines()[0]
    ignore = [
        line.strip()
        for line in (OPERATOR_DIR / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # The dependency list and the shared scripts: the wheel comes from the builder, and runtime/ (and its torch)
    # is not the operator's business.
    assert ignore[0] == "*"
    assert {"!operator/pyproject.toml", "!images/common/", "!images/operator/"} == {
        i for i in ignore if i.startswith("!")
    }


def test_chart_default_image_is_the_one_make_builds() -> None:
    """`make image-operator` tags VERSION; the chart's default image must be exactly that."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["operator"]["image"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert f"{values['repository']}:{values['tag'] or chart['appVersion']}" == DEFAULT_OPERATOR_IMAGE
    deployment = (REPO / "manifests" / "operator" / "deployment.yaml").read_text()
    assert f'image: "{DEFAULT_OPERATOR_IMAGE}"' in deployment


# -- the built image ----------------------------------------------------------------------------------------------


def test_image_is_small_and_has_no_torch(docker: Docker, operator_image: str) -> None:
    size = int(docker.run(["image", "inspect", "--format", "{{.Size}}", operator_image]).stdout)
    print(f"{operator_image}: {size / 1e6:.0f} MB")
    assert size < MAX_IMAGE_BYTES, f"{operator_image} is {size / 1e6:.0f} MB"
    script = (
        "import importlib.util as u, shutil, json\n"
        "print(json.dumps({'torch': u.find_spec('torch') is not None,"
        " 'compilers': [c for c in ('gcc', 'cc', 'c++', 'make') if shutil.which(c)]}))"
    )
    found = json.loads(_run(docker, operator_image, "-c", script, entrypoint="python3"))
    assert found == {"torch": False, "compilers": []}
    # What the size bound relies on (images/README.md): uv's cache and kubernetes' unused asyncio copy are not
    # in the image, nor are apt's package lists and .debs.
    probe = (
        f"ls -d /home/ftjob/.cache {SITE_PACKAGES}/kubernetes/aio 2>/dev/null; "
        "find /opt/tools /var/lib/apt/lists /var/cache/apt -type f ! -name lock 2>/dev/null; true"
    )
    leftovers = _run(docker, operator_image, "-c", probe, entrypoint="sh")
    assert leftovers.split() == [], leftovers
    freeze = _run(docker, operator_image, "/opt/venv/ftjob-freeze.txt", entrypoint="cat").splitlines()
    assert any(line.startswith("finetune-operator") for line in freeze), freeze
    assert any(line.startswith("kopf==") for line in freeze), freeze


def test_runs_as_uid_1000_with_ftjob_on_path(docker: Docker, operator_image: str) -> None:
    config = json.loads(docker.run(["image", "inspect", "--format", "{{json .Config}}", operator_image]).stdout)
    assert config["User"] == f"{FTJOB_UID}:{FTJOB_UID}"
    assert config["Entrypoint"] == ["ftjob"]
    assert config["Cmd"] == ["operator"]
    out = _run(docker, operator_image, "-c", "id -u; id -g; command -v ftjob", entrypoint="sh").split()
    assert out == [str(FTJOB_UID), str(FTJOB_UID), "/opt/venv/bin/ftjob"]


def test_code_is_byte_compiled_at_build_time(docker: Docker, operator_image: str) -> None:
    """With a read-only root filesystem nothing can be compiled at start: every module has its .pyc already."""
    script = (
        f"cd {SITE_PACKAGES} && for d in finetune_operator kopf kubernetes/client yaml; do "
        'for f in $(find "$d" -name "*.py"); do '
        'b=$(basename "$f" .py); ls "$(dirname "$f")"/__pycache__/"$b".cpython-311.pyc >/dev/null 2>&1 '
        '|| echo "missing $f"; done; done; echo checked'
    )
    out = _run(docker, operator_image, "-c", script, entrypoint="sh", timeout=300).split("\n")
    assert [line for line in out if line.startswith("missing")] == []
    assert "checked" in out


def test_crd_on_read_only_rootfs_matches_the_host(docker: Docker, operator_image: str) -> None:
    in_image = _run(docker, operator_image, "crd")
    host = subprocess.run(
        [str(Path(sys.executable).with_name("ftjob")), "crd"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert in_image == host
    assert yaml.safe_load(in_image)["metadata"]["name"] == "finetunejobs.finetune.dev"


# -- the image on a real control plane ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def admin_kubeconfig() -> Iterator[Path]:
    """$FTJOB_KUBECONFIG when set (e.g. kind), else a LocalCluster for this module."""
    external = os.environ.get("FTJOB_KUBECONFIG")
    if external:
        yield Path(external).resolve()
        return
    cluster = LocalCluster(ready_timeout=300).start()
    try:
        yield cluster.kubeconfig
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def kubectl(admin_kubeconfig: Path) -> Kubectl:
    return make_kubectl(bins.ensure_binary("kubectl"), admin_kubeconfig)


@pytest.fixture
def container_kubeconfig(kubectl: Kubectl, tmp_path: Path) -> Path:
    """The admin kubeconfig with its CA and client certificate embedded: the LocalCluster's refers to files in
    its directory by host path, which the container does not have. Readable by the image's UID 1000 (the
    cluster is this test's own throwaway one)."""
    path = tmp_path / "kubeconfig"
    path.write_text(kubectl("config", "view", "--raw", "--flatten", "--minify").stdout)
    path.chmod(0o644)
    return path


@pytest.fixture
def namespace(kubectl: Kubectl) -> str:
    name = f"t-operator-image-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    # Pods are rejected until the controller-manager has made the namespace's default ServiceAccount.
    wait_for(
        lambda: kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=60,
        message=f"ServiceAccount default in {name}",
    )
    return name


def _get(kubectl: Kubectl, *args: str) -> dict[str, Any] | None:
    proc = kubectl("get", *args, "-o", "json", check=False)
    if proc.returncode != 0:
        if "NotFound" in proc.stderr:
            return None
        raise AssertionError(proc.stderr)
    obj: dict[str, Any] = json.loads(proc.stdout)
    return obj


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0


def test_operator_image_reconciles_a_sample_on_a_control_plane(
    docker: Docker, operator_image: str, kubectl: Kubectl, container_kubeconfig: Path, namespace: str
) -> None:
    install_crd(kubectl, wait_for)
    health, metrics = free_port(), free_port()
    name = f"ftjob-operator-test-{uuid.uuid4().hex[:8]}"
    docker.run(
        [
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "-v",
            f"{container_kubeconfig}:/kube/config:ro",
            "-e",
            "KUBECONFIG=/kube/config",
            operator_image,
            "operator",
            "--health-port",
            str(health),
            "--metrics-port",
            str(metrics),
        ]
    )

    def logs() -> str:
        proc = docker.run(["logs", "--tail", "80", name], check=False)
        return proc.stdout + proc.stderr

    def running() -> None:
        state = docker.run(["inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name]).stdout.split()
        if state[0] != "true":
            pytest.fail(f"operator container exited with {state[1]}:\n{logs()}")

    try:

        def healthy() -> bool:
            running()
            return _http_status(f"http://127.0.0.1:{health}/healthz") == 200

        wait_for(healthy, timeout=90, interval=0.5, message="operator container /healthz")
        assert _http_status(f"http://127.0.0.1:{metrics}/metrics") == 200

        job = yaml.safe_load(SAMPLE.read_text())
        job_name = job["metadata"]["name"]
        kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))
        job_obj = _get(kubectl, "finetunejob", job_name, "-n", namespace)
        assert job_obj is not None
        uid = job_obj["metadata"]["uid"]
        wanted = [
            ("service", job_name),
            ("configmap", f"{job_name}-config"),
            ("pod", f"{job_name}-rank-0"),
            ("pod", f"{job_name}-rank-1"),
        ]

        def children() -> list[dict[str, Any]] | None:
            running()
            found = [_get(kubectl, kind, child, "-n", namespace) for kind, child in wanted]
            return None if None in found else [obj for obj in found if obj is not None]

        objs = wait_for(children, timeout=120, interval=0.5, message=f"children of {job_name}: {wanted}")
        assert isinstance(objs, list)
        for obj in objs:
            owners = obj["metadata"].get("ownerReferences", [])
            assert any(o["uid"] == uid and o.get("controller") for o in owners), obj["metadata"]["name"]
        pods = [obj for obj in objs if obj["kind"] == "Pod"]
        # The operator image's built-in cpu profile names the cpu image this tier builds.
        assert {p["spec"]["containers"][0]["image"] for p in pods} == {DEFAULT_IMAGE}

        def phase() -> str | None:
            running()
            return ((_get(kubectl, "finetunejob", job_name, "-n", namespace) or {}).get("status") or {}).get("phase")

        assert wait_for(phase, timeout=60, interval=0.5, message=f"{job_name} status.phase") in {"Pending", "Running"}
        # Kubernetes stops the pod with SIGTERM (Recreate upgrades): the operator must exit cleanly, in time.
        docker.run(["stop", "--time", "30", name], timeout=60)
        code = docker.run(["inspect", "--format", "{{.State.ExitCode}}", name]).stdout.strip()
        assert code == "0", f"operator exited with {code} on SIGTERM:\n{logs()}"
    finally:
        docker.run(["rm", "-f", name], check=False)
