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
    assert violations(job(image="evil.example.com/x:1", serviceAccountName="admin")["spec"], {}, "ns") == []


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
        (
            {"podTemplate": {"imagePullSecrets": [{"name": "prod-registry"}]}},
            "spec.podTemplate.imagePullSecrets[0].name",
        ),
    ],
)
def test_each_breach_names_its_field_value_and_allowlist(spec: dict[str, Any], field: str) -> None:
    (msg,) = violations(job(**spec)["spec"], POLICY, "ns")
    assert msg.startswith(field + " ") and "policy.allowed" in msg and ": " in msg


def test_allowed_job_passes_and_default_service_account_counts_as_default() -> None:
    ok = job(image="registry.example.com/team/cpu:2", hfTokenSecretRef={"name": "hf-token"})
    assert violations(ok["spec"], POLICY, "ns") == []
    only_trainer = {"policy": {"allowedServiceAccounts": ["trainer"]}}
    (msg,) = violations(job()["spec"], only_trainer, "ns")
    assert "spec.serviceAccountName 'default'" in msg


def test_breach_fails_the_job_before_any_child_is_created() -> None:
    plan = reconcile(job(image="docker.io/evil/miner:1"), Observed([], {}, datetime(2026, 12, 3)), POLICY)
    assert plan.create == []
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "PolicyViolation"
    assert "spec.image 'docker.io/evil/miner:1'" in plan.status["message"]
    assert ("Warning", "PolicyViolation", plan.status["message"]) in plan.events
    assert {c["type"]: c["status"] for c in plan.status["conditions"]}["Failed"] == "True"


def test_bad_config_is_refused_naming_the_key() -> None:
    (msg,) = check_config({"policy": {"allowedImage": ["x"]}})
    assert msg.startswith("policy.allowedImage: unknown key (known: allowedImages, allowedServiceAccounts")
    assert "policy.allowedImages: expected a list" in check_config({"policy": {"allowedImages": "x/*"}})[0]
    assert check_config(POLICY) == []
    assert check_config(FULL) == []
    for bad, where in (
        ({"allowedClaims": "x"}, "policy.allowedClaims: expected a list"),
        ({"allowedClaims": [{"claims": []}]}, "policy.allowedClaims[0].claims"),
        ({"allowedClaims": [{"claims": ["c"], "purposes": ["scratch"]}]}, "policy.allowedClaims[0].purposes"),
        ({"allowedClaims": [{"claims": ["c"], "namespace": ["a"]}]}, "policy.allowedClaims[0].namespace"),
        ({"allowedTolerationKeys": [""]}, "policy.allowedTolerationKeys"),
        ({"queueRequiredNamespaces": "team-*"}, "policy.queueRequiredNamespaces"),
    ):
        assert any(m.startswith(where) for m in check_config({"policy": bad})), (bad, check_config({"policy": bad}))


# --- issue 23: claims by namespace and purpose, scheduling fields, required queues ------------------------------

FULL = {
    "policy": {
        "allowedClaims": [
            {"namespaces": ["team-a"], "claims": ["team-a-results"], "purposes": ["output"]},
            {"claims": ["shared-cache"], "purposes": ["compileCache"]},
        ],
        "allowedTolerationKeys": ["nvidia.com/gpu", "team-a/*"],
        "allowedNodeLabels": ["node.kubernetes.io/instance-type=*", "pool=team-a-*", "zone"],
        "allowedSchedulerNames": ["neuron-scheduler"],
        "queueRequiredNamespaces": ["team-*"],
    }
}


def test_the_new_lists_allow_everything_when_empty() -> None:
    spec = job(
        compileCache={"claimName": "results"},
        hardware={"profile": "cpu", "tolerations": [{"operator": "Exists"}], "schedulerName": "any"},
    )["spec"]
    assert violations(spec, {}, "ns") == []
    assert violations(spec, {"policy": {k: [] for k in FULL["policy"]}}, "ns") == []


def test_claims_are_allowed_per_namespace_and_purpose() -> None:
    ok = job(
        output={"claimName": "team-a-results"}, compileCache={"claimName": "shared-cache"}, runPolicy={"queueName": "q"}
    )
    assert violations(ok["spec"], FULL, "team-a") == []
    # The output claim as a cache: the cross-tenant read of issue 23.
    (msg,) = violations(
        job(
            output={"claimName": "team-a-results"},
            compileCache={"claimName": "team-a-results"},
            runPolicy={"queueName": "q"},
        )["spec"],
        FULL,
        "team-a",
    )
    assert msg.startswith("spec.compileCache.claimName 'team-a-results' is not allowed for compileCache")
    assert "e.g. shared-cache" in msg
    # The same claim name in another namespace is another claim, not listed there.
    (msg,) = violations(ok["spec"], FULL, "team-b")
    assert msg.startswith("spec.output.claimName 'team-a-results' is not allowed for output in namespace 'team-b'")


