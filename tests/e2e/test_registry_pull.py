"""Images reach the nodes as a user's do: pulled from the session's registry (conftest.py `release`), by the digest
the released chart names, authenticated by an imagePullSecret. What proves it is the registry's own access log (the
manifest GETs by each node's containerd, as user ftjob) and the kubelets' events, not our word.

These tests run first in the session (conftest.py orders them), before any other pod has used the runtime image on
either node, so that the pulls they look for are the session's first."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_support import Kubectl
from conftest import OPERATOR_NS, PULL_SECRET, Release, delete_namespace, restricted_namespace

from ftjob_cluster import node
from ftjob_cluster.localcluster import wait_for
from ftjob_cluster.registry import basic_auth

# distribution's log lines are logfmt: key=value, the value quoted when it holds spaces or quotes.
LOGFMT = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|\S+)')
JOB = {
    "apiVersion": "finetune.dev/v1alpha1",
    "kind": "FineTuneJob",
    "metadata": {"name": "pulled"},
    "spec": {
        "hardware": {
            "profile": "cpu",
            # Whole-node ranks (the nodes pose as this instance type): one pod on each node.
            "instanceType": "m7i.xlarge",
            "nodes": 2,
            "procsPerNode": 1,
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        },
        "command": ["python3", "-c", "print('pulled by digest')"],
        # The namespace's ServiceAccount holds no pull Secret here: the job names it.
        "podTemplate": {"imagePullSecrets": [{"name": PULL_SECRET}]},
    },
}


def _logfmt(line: str) -> dict[str, str]:
    return {k: v[1:-1].replace('\\"', '"') if v.startswith('"') else v for k, v in LOGFMT.findall(line)}


def containerd_requests(release: Release, methods: tuple[str, ...], uri_prefix: str) -> list[dict[str, str]]:
    """The registry's completed requests by a node's containerd with one of `methods` on a URI under `uri_prefix`."""
    return [
        rec
        for rec in map(_logfmt, release.registry.log_path.read_text(errors="replace").splitlines())
        if rec.get("msg") == "response completed"
        and rec.get("http.request.method") in methods
        and rec.get("http.request.uri", "").startswith(uri_prefix)
        and rec.get("http.request.useragent", "").startswith("containerd/")
    ]


def manifest_pulls(release: Release, flavor: str) -> list[dict[str, str]]:
    """The registry's completed requests for `flavor`'s released manifest by digest, made by containerd: a GET, or a
    HEAD alone where the node's store still held the manifest's content (the resolve of a digest reference is
    always asked of the registry, with the pod's credentials)."""
    repository, digest = release.image(flavor).split("/", 1)[1].split("@")
    uri = f"/v2/{repository}/manifests/{digest}"
    return [r for r in containerd_requests(release, ("GET", "HEAD"), uri) if r["http.request.uri"] == uri]


def blob_fetches(release: Release, flavor: str) -> list[str]:
    """The digests of `flavor`'s blobs containerd fetched from the registry (completed GETs)."""
    repository = release.image(flavor).split("/", 1)[1].split("@")[0]
    prefix = f"/v2/{repository}/blobs/"
    return [r["http.request.uri"][len(prefix) :] for r in containerd_requests(release, ("GET",), prefix)]


def released_layers(release: Release, flavor: str) -> list[str]:
    """The layer digests of `flavor`'s released manifest, read from the registry."""
    host, rest = release.image(flavor).split("/", 1)
    repository, digest = rest.split("@")
    req = urllib.request.Request(f"https://{host}/v2/{repository}/manifests/{digest}")
    req.add_header("Authorization", f"Basic {basic_auth(release.registry.user, release.registry.password)}")
    req.add_header(
        "Accept", "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    )
    with urllib.request.urlopen(req, timeout=30, context=release.registry.ssl_context()) as r:
        return [layer["digest"] for layer in json.loads(r.read())["layers"]]


def _pulled_events(kubectl: Kubectl, ns: str, ref: str) -> dict[str, str]:
    """pod -> node, for the kubelets' "Successfully pulled image <ref>" events in `ns` (not "already present")."""
    events = json.loads(kubectl("-n", ns, "get", "events", "-o", "json").stdout)["items"]
    return {
        e["involvedObject"]["name"]: (e.get("source") or {}).get("host") or e.get("reportingInstance", "")
        for e in events
        if e.get("reason") == "Pulled" and f'Successfully pulled image "{ref}"' in e.get("message", "")
    }


@pytest.fixture
def pull_namespace(kubectl: Kubectl, release: Release) -> Iterator[str]:
    """A restricted namespace with the registry's pull Secret, which its default ServiceAccount does NOT hold."""
    name = f"pull-{uuid.uuid4().hex[:6]}"
    restricted_namespace(kubectl, name)
    kubectl("apply", "-f", "-", input=json.dumps(release.pull_secret(name)))
    try:
        yield name
    finally:
        delete_namespace(kubectl, name)


def test_the_operator_pod_pulled_its_released_image_by_digest_with_its_pull_secret(
    kubectl: Kubectl, operator: str, release: Release
) -> None:
    """The release fixture removed every earlier copy of the operator image from the nodes, so its pod's image
    came from the registry: the pod names it by the released digest, the kubelet says it pulled it, and the
    registry logged containerd's GET of that manifest as user ftjob."""
    ref = release.image("operator")
    pods = json.loads(kubectl("-n", OPERATOR_NS, "get", "pods", "-o", "json").stdout)["items"]
    assert pods and all(p["spec"]["containers"][0]["image"] == ref for p in pods), [
        p["spec"]["containers"][0]["image"] for p in pods
    ]
    assert all(p["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}] for p in pods)
    assert _pulled_events(kubectl, OPERATOR_NS, ref), "no kubelet event says it pulled " + ref
    pulls = manifest_pulls(release, "operator")
    assert pulls and all(p.get("auth.user.name") == release.registry.user for p in pulls), pulls
    assert all(p.get("http.response.status") == "200" for p in pulls), pulls


def test_rank_pods_on_both_nodes_pull_the_runtime_image_through_the_jobs_pull_secret(
    kubectl: Kubectl, operator: str, release: Release, pull_namespace: str
) -> None:
    """A two-rank job, one whole-node rank pod on each node, whose spec.podTemplate.imagePullSecrets names the
    Secret: both pods run the released runtime image by digest, each node's containerd fetched its manifest from
    the registry as user ftjob (the registry's log, by client address: node A's and node B's), and the job
    Succeeds. The cpu image's layers were warmed up by `ctr import`; the manifest still came from the registry."""
    ns = pull_namespace
    ref = release.image("cpu")
    before = len(manifest_pulls(release, "cpu"))
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(JOB))

    def finished() -> dict[str, Any] | None:
        job = json.loads(kubectl("-n", ns, "get", "ftj", "pulled", "-o", "json").stdout)
        return job if (job.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    job = wait_for(finished, timeout=600, interval=2.0, message="job pulled to finish")
    pods = {
        p["metadata"]["name"]: p for p in json.loads(kubectl("-n", ns, "get", "pods", "-o", "json").stdout)["items"]
    }
    assert job["status"]["phase"] == "Succeeded", (job["status"], {n: p.get("status") for n, p in pods.items()})
    assert {p["spec"]["nodeName"] for p in pods.values()} == {node.NODE_A.name, node.NODE_B.name}
    for p in pods.values():
        assert p["spec"]["containers"][0]["image"] == ref
        assert p["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}]
        assert p["status"]["containerStatuses"][0]["imageID"].endswith(ref.split("@")[1]), p["status"]
    pulled = _pulled_events(kubectl, ns, ref)
    assert sorted(pulled.values()) == sorted([node.NODE_A.name, node.NODE_B.name]), pulled
    pulls = manifest_pulls(release, "cpu")[before:]
    clients = {p["http.request.remoteaddr"].rsplit(":", 1)[0] for p in pulls}
    assert clients >= {node.NODE_A.ip, node.NODE_B.ip}, pulls
    assert all(p.get("auth.user.name") == release.registry.user for p in pulls), pulls
    # The warm-up import left every layer unpacked (same diffIDs): containerd fetched the config, no layer.
    layers = set(released_layers(release, "cpu"))
    assert not layers & set(blob_fetches(release, "cpu")), "containerd fetched layers the warm-up had unpacked"


def test_a_pod_without_the_pull_secret_is_refused_by_the_registry(
    kubectl: Kubectl, operator: str, release: Release, pull_namespace: str
) -> None:
    """The nodes hold no registry credentials of their own: a pod that names no pull Secret (imagePullPolicy Always,
    so the kubelet asks the registry even where the node has the image) fails to pull, the registry answering 401."""
    ns = pull_namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "anonymous"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": release.image("cpu"),
                    "imagePullPolicy": "Always",
                    "command": ["true"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(pod))

    def refused() -> str | None:
        events = json.loads(kubectl("-n", ns, "get", "events", "-o", "json").stdout)["items"]
        for e in events:
            if e["involvedObject"].get("name") == "anonymous" and e.get("reason") == "Failed":
                return str(e.get("message", ""))
        return None

    message = wait_for(refused, timeout=180, interval=2.0, message="the anonymous pull to fail")
    assert "401" in message or "nauthorized" in message, message
    status = json.loads(kubectl("-n", ns, "get", "pod", "anonymous", "-o", "json").stdout)["status"]
    waiting = (status.get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {})
    assert waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"), status
