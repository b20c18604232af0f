"""The CustomResourceDefinition, generated from api/schema.py plus every rule's CEL twin, and the
ValidatingAdmissionPolicy (with its binding) for the rules a CRD cannot state: a CRD's CEL sees no metadata but
the name, so a rule on labels runs as an admission policy on finetunejobs.

`ftjob crd` prints the CRD, `ftjob admission-policy` the policy and its binding; manifests/crd/ and the chart
(crd/ and admission/, which its templates read) hold generated copies checked for drift.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from .admission import all_rules
from .api.schema import openapi_schema
from .constants import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION

_LABELS = {"app.kubernetes.io/name": "finetune-operator", "app.kubernetes.io/part-of": "finetune-operator"}


def _node(schema: dict[str, Any], scope: str) -> dict[str, Any]:
    node = schema
    for part in [p for p in scope.split(".") if p]:
        node = node["properties"][part]
    return node


# On every integer of the spec: the API server takes 2.0 where the schema says integer, but a CEL rule that reads
# it fails ("expected int, got float64"), so whether such a spec passed would depend on which rules read which
# field. A rule on the integer itself refuses it everywhere, as `ftjob render` does (api/validation.py).
WHOLE_NUMBER = {
    "rule": "type(self) == int",
    "message": "must be a whole number, written without a fraction (2, not 2.0)",
}


def _whole_numbers(node: dict[str, Any]) -> None:
    if node.get("type") == "integer":
        node.setdefault("x-kubernetes-validations", []).append(dict(WHOLE_NUMBER))
    for sub in (node.get("properties") or {}).values():
        _whole_numbers(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _whole_numbers(node[key])


def crd() -> dict[str, Any]:
    schema = copy.deepcopy(openapi_schema())
    _whole_numbers(schema["properties"]["spec"])
    for rule in all_rules():
        if rule.admission_policy:
            continue
        entry: dict[str, Any] = {"rule": rule.cel, "message": rule.message.split("\n")[0]}
        # fieldPath is relative to the node and must name a field of the schema, which metadata.name is not.
        if rule.field and not rule.field.startswith(".metadata."):
            entry["fieldPath"] = rule.field
        if rule.id == "instance-type-known":
            entry["message"] = rule.message.replace("\n", " ").replace("  ", " ")
        _node(schema, rule.scope).setdefault("x-kubernetes-validations", []).append(entry)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": dict(_LABELS),
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "finetune"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": schema},
                    "additionalPrinterColumns": [
                        {"name": "Profile", "type": "string", "jsonPath": ".spec.hardware.profile"},
                        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.hardware.nodes"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary"},
                        {"name": "Throughput", "type": "string", "jsonPath": ".status.throughput.summary"},
                        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restartCount"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def admission_policy() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy of the rules marked admission_policy, and the binding that enforces it
    (Deny) for every namespace. Kubernetes 1.30 or newer (admissionregistration.k8s.io/v1)."""
    name = f"{PLURAL}.{GROUP}"
    meta = {"name": name, "labels": dict(_LABELS)}
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": meta,
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [PLURAL],
                    }
                ]
            },
            "validations": [
                {"expression": r.cel, "message": r.message, "reason": "Invalid"}
                for r in all_rules()
                if r.admission_policy
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": copy.deepcopy(meta),
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def crd_yaml() -> str:
    header = "# Generated by `ftjob crd` from operator/finetune_operator/api/schema.py — do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


def admission_policy_yaml() -> str:
    header = "# Generated by `ftjob admission-policy` from operator/finetune_operator/api/rules.py — do not edit.\n"
    return header + yaml.safe_dump_all(admission_policy(), sort_keys=False, width=120)
