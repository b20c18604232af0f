"""ftjob_cluster.auditlog: the request counts of the scale benchmark and the RBAC audit test come from this parser."""

from __future__ import annotations

import json
from pathlib import Path

from ftjob_cluster.auditlog import count_requests, policy_for_user, watch_uris


def event(user: str, verb: str, stage: str = "ResponseComplete", uri: str = "/apis?timeout=32s", **ref: str) -> str:
    e = {"kind": "Event", "stage": stage, "verb": verb, "user": {"username": user}, "requestURI": uri}
    if ref:
        e["objectRef"] = ref
    return json.dumps(e)


def test_counts_one_users_completed_requests_by_verb_and_resource(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(
        "\n".join(
            [
                event("bench-operator", "list", resource="pods", namespace="x"),
                event("bench-operator", "list", resource="pods", namespace="x"),
                event("bench-operator", "patch", resource="finetunejobs", subresource="status"),
                event("bench-operator", "get"),  # discovery: no objectRef
                # A watch: counted once, when it opens (it may outlive the measurement).
                event(
                    "bench-operator",
                    "watch",
                    stage="ResponseStarted",
                    uri="/api/v1/pods?labelSelector=a%3Db&watch=true",
                    resource="pods",
                ),
                event("bench-operator", "watch", uri="/api/v1/pods?labelSelector=a%3Db&watch=true", resource="pods"),
                event("bench-operator", "list", stage="ResponseStarted", resource="pods"),  # not an event lists have
                event("someone-else", "list", resource="pods"),
            ]
        )
        + "\n"
    )
    assert count_requests(log, "bench-operator") == {
        "list pods": 2,
        "patch finetunejobs/status": 1,
        "get /apis": 1,
        "watch pods": 1,
    }
    assert watch_uris(log, "bench-operator") == ["/api/v1/pods?labelSelector=a%3Db&watch=true"]


def test_missing_log_counts_nothing(tmp_path: Path) -> None:
    assert count_requests(tmp_path / "absent.log", "u") == {}


def test_policy_records_only_the_user() -> None:
    rules = policy_for_user("bench-operator")["rules"]
    assert rules[0] == {"level": "Metadata", "users": ["bench-operator"]} and rules[-1] == {"level": "None"}


def test_permissions_used_in_rbac_terms(tmp_path: Path) -> None:
    from ftjob_cluster.auditlog import permissions_used

    log = tmp_path / "audit.log"
    log.write_text(
        "\n".join(
            [
                event("op", "watch", stage="ResponseStarted", resource="pods"),
                event("op", "patch", resource="finetunejobs", subresource="status", apiGroup="finetune.dev"),
                event("op", "get", resource="pods", subresource="log"),
                event("op", "get"),  # discovery: no objectRef
                event("other", "delete", resource="secrets"),
            ]
        )
        + "\n"
    )
    assert permissions_used(log, "op") == {
        ("", "pods", "watch"),
        ("finetune.dev", "finetunejobs/status", "patch"),
        ("", "pods/log", "get"),
    }
