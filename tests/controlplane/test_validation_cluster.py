"""The same generated jobs as tests/unit/test_spec_properties.py, through the real API server (the CRD's schema and
CEL rules, and the ValidatingAdmissionPolicy beside it): valid ones are accepted, invalid ones refused naming
their field, and on jobs with boundary values anywhere `ftjob render` says what the server says. And what still
gets past admission (a malformed affinity, passed through unchecked) ends the job Failed/InvalidSpec once, with
the server's message. spec.runPolicy.queueName is frozen once Kueue admitted the job (a real Kueue and operator).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Cluster
from ftjobs import make_job
from hypothesis import HealthCheck, given, settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_support import API, NO_KUBELET, install_crd, running_operator, status
from specgen import PRIORITY_CLASSES, Mistake, boundary_jobs, invalid_jobs, valid_jobs

from finetune_operator.admission import validate
from finetune_operator.builders import SshKeys, desired
from finetune_operator.cli import main
from ftjob_cluster.kueue import KueueProcess

KEYS = SshKeys("k", "k.pub", "h", "h.pub")
# Each example is one server round trip: a bounded sample keeps the tier fast.
SAMPLE = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# The boundary-value agreement: a few hundred jobs against the one API server of the session.
BOUNDARY = settings(SAMPLE, max_examples=300)
KUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _policy_enforced(kube_api: client.ApiClient, ns: str) -> bool:
    job = make_job("probe").classification().build()
    job["metadata"]["labels"] = {KUEUE_LABEL: "q"}
    return _create(kube_api, ns, job) is not None


@pytest.fixture(scope="module")
def crd(kubectl: Any, wait_for: Any) -> None:
    install_crd(kubectl, wait_for)
    policy = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "admission-policy"], capture_output=True, text=True, check=True
    ).stdout
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=policy)


@pytest.fixture
def enforced(crd: None, kube_api: client.ApiClient, namespace: str, wait_for: Any) -> None:
    """The API server loads a new admission policy a moment after it is created: wait until it refuses."""
    wait_for(lambda: _policy_enforced(kube_api, namespace), timeout=60, message="the admission policy enforced")


def _create(kube_api: client.ApiClient, ns: str, job: dict[str, Any], dry_run: bool = True) -> str | None:
    """None when the server accepts the job, else its error message. The body is the job's JSON as Python writes
    it, NaN and Infinity included (tokens JSON has not: the server refuses them, as kubectl would)."""
    query = "?fieldValidation=Strict" + ("&dryRun=All" if dry_run else "")
    url = f"{kube_api.configuration.host}/apis/{API[0]}/{API[1]}/namespaces/{ns}/finetunejobs{query}"
    r = kube_api.rest_client.pool_manager.request(
        "POST", url, body=json.dumps(job).encode(), headers={"Content-Type": "application/json"}
    )
    if r.status in (200, 201):
        return None
    if r.status not in (400, 422):
        raise AssertionError(f"unexpected {r.status} from the API server: {r.data[:500]!r}")
    try:
        return str(json.loads(r.data).get("message") or r.data)
    except ValueError:
        return r.data.decode(errors="replace")


# The operator's policy with every list open: render then refuses only what admission refuses (the default
# policy.allowedVolumeTypes, Pod Security restricted's types, is the operator's rule, not the API server's).
OPEN_POLICY = {"policy": {"allowedVolumeTypes": ["*"]}}


def _render(job: dict[str, Any], ns: str) -> str | None:
    """None when `ftjob render -n ns` renders the job, else its errors (in-process, as the unit tier runs it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f, tempfile.NamedTemporaryFile("w", suffix=".yaml") as c:
        f.write(yaml.safe_dump(job))
        f.flush()
        c.write(yaml.safe_dump(OPEN_POLICY))
        c.flush()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["render", "-f", f.name, "-n", ns, "--config", c.name])
    return None if rc == 0 else err.getvalue()


RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


@pytest.fixture(scope="module")
def priority_classes(crd: None, kube_api: client.ApiClient) -> Iterator[None]:
    """The PriorityClasses generated spec.podTemplates name (the Priority admission plugin needs them)."""
    api = client.SchedulingV1Api(kube_api)
    for i, name in enumerate(PRIORITY_CLASSES):
        with contextlib.suppress(ApiException):
            api.create_priority_class({"metadata": {"name": name}, "value": 100 * (i + 1)})
    yield
    for name in PRIORITY_CLASSES:
        with contextlib.suppress(ApiException):
            api.delete_priority_class(name)


@pytest.fixture
def restricted(namespace: str, kube_api: client.ApiClient) -> str:
    """The test's namespace under Pod Security `restricted`, as the e2e tier's namespace is."""
    client.CoreV1Api(kube_api).patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})
    return namespace


def test_sampled_valid_jobs_are_accepted_and_so_are_their_pods(
    crd: None, priority_classes: None, kube_api: client.ApiClient, restricted: str
) -> None:
    """Both halves of the promise: the CRD accepts the job, and the pod validation accepts the pods rendered
    from it (server-side dry runs; podrules.py must not let through what the pod's own rules refuse), in a
    namespace that enforces Pod Security `restricted`: spec.podTemplate's volumes, init containers and sidecars
    included (the operator sets their security context)."""
    namespace = restricted
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
    enforced: None, kube_api: client.ApiClient, namespace: str
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


def test_render_and_the_api_server_agree_on_boundary_values(
    enforced: None, kube_api: client.ApiClient, namespace: str
) -> None:
    """Issue 23: numbers at and beyond int64, the maxima and their types (2.0 for an integer), NaN and infinities,
    strings of every character class at and beyond their lengths (trailing newlines: RE2's `$`), wrong types,
    nulls, and metadata (name, namespace, labels, annotations, finalizers, unknown fields). render and the API
    server must give the same verdict on every one."""
    verdicts = {"both accept": 0, "both refuse": 0}

    @BOUNDARY
    @given(boundary_jobs())
    def check(job: dict[str, Any]) -> None:
        server, render = _create(kube_api, namespace, job), _render(job, namespace)
        assert (server is None) == (render is None), (
            f"render and the API server disagree:\nserver: {server or 'accepted'}\nrender: {render or 'accepted'}"
            f"\n{json.dumps(job)}"
        )
        verdicts["both accept" if server is None else "both refuse"] += 1

    check()
    # Both verdicts are exercised, or the agreement says little.
    print(f"boundary verdicts: {verdicts}")
    assert min(verdicts.values()) >= 30, verdicts


def test_render_and_the_api_server_agree_on_boundary_values_in_the_pod_template(
    enforced: None, kube_api: client.ApiClient, namespace: str
) -> None:
    """spec.podTemplate's own boundary values (issue 24): its maps, lists, names, paths, quantities and
    pass-through volume sources, where CEL and the Python twins must count and match alike (annotation sizes in
    characters, keys lower-cased as CEL's lowerAscii does)."""

    @settings(SAMPLE, max_examples=150)
    @given(boundary_jobs(under="podTemplate"))
    def check(job: dict[str, Any]) -> None:
        server, render = _create(kube_api, namespace, job), _render(job, namespace)
        assert (server is None) == (render is None), (
            f"render and the API server disagree:\nserver: {server or 'accepted'}\nrender: {render or 'accepted'}"
            f"\n{json.dumps(job)}"
        )

    check()