def test_scheduling_fields_are_checked_against_their_lists() -> None:
    spec = job(
        output={"claimName": "team-a-results"},
        runPolicy={"queueName": "q"},
        hardware={
            "profile": "cpu",
            "nodes": 2,
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists"},
                {"operator": "Exists"},
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
            ],
            "nodeSelector": {"pool": "team-a-big", "node-role.kubernetes.io/control-plane": ""},
            "schedulerName": "my-scheduler",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]},
                                    {"key": "pool", "operator": "Exists"},
                                    {"key": "pool", "operator": "In", "values": ["reserved"]},
                                ]
                            }
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 1,
                            "preference": {
                                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]
                            },
                        }
                    ],
                }
            },
        },
    )["spec"]
    msgs = violations(spec, FULL, "team-a")
    fields = [m.split(" ")[0] for m in msgs]
    assert fields == [
        "spec.hardware.tolerations[1]",
        "spec.hardware.tolerations[2]",
        "spec.hardware.nodeSelector[node-role.kubernetes.io/control-plane]",
        "spec.hardware.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[1]",
        "spec.hardware.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[2]",
        "spec.hardware.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchFields[0]",
        "spec.hardware.schedulerName",
    ], msgs
    assert "an empty key (every taint)" in msgs[0]
    assert "'any value of pool'" in msgs[3]


def test_a_malformed_affinity_never_raises_in_the_policy() -> None:
    for affinity in (
        {"nodeAffinity": "x"},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [1, {"preference": 2}]}},
    ):
        spec = job(hardware={"profile": "cpu", "affinity": affinity}, runPolicy={"queueName": "q"})["spec"]
        violations(spec, FULL, "team-a")


def test_a_namespace_can_require_a_queue() -> None:
    (msg,) = violations(job(output={"claimName": "team-a-results"})["spec"], FULL, "team-a")
    assert msg.startswith("spec.runPolicy.queueName is required in namespace 'team-a'")
    assert (
        violations(
            job(output={"claimName": "team-a-results"})["spec"],
            {"policy": {"queueRequiredNamespaces": ["team-*"]}},
            "other",
        )
        == []
    )
    # Without the namespace (the operator's own call today) only a glob matching every namespace applies.
    assert violations(job()["spec"], {"policy": {"queueRequiredNamespaces": ["*"]}}, "ns")[0].startswith(
        "spec.runPolicy.queueName"
    )


def test_reconcile_fails_a_job_that_tolerates_every_taint_before_any_child() -> None:
    policy = {"policy": {"allowedTolerationKeys": ["nvidia.com/*"]}}
    bad = job(hardware={"profile": "cpu", "nodes": 2, "tolerations": [{"operator": "Exists"}]})
    plan = reconcile(bad, Observed([], {}, datetime(2026, 12, 3)), policy)
    assert plan.create == [] and plan.status["reason"] == "PolicyViolation"
    assert plan.status["message"].startswith("spec.hardware.tolerations[0] with an empty key")


def test_render_applies_the_policy_with_the_job_namespace(tmp_path) -> None:
    import subprocess
    import sys

    import yaml

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(FULL))
    spec = make_job("j", "team-a").classification().build()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "render", "-f", str(path), "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "breaks the operator's policy" in r.stderr
    assert "spec.output.claimName 'results' is not allowed for output in namespace 'team-a'" in r.stderr
    assert "spec.runPolicy.queueName is required in namespace 'team-a'" in r.stderr


# --- issue 24: spec.podTemplate's volume types, images, priority classes, Secrets and claims ------------------


def templated(**template: Any) -> dict[str, Any]:
    return job(podTemplate=template)["spec"]


HOST = {"name": "host", "hostPath": {"path": "/var/lib"}}
NFS = {"name": "nfs", "nfs": {"server": "10.0.0.2", "path": "/export"}}


def test_volume_types_default_to_pod_security_restricted_ones() -> None:
    fine = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "fsx"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "fsx", "csi": {"driver": "fsx.csi.aws.com"}},
        {"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"name": "cm", "configMap": {"name": "c"}},
    ]
    assert violations(templated(volumes=fine), {}, "ns") == []
    assert violations(templated(volumes=fine), {"policy": {"allowedVolumeTypes": []}}, "ns") == []
    host, nfs = violations(templated(volumes=[HOST, NFS]), {}, "ns")
    assert host.startswith("spec.podTemplate.volumes[0] is a hostPath volume") and "policy.allowedVolumeTypes" in host
    assert "Pod Security restricted" in host
    assert nfs.startswith("spec.podTemplate.volumes[1] is a nfs volume")
    # An admin opts in, by name or glob; a list replaces the default.
    assert violations(templated(volumes=[HOST]), {"policy": {"allowedVolumeTypes": ["*"]}}, "ns") == []
    only = {"policy": {"allowedVolumeTypes": ["persistentVolumeClaim", "hostPath"]}}
    (msg,) = violations(templated(volumes=[HOST, *fine[:2]]), only, "ns")
    assert msg.startswith("spec.podTemplate.volumes[2] is a emptyDir volume") and "(the default" not in msg


