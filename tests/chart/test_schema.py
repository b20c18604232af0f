"""values.schema.json: Helm refuses bad values before rendering anything."""

from __future__ import annotations

import json

import pytest
import yaml
from chartlib import CHART, Renderer, Values

# (values, a fragment Helm's error names: the offending path or the template's own message)
BAD_VALUES: list[tuple[str, Values, str]] = [
    (
        "unknown top-level key",
        Values().set({"watchNamespace": ["a"]}),
        "additional properties 'watchNamespace'",
    ),
    ("typo in a nested key", Values().set({"cachePVC": {"storageclass": "efs-sc"}}), "/cachePVC"),
    ("namespace not a DNS label", Values().namespaced("Team_A"), "/watchNamespaces/0"),
    ("namespace given as a string", Values().set({"watchNamespaces": "team-a"}), "/watchNamespaces"),
    ("duplicate namespace", Values().namespaced("team-a", "team-a"), "/watchNamespaces"),
    ("root user", Values().set({"operator": {"runAsUser": 0}}), "/operator/runAsUser"),
    ("port out of range", Values().set({"metrics": {"port": 70000}}), "/metrics/port"),
    ("port as a string", Values().set({"health": {"port": "8081"}}), "/health/port"),
    (
        "pull policy",
        Values().set({"operator": {"image": {"pullPolicy": "Sometimes"}}}),
        "/operator/image/pullPolicy",
    ),
    # The profiles name their repositories: the chart takes no per-profile image.
    ("per-profile image", Values().set({"runtimeImages": {"cpu": "x/cpu"}}), "/runtimeImages"),
    (
        "upper-case registry",
        Values().set({"runtimeImages": {"registry": "Registry.Example"}}),
        "/runtimeImages/registry",
    ),
    (
        "registry with a scheme",
        Values().set({"runtimeImages": {"registry": "https://r.example"}}),
        "/runtimeImages/registry",
    ),
    (
        "registry with a slash at the end",
        Values().set({"runtimeImages": {"registry": "r.example/"}}),
        "/runtimeImages/registry",
    ),
    ("tag with a colon", Values().set({"runtimeImages": {"tag": ":1.0"}}), "/runtimeImages/tag"),
    (
        "runtime digest not sha256",
        Values().set({"runtimeImages": {"digests": {"finetune-operator/cpu": "sha512:ab"}}}),
        "/runtimeImages/digests",
    ),
    ("operator digest short", Values().set({"operator": {"image": {"digest": "sha256:ab"}}}), "/operator/image/digest"),
    ("cache without RWX", Values().cache_pvc(accessModes=["ReadWriteOnce"]), "/cachePVC/accessModes"),
    ("cache size not a quantity", Values().cache_pvc(size="lots"), "/cachePVC/size"),
    (
        "bad scrape interval",
        Values().service_monitor(interval="30 seconds"),
        "/metrics/serviceMonitor/interval",
    ),
    (
        "service type",
        Values().set({"metrics": {"service": {"type": "ExternalName"}}}),
        "/metrics/service/type",
    ),
    ("flag as a string", Values().set({"networkPolicy": {"enabled": "yes"}}), "/networkPolicy/enabled"),
    ("allowlist as a string", Values().set({"policy": {"allowedImages": "registry/*"}}), "/policy/allowedImages"),
    (
        "empty allowlist entry",
        Values().set({"policy": {"allowedServiceAccounts": [""]}}),
        "/policy/allowedServiceAccounts",
    ),
    ("unknown allowlist", Values().set({"policy": {"allowedNamespaces": ["a"]}}), "/policy"),
    (
        "claim entry without claims",
        Values().set({"policy": {"allowedClaims": [{"purposes": ["output"]}]}}),
        "/policy/allowedClaims/0",
    ),
    (
        "unknown claim purpose",
        Values().set({"policy": {"allowedClaims": [{"claims": ["c"], "purposes": ["scratch"]}]}}),
        "/policy/allowedClaims/0/purposes/0",
    ),
    (
        "toleration keys as a string",
        Values().set({"policy": {"allowedTolerationKeys": "*"}}),
        "/policy/allowedTolerationKeys",
    ),
    (
        "pull secret shape",
        Values().set({"operator": {"imagePullSecrets": ["regcred"]}}),
        "/operator/imagePullSecrets",
    ),
    # Two fields that must differ cannot be compared in JSON Schema; the Deployment template checks it.
    ("metrics and health share a port", Values().set({"metrics": {"port": 8081}}), "must differ"),
    ("no replica", Values().set({"replicaCount": 0}), "/replicaCount"),
    ("replicas as a string", Values().set({"replicaCount": "2"}), "/replicaCount"),
    (
        "two replicas without leader election",
        Values().set({"replicaCount": 2, "leaderElection": {"enabled": False}}),
        "replicaCount > 1 needs leaderElection.enabled",
    ),
    (
        "a lease in fractions of a second",
        Values().set({"leaderElection": {"leaseDurationSeconds": 15.5}}),
        "/leaderElection/leaseDurationSeconds",
    ),
    ("a zero retry period", Values().set({"leaderElection": {"retryPeriodSeconds": 0}}), "/leaderElection"),
    ("unknown election key", Values().set({"leaderElection": {"leaseDuration": "15s"}}), "/leaderElection"),
    (
        "a lease no longer than the renew deadline",
        Values().set({"leaderElection": {"leaseDurationSeconds": 10}}),
        "leaderElection.leaseDurationSeconds must be longer than leaderElection.renewDeadlineSeconds",
    ),
    (
        "a renew deadline within the jittered retry period",
        Values().set({"leaderElection": {"retryPeriodSeconds": 9}}),
        "leaderElection.renewDeadlineSeconds must be longer than 1.2 × leaderElection.retryPeriodSeconds",
    ),
]