def test_kueue_queue_label_is_refused_on_create_and_update_naming_the_field(
    enforced: None, kube_api: client.ApiClient, namespace: str
) -> None:
    job = make_job("labelled").classification().set("spec.hardware.nodeSelector", NO_KUBELET).build()
    job["metadata"]["labels"] = {KUEUE_LABEL: "team-a"}
    refused = _create(kube_api, namespace, job)
    assert refused is not None and "spec.runPolicy.queueName" in refused and KUEUE_LABEL in refused
    del job["metadata"]["labels"]
    assert _create(kube_api, namespace, job, dry_run=False) is None
    custom = client.CustomObjectsApi(kube_api)
    with pytest.raises(ApiException) as exc:
        custom.patch_namespaced_custom_object(
            *API, namespace, "finetunejobs", "labelled", {"metadata": {"labels": {KUEUE_LABEL: "team-a"}}}
        )
    assert exc.value.status == 422 and "spec.runPolicy.queueName" in (exc.value.body or "")
    # Other labels stay free.
    custom.patch_namespaced_custom_object(
        *API, namespace, "finetunejobs", "labelled", {"metadata": {"labels": {"team": "a"}}}
    )


@pytest.mark.parametrize(
    ("field", "path", "value"),
    [
        ("spec.runPolicy.activeDeadlineSeconds", "spec.runPolicy.activeDeadlineSeconds", 2**31),
        ("spec.runPolicy.ttlSecondsAfterFinished", "spec.runPolicy.ttlSecondsAfterFinished", 2**63 - 1),
        ("spec.training.seed", "spec.training.seed", 2**32),
        ("spec.hardware.nodes", "spec.hardware.nodes", 2.0),
        ("spec.output.url", "spec.output", {"url": "s3:///x"}),
        ("spec.task.labels", "spec.task.labels", []),
        ("spec.env", "spec.env", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
        ("spec.envFrom", "spec.envFrom", [{"configMapRef": {"name": "c"}, "prefix": "FTJOB_"}]),
        ("spec.hardware.resources.limits", "spec.hardware.resources", {"limits": {"nvidia.com/gpu": 8}}),
    ],
)
def test_what_wedged_a_job_or_escaped_its_accounting_is_refused_by_the_api_server(
    crd: None, kube_api: client.ApiClient, namespace: str, field: str, path: str, value: Any
) -> None:
    """Issue 23's evidence, at the tier users meet: each passed admission and then broke every reconcile pass or
    every rank, or reached devices outside the job's request."""
    b = make_job("wedge").profile("nvidia").classification().set(path, value)
    del b.obj["spec"]["task"]["dataset"]["labelMap"]  # the labels alone name the classes
    refused = _create(kube_api, namespace, b.build())
    assert refused is not None and field in refused, refused
    assert _render(b.build(), namespace) is not None


@pytest.mark.parametrize(
    ("profile", "stack", "offered"),
    [
        ("trn1", "native", False),
        ("cpu", "ipex", False),
        ("xeon-amx", "xla", False),
        ("nvidia", "native", False),
        ("trn1", "xla", True),
        ("trn2", "native", True),
        ("xeon-amx", "upstream", True),
        ("xeon-amx", "ipex", True),
    ],
)
def test_the_api_server_offers_each_profile_its_stacks_as_render_does(
    crd: None, kube_api: client.ApiClient, namespace: str, profile: str, stack: str, offered: bool
) -> None:
    """Issue 26: spec.hardware.stack's CEL rule (the profiles' stacks as data) against its Python twin."""
    job = make_job("stack").profile(profile).classification().set("spec.hardware.stack", stack).build()
    refused, rendered = _create(kube_api, namespace, job), _render(job, namespace)
    if offered:
        assert refused is None and rendered is None, (refused, rendered)
    else:
        assert refused is not None and "spec.hardware.stack" in refused, refused
        assert rendered is not None and "spec.hardware.stack" in rendered, rendered


def test_the_api_server_refuses_a_cache_url_on_the_native_stack_as_render_does(
    crd: None, kube_api: client.ApiClient, namespace: str
) -> None:
    """TorchNeuron's NEFF cache is a directory on the cache claim: no URL (the XLA stack's S3 cache) on it."""
    base = make_job("cache").profile("trn2").classification()
    assert _create(kube_api, namespace, base.cache(url="s3://b/c").build()) is None  # default stack: xla
    job = base.set("spec.hardware.stack", "native").cache(url="/c").build()
    refused, rendered = _create(kube_api, namespace, job), _render(job, namespace)
    assert refused is not None and "spec.compileCache.url" in refused, refused
    assert rendered is not None and "spec.compileCache.url" in rendered, rendered


def test_question_answering_strides_the_tokenizer_would_refuse_are_refused(
    crd: None, kube_api: client.ApiClient, namespace: str
) -> None:
    """The API server refuses a docStride of half maxLength or more; the defaults pass."""
    assert _create(kube_api, namespace, make_job("qa-defaults").qa().build()) is None
    refused = _create(kube_api, namespace, make_job("qa").qa().set("spec.task.docStride", 64).build())
    assert refused is not None and "spec.task.docStride" in refused
    wide = make_job("qa-wide").qa().set("spec.task.docStride", 128).set("spec.task.maxLength", 384).build()
    assert _create(kube_api, namespace, wide) is None


# --- spec.runPolicy.queueName is frozen once admitted: real Kueue, real operator ----------------------------------

KUEUE_API = ("kueue.x-k8s.io", "v1beta2")
ONE_JOB = {"cpu": "6", "memory": "12Gi"}  # quota for one 2-rank cpu job (2 CPUs / 4Gi per pod), not two


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KueueProcess]:
    if not cluster.local:
        pytest.skip("Kueue runs as a host process whose webhooks only a local API server can reach")
    proc = KueueProcess(cluster.kubeconfig, tmp_path_factory.mktemp("kueue"))
    try:
        yield proc.start()
    finally:
        proc.stop()


