"""The operator's allowlists (policy.py): what breaks them, how the job ends, and what the config may hold."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from ftjobs import make_job

from finetune_operator.admission import validate
from finetune_operator.policy import check_config, violations
from finetune_operator.reconcile import Observed, reconcile

POLICY = {
    "policy": {
        "allowedImages": ["registry.example.com/team/*"],
        "allowedServiceAccounts": ["trainer", "default"],
        "allowedSecrets": ["hf-*"],
    }
}


def job(**spec: Any) -> dict[str, Any]:
    b = make_job("j", "ns").nodes(2).classification()
    for k, v in spec.items():
        b.set(f"spec.{k}", v)
    out = validate(b.build())
    out["metadata"]["uid"] = "uid-1"
    out["status"] = {}
    return out


def test_no_policy_allows_everything() -> None:
    assert violations(job(image="evil.example.com/x:1", serviceAccountName="admin")["spec"], {}) == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"image": "docker.io/evil/miner:1"}, "spec.image"),
        ({"image": "registry.example.com/teamX/y:1"}, "spec.image"),  # a glob, not a bare prefix: team/ != teamX
        ({"serviceAccountName": "cluster-admin-sa"}, "spec.serviceAccountName"),
        ({"hfTokenSecretRef": {"name": "db-password"}}, "spec.hfTokenSecretRef.name"),
        ({"envFrom": [{"secretRef": {"name": "aws-root"}}]}, "spec.envFrom[0].secretRef.name"),
        (
            {"env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}}]},
            "spec.env[0].valueFrom.secretKeyRef.name",
        ),
    ],
)
def test_each_breach_names_its_field_value_and_allowlist(spec: dict[str, Any], field: str) -> None:
    (msg,) = violations(job(**spec)["spec"], POLICY)
    assert msg.startswith(field + " ") and "policy.allowed" in msg and ": " in msg


def test_allowed_job_passes_and_default_service_account_counts_as_default() -> None:
    ok = job(image="registry.example.com/team/cpu:2", hfTokenSecretRef={"name": "hf-token"})
    assert violations(ok["spec"], POLICY) == []
    only_trainer = {"policy": {"allowedServiceAccounts": ["trainer"]}}
    (msg,) = violations(job()["spec"], only_trainer)
    assert "spec.serviceAccountName 'default'" in msg


def test_breach_fails_the_job_before_any_child_is_created() -> None:
    plan = reconcile(job(image="docker.io/evil/miner:1"), Observed([], {}, datetime(2026, 12, 3)), POLICY)
    assert plan.create == []
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "PolicyViolation"
    assert "spec.image 'docker.io/evil/miner:1'" in plan.status["message"]
    assert ("Warning", "PolicyViolation", plan.status["message"]) in plan.events
    assert {c["type"]: c["status"] for c in plan.status["conditions"]}["Failed"] == "True"


def test_bad_config_is_refused_naming_the_key() -> None:
    assert check_config({"policy": {"allowedImage": ["x"]}}) == [
        "policy.allowedImage: unknown key (known: allowedImages, allowedServiceAccounts, allowedSecrets)"
    ]
    assert "policy.allowedImages: expected a list" in check_config({"policy": {"allowedImages": "x/*"}})[0]
    assert check_config(POLICY) == []
