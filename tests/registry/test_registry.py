"""The local registry with real clients: Docker pushes and pulls an image with a login, helm pushes the packaged
chart to oci:// and reads it back, and neither gets anything without credentials. Python's TLS client checks that
the registry's certificate chains to the cluster CA (Docker treats 127.0.0.0/8 as an insecure registry and does
not verify it; helm does, with --ca-file)."""

from __future__ import annotations

import io
import json
import re
import ssl
import tarfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from registry_clients import Client, helm_client

from ftjob_cluster.registry import Registry, basic_auth

CHART = Path(__file__).resolve().parents[2] / "charts" / "finetune-operator"
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)
# How each client says the registry wanted credentials it did not have.
REFUSED = re.compile(r"unauthorized|no basic auth credentials|basic credential not found|401", re.I)


def manifest_digest(registry: Registry, repository: str, reference: str, auth: str | None) -> str:
    """Docker-Content-Digest of a manifest as the registry serves it, over TLS verified against the cluster CA."""
    req = urllib.request.Request(f"https://{registry.host}/v2/{repository}/manifests/{reference}", method="HEAD")
    req.add_header("Accept", MANIFEST_TYPES)
    if auth is not None:
        req.add_header("Authorization", f"Basic {auth}")
    with urllib.request.urlopen(req, timeout=10, context=registry.ssl_context()) as r:
        return str(r.headers["Docker-Content-Digest"])


def rootfs_tarball(path: Path) -> Path:
    """A one-file root filesystem, unique per call, so a push really uploads a new layer."""
    data = f"ftjob registry test {uuid.uuid4()}\n".encode()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_registry_refuses_anonymous_and_wrong_credentials_and_serves_the_cluster_ca_chain(registry: Registry) -> None:
    assert registry.status("/v2/") == 401
    assert registry.status("/v2/", authenticated=True) == 200
    assert registry.status("/v2/_catalog") == 401
    wrong = Registry(registry.directory, registry.ca_dir, user=registry.user, password="not-the-password")
    wrong.port = registry.port
    assert wrong.status("/v2/", authenticated=True) == 401
    # A client that trusts only the system's CAs refuses the certificate: it chains to the cluster CA alone.
    with pytest.raises(urllib.error.URLError) as err:
        urllib.request.urlopen(f"https://{registry.host}/v2/", timeout=5, context=ssl.create_default_context())
    assert isinstance(err.value.reason, ssl.SSLCertVerificationError)


def test_docker_pushes_and_pulls_with_a_login_and_nothing_without_one(
    registry: Registry, docker: Client, tmp_path: Path
) -> None:
    repository, tag = "ftjob-test/tiny", uuid.uuid4().hex[:12]
    ref = f"{registry.host}/{repository}:{tag}"
    image_id = docker.run("import", str(rootfs_tarball(tmp_path / "rootfs.tar")), ref).stdout.strip()
    try:
        assert REFUSED.search(docker.fails("push", ref))  # not logged in
        assert REFUSED.search(
            docker.fails("login", registry.host, "--username", registry.user, "--password-stdin", input="wrong")
        )
        docker.run("login", registry.host, "--username", registry.user, "--password-stdin", input=registry.password)
        pushed = docker.run("push", ref).stdout
        digest = re.search(r"digest: (sha256:[0-9a-f]{64})", pushed)
        assert digest, pushed
        # The registry holds that manifest (read back over TLS verified against the cluster CA).
        auth = basic_auth(registry.user, registry.password)
        assert manifest_digest(registry, repository, tag, auth) == digest.group(1)
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            manifest_digest(registry, repository, tag, None)
        assert anonymous.value.code == 401
        docker.run("rmi", ref)
        docker.run("pull", ref)
        assert docker.run("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip() == image_id
        repo_digests = json.loads(docker.run("image", "inspect", "--format", "{{json .RepoDigests}}", ref).stdout)
        assert f"{registry.host}/{repository}@{digest.group(1)}" in repo_digests
        docker.run("rmi", ref)
        docker.run("logout", registry.host)
        # Anonymous pull: the registry answers Docker's first request (GET /v2/) with 401. Docker then retries
        # over plain HTTP (it treats 127.0.0.0/8 as an insecure registry), so its own message is that retry's
        # failure: the registry's access log says what happened, and nothing of the repository was served.
        logged = registry.log_path.stat().st_size
        docker.fails("pull", ref)
        log = registry.log_path.read_bytes()[logged:].decode(errors="replace")
        assert re.search(r'"GET /v2/ HTTP/1.1" 401 \d+ "" "docker/', log), log[-3000:]
        assert not re.search(rf'"(GET|HEAD) /v2/{repository}/\S+ HTTP/1.1" 200', log), log[-3000:]
        assert docker.run("image", "inspect", ref, check=False).returncode != 0
    finally:
        docker.run("rmi", "--force", ref, check=False)


def test_helm_pushes_the_chart_to_oci_and_reads_it_back(registry: Registry, helm: Client, tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    helm.run("package", str(CHART), "-d", str(tmp_path / "pkg"))
    (tgz,) = (tmp_path / "pkg").glob("*.tgz")
    repo, ca = f"oci://{registry.host}/charts", str(registry.ca_cert)
    ref = f"{repo}/{chart['name']}"
    login = ["registry", "login", registry.host, "--username", registry.user, "--password-stdin"]
    assert REFUSED.search(helm.fails("push", str(tgz), repo, "--ca-file", ca))  # not logged in
    # Without the cluster CA helm does not trust the registry's certificate.
    assert re.search(r"x509|certificate", helm.fails(*login, input=registry.password))
    helm.run(*login, "--ca-file", ca, input=registry.password)
    pushed = helm.run("push", str(tgz), repo, "--ca-file", ca)
    digest = re.search(r"Digest: (sha256:[0-9a-f]{64})", pushed.stdout + pushed.stderr)
    assert digest, pushed.stdout + pushed.stderr
    auth = basic_auth(registry.user, registry.password)
    assert manifest_digest(registry, f"charts/{chart['name']}", chart["version"], auth) == digest.group(1)

    shown = yaml.safe_load(helm.run("show", "chart", ref, "--version", chart["version"], "--ca-file", ca).stdout)
    assert (shown["name"], shown["version"], shown["appVersion"]) == (
        chart["name"],
        chart["version"],
        chart["appVersion"],
    )
    (tmp_path / "pulled").mkdir()
    helm.run("pull", ref, "--version", chart["version"], "-d", str(tmp_path / "pulled"), "--ca-file", ca)
    assert (tmp_path / "pulled" / tgz.name).read_bytes() == tgz.read_bytes()
    # Another helm home, never logged in: refused.
    stranger = helm_client(tmp_path / "stranger")
    assert REFUSED.search(stranger.fails("show", "chart", ref, "--version", chart["version"], "--ca-file", ca))