def test_sidecar_images_follow_allowed_images_unless_listed_apart() -> None:
    spec = templated(
        initContainers=[{"name": "sidecar", "image": "docker.io/fluent/fluent-bit:3", "restartPolicy": "Always"}]
    )
    (msg,) = violations(spec, POLICY, "ns")
    assert msg.startswith("spec.podTemplate.initContainers[0].image 'docker.io/fluent/fluent-bit:3'")
    assert "policy.allowedImages" in msg
    own = {"policy": {**POLICY["policy"], "allowedSidecarImages": ["docker.io/fluent/*"]}}
    assert violations(spec, own, "ns") == []
    (msg,) = violations(spec, {"policy": {"allowedSidecarImages": ["registry.example.com/*"]}}, "ns")
    assert "policy.allowedSidecarImages" in msg
    # No image: the job's own, checked as spec.image is.
    assert violations(templated(initContainers=[{"name": "prep"}]), POLICY, "ns") == []


def test_priority_classes_are_checked_against_their_list() -> None:
    spec = templated(priorityClassName="system-cluster-critical")
    assert violations(spec, {}, "ns") == []
    (msg,) = violations(spec, {"policy": {"allowedPriorityClasses": ["training-*"]}}, "ns")
    assert msg.startswith("spec.podTemplate.priorityClassName 'system-cluster-critical'")
    assert (
        violations(
            templated(priorityClassName="training-high"), {"policy": {"allowedPriorityClasses": ["training-*"]}}, "ns"
        )
        == []
    )


def test_secrets_and_claims_a_template_mounts_count_against_their_lists() -> None:
    spec = templated(
        volumes=[
            {"name": "creds", "secret": {"secretName": "db-root"}},
            {"name": "mix", "projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "aws-root"}}]}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "team-b-data"}},
        ],
        initContainers=[
            {
                "name": "prep",
                "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}}],
                "envFrom": [{"secretRef": {"name": "more"}}],
            }
        ],
    )
    fields = [m.split(" ")[0] for m in violations(spec, POLICY, "ns")]
    assert fields == [
        "spec.podTemplate.initContainers[0].envFrom[0].secretRef.name",
        "spec.podTemplate.initContainers[0].env[0].valueFrom.secretKeyRef.name",
        "spec.podTemplate.volumes[0].secret.secretName",
        "spec.podTemplate.volumes[1].projected.sources[1].secret.name",
    ]
    output = {"claims": ["results"], "purposes": ["output"]}  # the job's own output claim
    (msg,) = violations(spec, {"policy": {"allowedClaims": [output]}}, "team-b")
    assert msg.startswith("spec.podTemplate.volumes[2].persistentVolumeClaim.claimName 'team-b-data'")
    for entry in ({"claims": ["team-b-*"], "purposes": ["volume"]}, {"claims": ["team-b-*"]}):
        assert violations(spec, {"policy": {"allowedClaims": [output, entry]}}, "team-b") == []
    # A claim allowed as an output is not a volume's.
    entry = {"claims": ["team-b-*"], "purposes": ["output"]}
    (msg,) = violations(spec, {"policy": {"allowedClaims": [output, entry]}}, "team-b")
    assert "for volume" in msg


def test_a_template_breach_fails_the_job_before_any_child() -> None:
    plan = reconcile(job(podTemplate={"volumes": [HOST]}), Observed([], {}, datetime(2026, 12, 3)), {})
    assert plan.create == [] and plan.status["reason"] == "PolicyViolation"
    assert "hostPath" in plan.status["message"]


def test_the_new_template_keys_are_known_to_the_config_check() -> None:
    good = {"allowedVolumeTypes": ["csi"], "allowedSidecarImages": ["x/*"], "allowedPriorityClasses": ["p"]}
    assert check_config({"policy": good}) == []
    assert check_config({"policy": {"allowedClaims": [{"claims": ["c"], "purposes": ["volume"]}]}}) == []
    for key in good:
        assert any(m.startswith(f"policy.{key}: expected a list") for m in check_config({"policy": {key: "x"}}))
