"""The generated CRD: structural, documented everywhere, printer columns, CEL rules for every rule."""

from __future__ import annotations

from typing import Any

from finetune_operator.admission import all_rules
from finetune_operator.crd import crd


def _walk(node: dict[str, Any], path: str, out: list[str]) -> None:
    if path and "description" not in node and path not in ("metadata", "apiVersion", "kind"):
        out.append(path)
    for k, sub in (node.get("properties") or {}).items():
        _walk(sub, f"{path}.{k}" if path else k, out)
    if isinstance(node.get("items"), dict) and node["items"].get("properties"):
        _walk(node["items"], f"{path}[]", out)


def test_every_field_is_described_for_kubectl_explain() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing: list[str] = []
    _walk(schema, "", missing)
    assert missing == []


def test_identity_columns_and_status_subresource() -> None:
    c = crd()
    assert c["metadata"]["name"] == "finetunejobs.finetune.dev"
    assert c["spec"]["names"]["shortNames"] == ["ftj"]
    v = c["spec"]["versions"][0]
    assert v["subresources"] == {"status": {}}
    assert [col["name"] for col in v["additionalPrinterColumns"]] == [
        "Profile",
        "Nodes",
        "Phase",
        "Progress",
        "Throughput",
        "Restarts",
        "Age",
    ]


def _cel_rules(node: Any, out: list[str]) -> list[str]:
    if isinstance(node, dict):
        out += [v["rule"] for v in node.get("x-kubernetes-validations", [])]
        for sub in node.values():
            _cel_rules(sub, out)
    elif isinstance(node, list):
        for sub in node:
            _cel_rules(sub, out)
    return out


def test_every_rule_has_its_cel_twin_in_the_crd_or_the_admission_policy() -> None:
    from finetune_operator.crd import admission_policy

    rules = _cel_rules(crd(), [])
    policy, binding = admission_policy()
    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    for rule in all_rules():
        assert rule.cel in (expressions if rule.admission_policy else rules), rule.id
        assert (rule.cel in rules) != rule.admission_policy, rule.id
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (match,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert match["resources"] == ["finetunejobs"] and match["operations"] == ["CREATE", "UPDATE"]


def test_ftjob_admission_policy_prints_the_policy_and_its_binding() -> None:
    import yaml

    from finetune_operator.crd import admission_policy_yaml, crd_yaml

    assert [d["kind"] for d in yaml.safe_load_all(crd_yaml())] == ["CustomResourceDefinition"]
    kinds = [d["kind"] for d in yaml.safe_load_all(admission_policy_yaml())]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_the_kueue_label_rule_runs_in_the_admission_policy() -> None:
    """A CRD's CEL sees no metadata but the name: the label rule must live in the ValidatingAdmissionPolicy."""
    (rule,) = [r for r in all_rules() if r.admission_policy]
    assert rule.id == "no-kueue-queue-label" and "object.metadata.labels" in rule.cel
    assert "spec.runPolicy.queueName" in rule.message


def test_every_integer_of_the_spec_is_refused_as_a_float() -> None:
    from finetune_operator.crd import WHOLE_NUMBER

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "integer" and WHOLE_NUMBER not in node.get("x-kubernetes-validations", []):
            missing.append(path)
        for k, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{k}")
        for k in ("items", "additionalProperties"):
            if isinstance(node.get(k), dict):
                walk(node[k], f"{path}.{k}")

    walk(spec, "spec")
    assert missing == []


def test_transition_rules_make_the_spec_blocks_immutable_and_freeze_the_queue_once_admitted() -> None:
    ids = {r.id for r in all_rules() if r.transition}
    blocks = ("hardware", "task", "launcher", "mpi", "training", "output", "compileCache", "command", "podTemplate")
    assert ids == {f"{b}-immutable" for b in blocks} | {"queue-name-frozen-once-admitted"}
    (queue,) = [r for r in all_rules() if r.id == "queue-name-frozen-once-admitted"]
    assert queue.scope == "" and "oldSelf.status" in queue.cel  # reads the stored status: root scope
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    entry = next(v for v in root if v["rule"] == queue.cel)
    assert entry["fieldPath"] == ".spec.runPolicy.queueName"


def test_api_reference_is_generated() -> None:
    from pathlib import Path

    from finetune_operator.apidoc import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "api.md"
    assert doc.read_text() == render(), "docs/api.md is stale: run `.venv/bin/ftjob api-docs > docs/api.md`"


def test_migration_guide_names_only_real_fields() -> None:
    """The hand-written PyTorchJob/MPIJob section of docs/api.md names `spec.*` paths the schema has."""
    import re

    from finetune_operator.api.schema import SPEC
    from finetune_operator.apidoc import MIGRATION

    def paths(node: dict[str, Any], prefix: str) -> set[str]:
        out = {prefix}
        for k, sub in (node.get("properties") or {}).items():
            out |= paths(sub, f"{prefix}.{k}")
        return out

    named = set(re.findall(r"`(spec(?:\.\w+)+)", MIGRATION))
    assert {"spec.command", "spec.mpi.slotsPerNode", "spec.runPolicy.queueName"} <= named
    assert named <= paths(SPEC, "spec"), sorted(named - paths(SPEC, "spec"))
    # Every field of spec.podTemplate has its row (issue 24: what a Kubeflow user's template becomes).
    template = paths(SPEC["properties"]["podTemplate"], "spec.podTemplate") - {"spec.podTemplate"}
    assert template <= named, sorted(template - named)


def test_every_pattern_and_rule_is_printable_ascii() -> None:
    """YAML tools disagree on raw control or separator characters in a string (kustomize drops a NEL): the CRD
    spells them with RE2 escapes, so every copy of it means the same."""
    from finetune_operator.crd import admission_policy

    def strings(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [s for k, v in node.items() if k in ("pattern", "rule", "expression") for s in [v]] + [
                s for v in node.values() for s in strings(v)
            ]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return []

    found = strings(crd()) + strings(admission_policy())
    assert len(found) > 50
    assert [s for s in found if not (s.isascii() and s.isprintable())] == []