@pytest.mark.parametrize(("case", "values", "message"), BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_values_are_rejected(render: Renderer, case: str, values: Values, message: str) -> None:
    result = render.run(values)
    assert result.returncode != 0, f"{case}: helm accepted {values.data}"
    assert message in result.stderr, result.stderr
    assert result.stdout == ""


ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
GOOD_VALUES: list[tuple[str, Values]] = [
    ("defaults", Values()),
    ("ECR registry and a tag", Values().set({"runtimeImages": {"registry": ECR, "tag": "sdk2.31"}})),
    ("registry with a port and a path", Values().set({"runtimeImages": {"registry": "localhost:5000/mirror/ft"}})),
    ("RWX among others", Values().cache_pvc(accessModes=["ReadWriteOnce", "ReadWriteMany"], size="1.5Ti")),
    (
        "allowlists",
        Values().set(
            {"policy": {"allowedImages": [ECR + "/ft/*"], "allowedServiceAccounts": ["s3"], "allowedSecrets": ["hf-*"]}}
        ),
    ),
    (
        "everything on",
        Values().namespaced("a", "b-2").cache_pvc().service_monitor().network_policy().grafana_dashboard(),
    ),
    ("HA", Values().set({"replicaCount": 2})),
    ("sub-second retries", Values().set({"leaderElection": {"renewDeadlineSeconds": 2, "retryPeriodSeconds": 0.5}})),
    ("one replica without election", Values().set({"leaderElection": {"enabled": False}})),
]


@pytest.mark.parametrize(("case", "values"), GOOD_VALUES, ids=[c[0] for c in GOOD_VALUES])
def test_good_values_are_accepted(render: Renderer, case: str, values: Values) -> None:
    result = render.run(values)
    assert result.returncode == 0, f"{case}: {result.stderr}"


def test_schema_covers_every_default_value() -> None:
    """Every key in values.yaml is declared (additionalProperties is false everywhere it matters)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: object, sch: dict[str, object], path: str) -> None:
        if not isinstance(node, dict) or "properties" not in sch:
            return
        props = sch["properties"]
        assert isinstance(props, dict)
        assert sch.get("additionalProperties") is False, f"{path or '/'} accepts unknown keys"
        for key, value in node.items():
            assert key in props, f"{path}/{key} is not in values.schema.json"
            sub = props[key]
            if isinstance(sub, dict) and "$ref" in sub:
                sub = schema["definitions"][str(sub["$ref"]).rsplit("/", 1)[1]]
            walk(value, sub, f"{path}/{key}")

    walk(defaults, schema, "")


def test_registry_and_tag_patterns_are_the_operators() -> None:
    """The schema refuses what the operator's config check refuses (builders/images.py), empty allowed."""
    from finetune_operator.builders import images

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["runtimeImages"]["properties"]
    for key, pattern in ((images.REGISTRY, images.REGISTRY_PATTERN), (images.TAG, images.TAG_PATTERN)):
        assert schema[key]["pattern"] == f"^({pattern[1:-1]})?$"


def test_digest_patterns_are_the_operators() -> None:
    """The chart refuses the digests the operator's config check refuses (builders/images.py DIGEST_PATTERN)."""
    from finetune_operator.builders import images

    props = json.loads((CHART / "values.schema.json").read_text())["properties"]
    runtime = props["runtimeImages"]["properties"][images.DIGESTS]
    assert runtime["additionalProperties"]["pattern"] == images.DIGEST_PATTERN
    assert props["operator"]["properties"]["image"]["properties"]["digest"]["pattern"] == (
        f"^({images.DIGEST_PATTERN[1:-1]})?$"
    )