def _queues(kubectl: Any, ns: str, wait_for: Any) -> str:
    """A ClusterQueue with ONE_JOB for `ns` only, and two LocalQueues on it: lq and lq2."""
    cq = f"cq-{ns}"[:63]
    objs: list[dict[str, Any]] = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceGroups": [
                    {
                        "coveredResources": sorted(ONE_JOB),
                        "flavors": [
                            {
                                "name": "default",
                                "resources": [{"name": k, "nominalQuota": v} for k, v in sorted(ONE_JOB.items())],
                            }
                        ],
                    }
                ],
            },
        },
    ]
    objs += [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": q, "namespace": ns},
            "spec": {"clusterQueue": cq},
        }
        for q in ("lq", "lq2")
    ]
    kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(o) for o in objs))
    active = "jsonpath={.status.conditions[?(@.type=='Active')].status}"
    wait_for(lambda: kubectl("get", "clusterqueue", cq, "-o", active).stdout == "True", timeout=120, message="cq")
    return cq


def _set_queue(kube_api: client.ApiClient, ns: str, name: str, queue: str | None) -> str | None:
    """Merge-patch spec.runPolicy.queueName (None removes it); None when the server takes it, else its message."""
    try:
        client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
            *API, ns, "finetunejobs", name, {"spec": {"runPolicy": {"queueName": queue}}}
        )
    except ApiException as e:
        if e.status != 422:
            raise
        return str(json.loads(e.body or "{}").get("message"))
    return None


