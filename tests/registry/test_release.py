"""`make release` into the local registry: hack/release.py builds the operator image (from the build cache),
pushes it, packages the chart with its digest as the default and pushes that to oci://; the chart read back from
the registry names the image by a digest the registry serves.

The operator image only: the cpu image (several GB) is built and pushed by the same loop, one flavor more, but
its push (every layer gzip-compressed by the Docker daemon) would cost this tier minutes on a shared machine for
no other code path; the runtime images' digests in the chart are checked by tests/unit/test_release.py and
tests/chart/test_render.py. benchmarks/README.md has the measured push time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml
from registry_clients import Client
from test_registry import MANIFEST_TYPES, manifest_digest

from ftjob_cluster import bins
from ftjob_cluster.registry import Registry, basic_auth

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()
PREFIX = "ftjob-release"
OPERATOR = "finetune-operator/operator"


def test_release_pushes_the_operator_and_a_chart_that_names_it_by_digest(
    registry: Registry, docker: Client, helm: Client, tmp_path: Path
) -> None:
    ca = str(registry.ca_cert)
    docker.run("login", registry.host, "--username", registry.user, "--password-stdin", input=registry.password)
    helm.run(
        "registry", "login", registry.host, "--username", registry.user, "--password-stdin", "--ca-file", ca,
        input=registry.password,
    )  # fmt: skip
    target = f"{registry.host}/{PREFIX}"
    out = tmp_path / "release"
    helm_bin = str(bins.ensure_binary("helm"))
    cmd = [sys.executable, str(ROOT / "hack" / "release.py"), "release", "--registry", target, "--images", "operator"]
    cmd += ["--helm", helm_bin, "--ca-file", ca, "--out", str(out), "--docker", docker.binary]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**docker.env, **helm.env}, timeout=1800)
    finally:
        # The release tags the image with the registry's name to push it; that name dies with this registry.
        docker.run("rmi", f"{target}/{OPERATOR}:{VERSION}", check=False)
    assert proc.returncode == 0, proc.stderr[-6000:]

    record = json.loads((out / VERSION / "release.json").read_text())
    assert record["version"] == VERSION and record["platform"] == "linux/amd64"
    digest = record["images"][OPERATOR]["digest"]
    auth = basic_auth(registry.user, registry.password)
    # The registry serves the pushed tag under the recorded digest.
    assert manifest_digest(registry, f"{PREFIX}/{OPERATOR}", VERSION, auth) == digest
    chart_ref = f"oci://{target}/charts/finetune-operator"
    assert record["chart"]["ref"] == chart_ref
    assert manifest_digest(registry, f"{PREFIX}/charts/finetune-operator", VERSION, auth) == record["chart"]["digest"]

    # What a user sees of the pushed chart: digest defaults, the tag kept as the fallback for hand builds.
    values = yaml.safe_load(helm.run("show", "values", chart_ref, "--version", VERSION, "--ca-file", ca).stdout)
    assert values["operator"]["image"]["repository"] == f"{target}/{OPERATOR}"
    assert values["operator"]["image"]["digest"] == digest
    assert values["operator"]["image"]["tag"] == ""
    assert values["runtimeImages"] == {"registry": target, "tag": "", "digests": {}}

    rendered = helm.run("template", "rel", chart_ref, "--version", VERSION, "--ca-file", ca).stdout
    deployments = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    (image,) = {c["image"] for d in deployments for c in d["spec"]["template"]["spec"]["containers"]}
    assert image == f"{target}/{OPERATOR}@{digest}"
    # The reference the pods would pull resolves at the registry, by digest, to that same manifest.
    assert manifest_digest(registry, f"{PREFIX}/{OPERATOR}", digest, auth) == digest
    # And it is the image built here: the manifest's config is the image Docker built (its ID).
    req = urllib.request.Request(f"https://{registry.host}/v2/{PREFIX}/{OPERATOR}/manifests/{digest}")
    req.add_header("Accept", MANIFEST_TYPES)
    req.add_header("Authorization", f"Basic {auth}")
    with urllib.request.urlopen(req, timeout=10, context=registry.ssl_context()) as r:
        manifest = json.load(r)
    built = docker.run("image", "inspect", "--format", "{{.Id}}", f"{OPERATOR}:{VERSION}").stdout.strip()
    assert manifest["config"]["digest"] == built
