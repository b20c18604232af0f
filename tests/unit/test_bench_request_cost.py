"""The pure part of `make bench-request-cost`: the CRD variants it installs to price a cheaper CRD. The costs
themselves are measured by the benchmark, never asserted here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import request_cost

from finetune_operator.crd import crd

ROOT = Path(__file__).resolve().parents[2]


def _schema(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


def test_the_shipped_variant_is_the_crd_and_the_others_drop_only_what_they_name() -> None:
    assert request_cost.crd_variant("shipped") == crd()
    shipped, no_cel = _schema(crd()), _schema(request_cost.crd_variant("no CEL rules"))
    assert "x-kubernetes-validations" in json.dumps(shipped)
    assert "x-kubernetes-validations" not in json.dumps(no_cel)
    # the structural schema is otherwise untouched: the same fields, types and defaults
    without_rules = json.loads(
        json.dumps(shipped), object_hook=lambda d: {k: v for k, v in d.items() if k != "x-kubernetes-validations"}
    )
    assert no_cel == without_rules
    bare = _schema(request_cost.crd_variant("no schema"))
    assert bare["properties"]["spec"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert bare["properties"]["status"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert "x-kubernetes-validations" not in json.dumps(bare)
    # the variants never change the CRD the operator installs
    assert request_cost.crd_variant("no schema") != crd() and "x-kubernetes-validations" in json.dumps(crd())
