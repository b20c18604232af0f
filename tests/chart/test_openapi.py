"""Every rendered object validates against the Kubernetes OpenAPI schema of the pinned release.

kubernetes-validate (PyPI) ships the upstream JSON schemas per minor release; the strict variant also
rejects unknown fields, which the API server would silently drop (a misspelt securityContext field is
exactly the bug that lets a pod run with weaker settings than intended).
"""

from __future__ import annotations

import subprocess
from typing import Any

import kubernetes_validate
import pytest
from chartlib import CHART, MANIFESTS, Manifest, Renderer, Values, load_all

# Custom kinds from other projects have no upstream schema; they are checked by test_render instead.
# ServiceMonitor belongs to prometheus-operator's CRDs, which are not vendored here.
FOREIGN_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

RENDERS: list[tuple[str, Values]] = [
    ("default", Values()),
    ("namespaced", Values().namespaced("team-a", "team-b")),
    ("all features", Values().namespaced("team-a").cache_pvc().service_monitor().network_policy()),
    ("two replicas", Values().set({"replicaCount": 2})),  # the PodDisruptionBudget and the anti-affinity
    (
        "non-default",
        Values()
        .set({"operator": {"imagePullSecrets": [{"name": "regcred"}], "tolerations": [{"operator": "Exists"}]}})
        .network_policy(extraIngress=[{"from": [{"namespaceSelector": {}}], "ports": [{"port": 9100}]}]),
    ),
]


def minor(version: str) -> str:
    return ".".join(version.lstrip("v").split(".")[:2])


def validate_all(objs: list[Manifest], k8s_version: str) -> list[str]:
    """Returns the identities validated; raises on the first invalid object."""
    checked = []
    for obj in objs:
        ident = f"{obj['kind']}/{obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in FOREIGN_KINDS:
            continue
        try:
            used: Any = kubernetes_validate.validate(obj, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{ident} is invalid for Kubernetes {k8s_version}: {err.message} at {list(err.path)}")
        # validate() silently falls back to an older schema; insist on the pinned minor itself.
        assert used == minor(k8s_version), f"{ident} validated against {used}, not {k8s_version}"
        checked.append(ident)
    return checked


@pytest.mark.parametrize(("case", "values"), RENDERS, ids=[c[0] for c in RENDERS])
def test_rendered_chart_is_valid_openapi(render: Renderer, k8s_version: str, case: str, values: Values) -> None:
    objs = render(values)
    checked = validate_all(objs, k8s_version)
    skipped = [o["kind"] for o in objs if (o["apiVersion"], o["kind"]) in FOREIGN_KINDS]
    assert len(checked) + len(skipped) == len(objs)
    assert len(checked) >= 8, case


def test_chart_crds_are_valid_openapi(k8s_version: str) -> None:
    crds = [obj for path in sorted((CHART / "crd").glob("*.yaml")) for obj in load_all(path.read_text())]
    if not crds:
        pytest.fail("charts/finetune-operator/crd/ is empty: run `make generate`")
    assert validate_all(crds, k8s_version)


@pytest.mark.parametrize("root", ["", "overlays/namespaced"])
def test_kustomize_output_is_valid_openapi(kubectl: str, k8s_version: str, root: str) -> None:
    out = subprocess.run([kubectl, "kustomize", str(MANIFESTS / root)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    objs = load_all(out.stdout)
    assert len(validate_all(objs, k8s_version)) == len(objs)


def test_validation_catches_a_misspelt_security_field(render: Renderer, k8s_version: str) -> None:
    """The strict schema really rejects what the API server would drop (guards against a no-op check)."""
    objs = render()
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFileSystem"] = container["securityContext"].pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, k8s_version, strict=True)