def test_queue_name_changes_only_while_the_job_is_not_admitted(
    crd: None,
    kueue: KueueProcess,
    kubectl: Any,
    kube_api: client.ApiClient,
    kubeconfig: Path,
    namespace: str,
    wait_for: Any,
    tmp_path: Path,
) -> None:
    """Issue 23: removing the queue from a Queued job used to create its pods at once, outside the quota. The CRD
    transition rule reads the status the operator writes (reconcile.py's queued and admitted phases)."""
    ns = namespace
    cq = _queues(kubectl, ns, wait_for)

    def job(name: str, queue: str | None) -> dict[str, Any]:
        b = make_job(name).nodes(2).classification().set("spec.hardware.nodeSelector", NO_KUBELET)
        if queue:
            b.run_policy(queueName=queue)
        return b.build()

    try:
        # Not handled yet (no status): the queue may change.
        assert _create(kube_api, ns, job("first", "lq"), dry_run=False) is None
        assert _create(kube_api, ns, job("unqueued", None), dry_run=False) is None
        assert _set_queue(kube_api, ns, "first", "lq2") is None
        with running_operator(kubeconfig, wait_for, tmp_path / "operator.log", ["--namespace", ns]):
            wait_for(lambda: status(kube_api, ns, "first").get("startTime"), timeout=120, message="first admitted")
            assert _create(kube_api, ns, job("second", "lq"), dry_run=False) is None
            wait_for(
                lambda: status(kube_api, ns, "second").get("phase") == "Queued",
                timeout=120,
                message="second Queued (no quota left)",
            )
            # Waiting in its queue: it may move to another queue.
            assert _set_queue(kube_api, ns, "second", "lq2") is None
            # Admitted and started: neither changed nor removed.
            for change in ("lq", None):
                refused = _set_queue(kube_api, ns, "first", change)
                assert refused is not None and "spec.runPolicy.queueName may change only" in refused, refused
            # Started without a queue: adding one is refused too.
            wait_for(lambda: status(kube_api, ns, "unqueued").get("startTime"), timeout=120, message="pods")
            refused = _set_queue(kube_api, ns, "unqueued", "lq")
            assert refused is not None and "spec.runPolicy.queueName" in refused, refused
            assert status(kube_api, ns, "second").get("phase") == "Queued"
    finally:
        kubectl("delete", "clusterqueue", cq, "--ignore-not-found", "--wait=false")


def test_a_template_past_pod_security_is_stopped_by_the_default_policy_first(
    crd: None, priority_classes: None, kube_api: client.ApiClient, restricted: str, tmp_path: Path
) -> None:
    """A hostPath volume is what Pod Security `restricted` refuses (the pod create would be Forbidden); the
    operator's default policy.allowedVolumeTypes (restricted's own types) refuses it first, before any child,
    naming the field. An admin who allows it (`["*"]`) hands the refusal to Pod Security, whose message names
    the volume."""
    ns = restricted
    template = {
        "priorityClassName": PRIORITY_CLASSES[0],
        "volumes": [{"name": "host", "hostPath": {"path": "/var/lib/data"}}],
        "volumeMounts": [{"name": "host", "mountPath": "/data"}],
        "initContainers": [{"name": "proxy", "image": "registry.test/proxy:1", "restartPolicy": "Always"}],
    }
    job = make_job("hostpath").classification().set("spec.podTemplate", template).build()
    assert _create(kube_api, ns, job) is None  # admission's rules: a well-formed template
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["render", "-f", str(path), "-n", ns]) != 0
    assert "spec.podTemplate.volumes[0] is a hostPath volume" in err.getvalue()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"policy": {"allowedVolumeTypes": ["*"]}}))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["render", "-f", str(path), "-n", ns, "--config", str(config)]) == 0
    job["metadata"].update(namespace=ns, uid="00000000-0000-0000-0000-000000000000")
    pod = desired(validate(job), ssh_keys=KEYS).pods[0]
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(kube_api).create_namespaced_pod(ns, pod, dry_run="All")
    assert e.value.status == 403 and "restricted" in e.value.body and "hostPath" in e.value.body, e.value.body
    # Without it, the same template's pod (its sidecar and mounts included) passes restricted.
    template.pop("volumes"), template.pop("volumeMounts")
    job["spec"]["podTemplate"] = template
    for pod in desired(validate(job), ssh_keys=KEYS).pods:
        client.CoreV1Api(kube_api).create_namespaced_pod(ns, pod, dry_run="All")
