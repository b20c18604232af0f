"""k8s.Kube's written policy, on the requests it sends: a fake transport in place of `Kube._call` (no API server
in this tier; tests/controlplane sends the same requests to a real one)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from finetune_operator import k8s
from finetune_operator.k8s import Kube
from finetune_operator.reconcile import Relabel

JOB = {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": "j", "namespace": "ns"}}
OURS = {"app.kubernetes.io/managed-by": "finetune-operator", "finetune.dev/job-name": "j"}


class Transport:
    """Records each request; `answers` maps (method, path) to an HTTP status to fail with, or a body to return."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any, str | None]] = []
        self.answers: dict[tuple[str, str], int | dict[str, Any]] = {}

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        patch: bool = False,
        content_type: str | None = None,
        timeout: float | None = None,
        guarded: bool = True,
    ) -> bytes:
        self.requests.append((method, path, body, content_type))
        answer = self.answers.get((method, path), {})
        if isinstance(answer, int):
            raise ApiException(status=answer, reason="fake")
        return json.dumps(answer).encode()


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> tuple[Kube, Transport]:
    kube, transport = Kube.__new__(Kube), Transport()
    Kube.__init__(kube, api=object())  # type: ignore[arg-type]
    monkeypatch.setattr(kube, "_call", transport)
    return kube, transport


def test_repeated_event_counts_are_bounded_least_recent_out(
    kube: tuple[Kube, Transport], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, transport = kube
    monkeypatch.setattr(k8s, "EVENT_COUNTS_KEPT", 3)
    transport.answers = {("POST", "/api/v1/namespaces/ns/events"): 409}  # every event is a repeat
    for message in ("a", "b", "a", "c", "d"):
        api.event(JOB, "Normal", "R", message)
    assert len(api._event_counts) == 3
    # "b" went first (the least recently written); "a", written again later, stayed with its count.
    counts = sorted(api._event_counts.values())
    assert counts == [2, 2, 3]
    api.event(JOB, "Normal", "R", "b")
    patch = transport.requests[-1]
    assert patch[0] == "PATCH" and patch[2]["count"] == 2  # forgotten: counts on from 2


def test_deletes_carry_the_uid_precondition_and_a_conflict_leaves_the_other_object(
    kube: tuple[Kube, Transport],
) -> None:
    api, transport = kube
    api.delete_pod("ns", "j-rank-0", "uid-0")
    api.delete_pod("ns", "j-rank-1", "uid-1", grace=0)
    api.delete_job("ns", "j", "uid-j")
    api.delete_workload("ns", "j", "uid-wl")
    bodies = {path: body for method, path, body, _ in transport.requests if method == "DELETE"}
    assert bodies["/api/v1/namespaces/ns/pods/j-rank-0"]["preconditions"] == {"uid": "uid-0"}
    # The pod's own terminationGracePeriodSeconds (its ranks save a checkpoint in it), unless the plan says (a
    # force delete on a lost node).
    assert "gracePeriodSeconds" not in bodies["/api/v1/namespaces/ns/pods/j-rank-0"]
    assert bodies["/api/v1/namespaces/ns/pods/j-rank-1"]["gracePeriodSeconds"] == 0
    assert bodies["/apis/finetune.dev/v1alpha1/namespaces/ns/finetunejobs/j"]["preconditions"] == {"uid": "uid-j"}
    assert bodies["/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/j"]["preconditions"] == {"uid": "uid-wl"}
    # 409: the precondition failed (the name is another object's now); 404: already gone. Neither raises.
    transport.answers = {("DELETE", "/api/v1/namespaces/ns/pods/j-rank-0"): 409}
    api.delete_pod("ns", "j-rank-0", "uid-0")
    transport.answers = {("DELETE", "/api/v1/namespaces/ns/pods/j-rank-0"): 404}
    api.delete_pod("ns", "j-rank-0", "uid-0")
    transport.answers = {("DELETE", "/api/v1/namespaces/ns/pods/j-rank-0"): 500}
    with pytest.raises(ApiException):
        api.delete_pod("ns", "j-rank-0", "uid-0")


def test_a_relabel_tests_the_uid_and_adds_only_what_differs(kube: tuple[Kube, Transport]) -> None:
    api, transport = kube
    api.relabel("ns", Relabel("Pod", "j-rank-0", "uid-0", {"finetune.dev/job-name": "x", "keep": "1"}, OURS))
    method, path, ops, ctype = transport.requests[-1]
    assert (method, path, ctype) == ("PATCH", "/api/v1/namespaces/ns/pods/j-rank-0", "application/json-patch+json")
    assert ops == [
        {"op": "test", "path": "/metadata/uid", "value": "uid-0"},
        {"op": "add", "path": "/metadata/labels/app.kubernetes.io~1managed-by", "value": "finetune-operator"},
        {"op": "add", "path": "/metadata/labels/finetune.dev~1job-name", "value": "j"},
    ]
    api.relabel("ns", Relabel("ConfigMap", "j-config", "uid-c", {}, OURS))  # every label removed
    assert transport.requests[-1][2][1] == {"op": "add", "path": "/metadata/labels", "value": OURS}
    transport.answers = {("PATCH", "/api/v1/namespaces/ns/pods/j-rank-0"): 422}  # the uid test failed
    api.relabel("ns", Relabel("Pod", "j-rank-0", "uid-0", {}, OURS))


def test_a_create_meeting_its_own_child_with_edited_labels_puts_them_back(kube: tuple[Kube, Transport]) -> None:
    api, transport = kube
    owner = {"uid": "job-uid", "controller": True}
    pod = {
        "kind": "Pod",
        "metadata": {"name": "j-rank-0", "namespace": "ns", "labels": OURS, "ownerReferences": [owner]},
    }
    existing = {"metadata": {"name": "j-rank-0", "uid": "pod-uid", "labels": {}, "ownerReferences": [owner]}}
    transport.answers = {
        ("POST", "/api/v1/namespaces/ns/pods"): 409,
        ("GET", "/api/v1/namespaces/ns/pods/j-rank-0"): existing,
    }
    assert api.create(pod) is False
    method, path, ops, _ = transport.requests[-1]
    assert (method, path) == ("PATCH", "/api/v1/namespaces/ns/pods/j-rank-0")
    assert ops[0] == {"op": "test", "path": "/metadata/uid", "value": "pod-uid"}
    # Labels intact: the read-back is all (an index that lagged behind).
    existing["metadata"]["labels"] = dict(OURS)
    requests = len(transport.requests)
    assert api.create(pod) is False
    assert [r[0] for r in transport.requests[requests:]] == ["POST", "GET"]
