"""`kubectl apply -k manifests/` installs the same objects as the chart with default values."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

from chartlib import MANIFESTS, NAMESPACE, RELEASE, Manifest, Renderer, Values, identities, load_all

# Labels only Helm sets: the chart version label and managed-by=Helm (kubectl users have neither).
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
# The pod-template checksum lets `helm upgrade` roll the pod on a config change; kubectl has no equivalent.
HELM_ONLY_POD_ANNOTATIONS = ("checksum/config",)
# helm.sh/resource-policy (crds.keep) tells `helm uninstall` to leave the CRD; kubectl has no uninstall.
HELM_ONLY_ANNOTATIONS = ("helm.sh/resource-policy",)


# Cluster-scoped kinds kustomize (kubectl's) does not know, so its namespace transformer stamps the namespace
# on them; the API server drops a namespace on a cluster-scoped object (test_install applies them for real).
UNKNOWN_CLUSTER_SCOPED = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def normalized(obj: Manifest) -> Manifest:
    out = copy.deepcopy(obj)
    if out["kind"] in UNKNOWN_CLUSTER_SCOPED:
        out["metadata"].pop("namespace", None)
    labels = out["metadata"].get("labels", {})
    for key in HELM_ONLY_LABELS:
        labels.pop(key, None)
    annotations = out["metadata"].get("annotations", {})
    for key in HELM_ONLY_ANNOTATIONS:
        annotations.pop(key, None)
    if "annotations" in out["metadata"] and not annotations:
        del out["metadata"]["annotations"]
    template = out.get("spec", {}).get("template")
    if isinstance(template, dict):
        annotations = template["metadata"].get("annotations", {})
        for key in HELM_ONLY_POD_ANNOTATIONS:
            annotations.pop(key, None)
        if not annotations:
            template["metadata"].pop("annotations", None)
    return out


def by_identity(objs: list[Manifest]) -> dict[tuple[str, str, str], Manifest]:
    return {
        (o["kind"], normalized(o)["metadata"].get("namespace", ""), o["metadata"]["name"]): normalized(o) for o in objs
    }


def kustomize(kubectl: str, path: Path = MANIFESTS) -> list[Manifest]:
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return load_all(out.stdout)


def test_kustomize_matches_default_chart_render(render: Renderer, kubectl: str) -> None:
    chart = by_identity(render.run(extra=["--include-crds"]).objects)
    kust = by_identity(kustomize(kubectl))
    # The Namespace is the one addition: Helm leaves it to `helm install --create-namespace`.
    namespace = kust.pop(("Namespace", "", NAMESPACE))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert sorted(kust) == sorted(chart)
    for ident, obj in chart.items():
        assert kust[ident] == obj, f"{ident} differs between charts/ and manifests/"


def test_kustomize_overlay_can_move_the_namespace(kubectl: str, tmp_path: Path) -> None:
    """kustomize's namespace transformer must also rewrite the bindings' subjects, or RBAC breaks."""
    overlay = tmp_path
    (overlay / "kustomization.yaml").write_text(
        f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: ml-ops\n"
        f"resources:\n  - {os.path.relpath(MANIFESTS, overlay)}\n"
    )
    out = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    objs = load_all(out.stdout)
    namespaced = [o for o in objs if "namespace" in o["metadata"]]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"ml-ops"}
    for binding in (o for o in objs if o["kind"] == "ClusterRoleBinding"):
        assert binding["subjects"][0]["namespace"] == "ml-ops"
    assert ("Namespace", "", "ml-ops") in identities(objs)


def test_namespaced_overlay_grants_what_the_chart_grants_in_namespaced_mode(render: Renderer, kubectl: str) -> None:
    """manifests/overlays/namespaced equals the chart with watchNamespaces={ml-team}, except that the
    per-namespace rules reach ml-team through a RoleBinding to the base's ClusterRole rather than a Role copy."""
    chart = by_identity(render.run(Values().namespaced("ml-team"), extra=["--include-crds"]).objects)
    kust = by_identity(kustomize(kubectl, MANIFESTS / "overlays" / "namespaced"))
    assert kust.pop(("Namespace", "", NAMESPACE))
    assert kust.pop(("Namespace", "", "ml-team"))
    role = chart.pop(("Role", "ml-team", RELEASE))
    rules_holder = kust.pop(("ClusterRole", "", RELEASE))
    assert rules_holder["rules"] == role["rules"]
    chart_binding = chart.pop(("RoleBinding", "ml-team", RELEASE))
    binding = kust.pop(("RoleBinding", "ml-team", RELEASE))
    assert binding["roleRef"] == {**chart_binding["roleRef"], "kind": "ClusterRole"}
    assert binding["subjects"] == chart_binding["subjects"]
    # Nothing grants the per-namespace rules cluster-wide.
    assert ("ClusterRoleBinding", "", RELEASE) not in kust
    assert sorted(kust) == sorted(chart)
    for ident, obj in chart.items():
        assert kust[ident] == obj, f"{ident} differs between the chart in namespaced mode and the overlay"
