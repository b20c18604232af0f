"""The same generated jobs as tests/unit/test_spec_properties.py, through the real API server (the CRD's schema and
CEL rules): valid ones are accepted, invalid ones refused naming their field. And what still gets past admission
(a malformed affinity, passed through unchecked) ends the job Failed/InvalidSpec once, with the server's message.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from ftjobs import make_job
from hypothesis import HealthCheck, given, settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_support import API, NO_KUBELET, install_crd, running_operator
from specgen import Mistake, invalid_jobs, valid_jobs

from finetune_operator.admission import validate
from finetune_operator.builders import SshKeys, desired

KEYS = SshKeys("k", "k.pub", "h", "h.pub")
# Each example is one server round trip: a bounded sample keeps the tier fast.
SAMPLE = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def crd(kubectl: Any, wait_for: Any) -> None:
    install_crd(kubectl, wait_for)


def _create(kube_api: client.ApiClient, ns: str, job: dict[str, Any], dry_run: bool = True) -> str | None:
    """None when the server accepts the job, else its error message."""
    try:
        client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
            *API, ns, "finetunejobs", job, dry_run="All" if dry_run else None, field_validation="Strict"
        )
    except ApiException as e:
        if e.status not in (400, 422):
            raise
        return str(json.loads(e.body or "{}").get("message") or e.body)
    return None


def test_sampled_valid_jobs_are_accepted_and_so_are_their_pods(
    crd: None, kube_api: client.ApiClient, namespace: str
) -> None:
    """Both halves of the promise: the CRD accepts the job, and the pod validation accepts the pods rendered
    from it (server-side dry runs; podrules.py must not let through what the pod's own rules refuse)."""
    core = client.CoreV1Api(kube_api)

    @SAMPLE
    @given(valid_jobs())
    def check(job: dict[str, Any]) -> None:
        refused = _create(kube_api, namespace, job)
        assert refused is None, f"the API server refused a valid job: {refused}\n{job}"
        job = copy.deepcopy(job)
        job["metadata"].update(namespace=namespace, uid="00000000-0000-0000-0000-000000000000")
        for pod in desired(validate(job), ssh_keys=KEYS).pods:
            # Only existence is checked by the ServiceAccount admission plugin; the name's format was the CRD's.
            pod["spec"].pop("serviceAccountName", None)
            try:
                core.create_namespaced_pod(namespace, pod, dry_run="All", field_validation="Strict")
            except ApiException as e:
                pytest.fail(f"pod {pod['metadata']['name']} of a valid job was refused: {e.body}\n{job}")

    check()


def test_sampled_invalid_jobs_are_refused_naming_the_field(
    crd: None, kube_api: client.ApiClient, namespace: str
) -> None:
    @SAMPLE
    @given(invalid_jobs())
    def check(case: tuple[dict[str, Any], Mistake]) -> None:
        job, mistake = case
        refused = _create(kube_api, namespace, job)
        assert refused is not None, f"{mistake.id} was accepted:\n{job}"
        assert mistake.field in refused, f"{mistake.id}: {mistake.field} not named in: {refused}"

    check()


def test_a_pod_the_server_refuses_ends_the_job_failed_invalid_spec(
    crd: None, kube_api: client.ApiClient, kubeconfig: Path, namespace: str, wait_for: Any, tmp_path: Path
) -> None:
    # An affinity is passed through unchecked (schema: free object); this one is malformed, so the pod
    # create meets a 422 from the API server's own pod validation.
    bad_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "bad key!", "operator": "In", "values": ["a"]}]}]
            }
        }
    }
    job = (
        make_job("refused")
        .classification()
        .set("spec.hardware.nodeSelector", NO_KUBELET)
        .set("spec.hardware.affinity", bad_affinity)
        .build()
    )
    assert _create(kube_api, namespace, job, dry_run=False) is None
    custom = client.CustomObjectsApi(kube_api)
    with running_operator(kubeconfig, wait_for, tmp_path / "operator.log", ["--namespace", namespace]) as op:

        def failed() -> dict[str, Any] | None:
            st = custom.get_namespaced_custom_object(*API, namespace, "finetunejobs", "refused").get("status") or {}
            return st if st.get("phase") == "Failed" else None

        st = wait_for(failed, timeout=90, message="job Failed after the refused pod create")
        assert st["reason"] == "InvalidSpec"
        assert "refused Pod refused-rank-0 (422)" in st["message"] and "bad key!" in st["message"]
        passes = op.reconciles()
        # No retry loop: later passes create nothing and keep the verdict. A finished job has no timer, so a
        # watch event brings the next pass: its Service (made before the pods were refused) deleted.
        client.CoreV1Api(kube_api).delete_namespaced_service("refused", namespace)
        wait_for(lambda: op.reconciles() >= passes + 1, timeout=60, message="another pass")
        events = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
        refusals = [e for e in events if e.reason == "InvalidSpec"]
        assert len(refusals) == 1 and (refusals[0].count or 1) == 1
        assert failed() is not None
        pods = client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items
        assert [p.metadata.name for p in pods if not p.metadata.deletion_timestamp] == []
