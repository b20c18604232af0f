"""The operator running for real against a real API server: admission, children, lifecycles, GC."""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Cluster
from ftjobs import BAD_SPECS, SAMPLES, BadSpec, bad_job, make_job
from kubernetes import client
from operator_support import (
    NO_KUBELET,
    Kubelet,
    NodeLogs,
    RunningOperator,
    get_job,
    install_crd,
    is_subset,
    job_yaml,
    running_operator,
    status,
    two_rank_job,
)
from prometheus_client.parser import text_string_to_metric_families

from finetune_operator.admission import validate
from finetune_operator.k8s import Kube
from finetune_operator.pacing import ERROR_BACKOFF_S
from finetune_runtime.progress import format_line


@pytest.fixture(scope="module")
def crd(kubectl: Any, wait_for: Any) -> None:
    install_crd(kubectl, wait_for)


@pytest.fixture(scope="module")
def operator_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the chart's ConfigMap holds with networkPolicy.enabled: every job gets its own NetworkPolicy."""
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(
        yaml.safe_dump({"images": {"registry": "registry.test", "tag": "1"}, "networkPolicy": {"enabled": True}})
    )
    return path


@pytest.fixture(scope="module")
def operator_process(
    crd: None, kubeconfig: Path, wait_for: Any, tmp_path_factory: pytest.TempPathFactory, operator_config: Path
) -> Iterator[tuple[Path, RunningOperator]]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(kubeconfig, wait_for, log, ["--config", str(operator_config)]) as op:
        yield log, op
    print(f"operator log: {log}")


@pytest.fixture(scope="module")
def operator(operator_process: tuple[Path, RunningOperator]) -> Path:
    """The running operator's log."""
    return operator_process[0]


def job_gauges(op: RunningOperator, ns: str, name: str) -> dict[str, float]:
    """The per-job gauges the operator's /metrics serves for one job (absent series: absent keys)."""
    with urllib.request.urlopen(op.metrics_url, timeout=5) as r:
        text = r.read().decode()
    return {
        s.name.removeprefix("finetune_operator_job_"): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.labels == {"namespace": ns, "job_name": name}
    }


@pytest.fixture
def kubelet(kube_api: client.ApiClient, namespace: str) -> Iterator[Kubelet]:
    k = Kubelet(kube_api, namespace)
    yield k
    k.stop()


def apply(kubectl: Any, ns: str, obj: dict[str, Any]) -> None:
    kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(obj))


# -- admission by the API server itself --------------------------------------------------------------------------


def test_kubectl_explain_documents_fields(crd: None, kubectl: Any) -> None:
    out = kubectl("explain", "finetunejobs.spec.hardware.procsPerNode").stdout
    assert "Training processes per pod" in out
    out = kubectl("explain", "ftj.spec.runPolicy").stdout
    assert "backoffLimit" in out and "cleanPodPolicy" in out


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_api_server_rejects_bad_spec_naming_field(case: BadSpec, crd: None, kubectl: Any, namespace: str) -> None:
    r = kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(bad_job(case)), check=False)
    assert r.returncode != 0, f"{case.id} was accepted"
    assert case.field in r.stderr, f"{case.id}: {case.field} not named in: {r.stderr}"


def test_api_server_accepts_resume_from_of_the_outputs_kind(crd: None, kubectl: Any, namespace: str) -> None:
    """output.resumeFrom: an s3:// URL with output.url, a pvc:// directory of the output claim with claimName."""
    for i, output in enumerate(
        [
            {"url": "s3://b/shared", "resumeFrom": "s3://b/shared/team/old/"},
            {"claimName": "results", "resumeFrom": "pvc://results/out/team/old/checkpoints"},
            {"claimName": "results", "resumeFrom": "pvc://results"},
        ]
    ):
        job = make_job(f"resume-{i}").classification().set("spec.output", output).build()
        validate(copy.deepcopy(job))  # what ftjob render accepts, the API server accepts
        kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=job_yaml(job))


def test_render_and_api_server_accept_the_same_samples(crd: None, kubectl: Any, namespace: str) -> None:
    for sample in SAMPLES:
        kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(sample))


def test_hardware_task_and_launcher_are_immutable(crd: None, kubectl: Any, namespace: str) -> None:
    job = make_job("immut").classification().build()
    apply(kubectl, namespace, job)
    for path, value, field in [
        ("spec.hardware.nodes", 3, "spec.hardware"),
        ("spec.task.maxLength", 64, "spec.task"),
        ("spec.launcher", "mpi", "spec.launcher"),
    ]:
        changed = copy.deepcopy(job)
        node = changed
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
        r = kubectl("apply", "-n", namespace, "-f", "-", input=job_yaml(changed), check=False)
        assert r.returncode != 0 and "immutable" in r.stderr and field in r.stderr, r.stderr


# -- children ------------------------------------------------------------------------------------------------------


def _rendered(sample: Path, ns: str, config: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "render", "-f", str(sample), "-n", ns, "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _live(kube_api: client.ApiClient, ns: str, job: str) -> dict[str, dict[str, Any]]:
    core = client.CoreV1Api(kube_api)
    sel = f"finetune.dev/job-name={job}"
    out: dict[str, dict[str, Any]] = {}
    net = client.NetworkingV1Api(kube_api)
    for version, kind, lister in (
        ("v1", "Pod", core.list_namespaced_pod),
        ("v1", "Service", core.list_namespaced_service),
        ("v1", "ConfigMap", core.list_namespaced_config_map),
        ("v1", "Secret", core.list_namespaced_secret),
        ("networking.k8s.io/v1", "NetworkPolicy", net.list_namespaced_network_policy),
    ):
        for o in lister(ns, label_selector=sel).items:
            # List items carry no apiVersion/kind of their own.
            out[f"{kind}/{o.metadata.name}"] = {
                "apiVersion": version,
                "kind": kind,
                **kube_api.sanitize_for_serialization(o),
            }
    return out


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_children_are_exactly_what_render_predicts(
    sample: Path,
    operator: Path,
    kubectl: Any,
    kube_api: Any,
    namespace: str,
    wait_for: Any,
    operator_config: Path,
    tmp_path: Path,
) -> None:
    spec = yaml.safe_load(sample.read_text())
    if spec["spec"].get("serviceAccountName"):  # the user's IRSA service account, as the EKS guide makes it
        kubectl("create", "serviceaccount", spec["spec"]["serviceAccountName"], "-n", namespace)
    pclass = (spec["spec"].get("podTemplate") or {}).get("priorityClassName")
    if pclass:  # the cluster's PriorityClass (the Priority admission plugin refuses pods naming a missing one)
        kubectl("create", "priorityclass", pclass, "--value=1000", check=False)
    kubectl("apply", "-n", namespace, "-f", str(sample))
    name = spec["metadata"]["name"]
    # Rendered with the job's uid, which the pods receive (FTJOB_JOB_UID) and the owner references carry.
    uid = get_job(kube_api, namespace, name)["metadata"]["uid"]  # type: ignore[index]
    spec["metadata"]["uid"] = uid
    with_uid = tmp_path / sample.name
    with_uid.write_text(yaml.safe_dump(spec))
    want = {f"{o['kind']}/{o['metadata']['name']}": o for o in _rendered(with_uid, namespace, operator_config)}
    assert f"NetworkPolicy/{name}" in want
    live = wait_for(
        lambda: (lv := _live(kube_api, namespace, name)) and set(lv) == set(want) and lv,
        timeout=60,
        message=f"children of {name}",
    )
    for key, obj in want.items():
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid, key
        if obj["kind"] == "Secret":  # random per job: check shape, and that keys are real OpenSSH keys
            data = live[key]["data"]
            assert set(data) == set(obj["data"])
            assert base64.b64decode(data["authorized_keys"]).startswith(b"ssh-ed25519 ")
            assert live[key]["immutable"] is True
            obj = {k: v for k, v in obj.items() if k != "data"}
        err = is_subset(obj, live[key])
        assert err is None, f"{key}: {err}"


def test_foreign_object_error_shows_in_status(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, wait_for: Any
) -> None:
    client.CoreV1Api(kube_api).create_namespaced_config_map(
        namespace, {"metadata": {"name": "clash-config", "labels": {"finetune.dev/job-name": "clash"}}, "data": {}}
    )
    apply(kubectl, namespace, make_job("clash").classification().build())
    st = wait_for(
        lambda: "reconcile error" in (s := status(kube_api, namespace, "clash")).get("message", "") and s,
        timeout=60,
        message="reconcile error in status",
    )
    assert "ConfigMap" in st["message"] and "not controlled by this FineTuneJob" in st["message"]
    assert any(c["type"] == "ReconcileError" and c["status"] == "True" for c in st["conditions"])
    # Failing passes back off (1, 2, 5, 10, 30 s) although each one's status patch is a watch event that
    # would wake the daemon at once: the first three failures are at least 1 s and 2 s apart.
    # (kopf's log format: "[2026-12-03 15:04:55,810] finetune_operator    [ERROR   ] reconcile of ns/j failed".)
    marker = re.compile(rf"^\[(.+?)\] finetune_operator +\[ERROR *\] reconcile of {namespace}/clash failed$")

    def failure_times() -> list[datetime] | None:
        times = [
            datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f")
            for line in operator.read_text().splitlines()
            if (m := marker.match(line))
        ]
        return times if len(times) >= 3 else None

    times = wait_for(failure_times, timeout=30, message="three failed passes")
    gaps = [(times[1] - times[0]).total_seconds(), (times[2] - times[1]).total_seconds()]
    assert gaps[0] >= ERROR_BACKOFF_S[0] and gaps[1] >= ERROR_BACKOFF_S[1], f"{gaps}: the error backoff is ignored"
    # Removing the clash lets the job recover on its own.
    client.CoreV1Api(kube_api).delete_namespaced_config_map("clash-config", namespace)

    def recovered() -> bool:
        conds = {c["type"]: c for c in status(kube_api, namespace, "clash").get("conditions", [])}
        return conds.get("ReconcileError", {}).get("status") == "False"

    wait_for(recovered, timeout=60, message="ReconcileError cleared after the clash was removed")
    cm = client.CoreV1Api(kube_api).read_namespaced_config_map("clash-config", namespace)
    assert cm.metadata.owner_references[0].kind == "FineTuneJob"


def test_create_in_a_terminating_namespace_is_skipped(kube_api: Any, namespace: str) -> None:
    """k8s.Kube's policy: a 403 NamespaceTerminating on create is not an error (the job goes with it)."""
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "holder", "finalizers": ["test.ftjob/hold"]}})
    core.delete_namespace(namespace)  # Terminating until the finalizer goes
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "late", "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        assert Kube(kube_api).create(pod) is False
        with pytest.raises(client.exceptions.ApiException):
            core.read_namespaced_pod("late", namespace)
    finally:
        core.patch_namespaced_config_map("holder", namespace, {"metadata": {"finalizers": None}})


# -- lifecycles, with pod status reported as a kubelet would ------------------------------------------------------


def _wait_phase(kube_api: Any, ns: str, name: str, phase: str, wait_for: Any, timeout: float = 60) -> dict[str, Any]:
    return wait_for(
        lambda: (s := status(kube_api, ns, name)).get("phase") == phase and s,
        timeout=timeout,
        message=f"{name} phase {phase} (now {status(kube_api, ns, name).get('phase')})",
    )


def _pods_up(kubelet: Kubelet, name: str, n: int, wait_for: Any, attempt: int = 0) -> list[str]:
    def ready() -> list[str] | None:
        pods = [p for p in kubelet.live_pods(name) if p.metadata.labels["finetune.dev/attempt"] == str(attempt)]
        return sorted(p.metadata.name for p in pods) if len(pods) == n else None

    names: list[str] = wait_for(ready, timeout=60, message=f"{n} pods of {name} attempt {attempt}")
    return names


def test_pending_running_succeeded(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    apply(kubectl, namespace, two_rank_job("ok"))
    pods = _pods_up(kubelet, "ok", 2, wait_for)
    _wait_phase(kube_api, namespace, "ok", "Pending", wait_for)
    for p in pods:
        kubelet.set_status(p, "Running")
    st = _wait_phase(kube_api, namespace, "ok", "Running", wait_for)
    assert st["ranks"] == {"ready": 2, "total": 2} and st["startTime"]
    out = kubectl("get", "ftj", "ok", "-n", namespace).stdout
    assert out.split("\n")[0].split() == [
        "NAME",
        "PROFILE",
        "NODES",
        "PHASE",
        "PROGRESS",
        "THROUGHPUT",
        "RESTARTS",
        "AGE",
    ]
    assert "Running" in out.split("\n")[1]
    for p in pods:
        kubelet.set_status(p, "Succeeded", exit_code=0, reason="Completed")
    st = _wait_phase(kube_api, namespace, "ok", "Succeeded", wait_for)
    assert st["completionTime"] and {c["type"] for c in st["conditions"]} >= {"Created", "Running", "Succeeded"}
    events = kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=ok", "-o", "json"
    ).stdout
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"Pending", "Running", "Completed"} <= reasons


def test_progress_from_rank0_log_reaches_status_kubectl_and_metrics(
    operator_process: tuple[Path, RunningOperator],
    kubectl: Any,
    kube_api: Any,
    namespace: str,
    kubelet: Kubelet,
    cluster: Cluster,
    wait_for: Any,
) -> None:
    """Rank 0's FTJOB_PROGRESS lines, read through the API server's pods/log from the node serving them, become
    status.progress, the PROGRESS column and the job's Prometheus gauges, and keep being refreshed with no pod
    event to wake the operator. The gauges go when the job ends."""
    op = operator_process[1]
    if cluster.pki is None:
        pytest.skip("needs the LocalCluster's CA to serve a node's logs (an external cluster has real kubelets)")
    node = NodeLogs(kube_api, cluster.pki, f"logs-{namespace}"[:63])
    try:
        apply(kubectl, namespace, two_rank_job("pg"))
        pods = _pods_up(kubelet, "pg", 2, wait_for)
        node.bind(namespace, "pg-rank-0")
        key = (namespace, "pg-rank-0", "trainer")
        node.logs[key] = (
            "loading dataset\n"
            + format_line(
                "train",
                step=120,
                totalSteps=500,
                epoch=1.2,
                loss=0.41,
                samplesPerSecond=35.2,
                etaSeconds=96,
                startedAt="2026-12-04T10:00:00.000Z",
                firstStepAt="2026-12-04T10:00:04.250Z",
            )
            + "\n"
        )
        for p in pods:
            kubelet.set_status(p, "Running")
        _wait_phase(kube_api, namespace, "pg", "Running", wait_for)

        def summary() -> str:
            return str((status(kube_api, namespace, "pg").get("progress") or {}).get("summary", ""))

        # The log is read every pacing.PROGRESS_EVERY_S (30 s): one interval plus slack for a loaded machine.
        first = wait_for(
            lambda: summary().startswith("120/500") and summary(),
            timeout=70,
            message=f"progress 120/500 (log requests: {node.requests})",
        )
        assert first == "120/500 (24%) loss 0.41 ETA 1m36s"
        # The launcher's start and rank 0's first step, as the runtime reports them (docs/runtime.md).
        assert status(kube_api, namespace, "pg")["progress"]["timeToFirstStepSeconds"] == 4.25
        assert any(
            r.startswith("/containerLogs/" + namespace + "/pg-rank-0/trainer?") and "tailLines=" in r
            for r in node.requests
        ), node.requests
        assert first in kubectl("get", "ftj", "pg", "-n", namespace).stdout
        # Training goes on: nothing changes but the log, and the status must follow within an interval.
        node.logs[key] += format_line("eval", step=250, totalSteps=500, metrics={"accuracy": 0.9}) + "\n"
        later = wait_for(
            lambda: summary().startswith("250/500") and summary(),
            timeout=70,
            message="progress 250/500 without any pod event",
        )
        assert "accuracy 0.9" in later
        gauges = wait_for(
            lambda: (g := job_gauges(op, namespace, "pg")).get("step") == 250 and g,
            timeout=20,
            message="the step gauge at 250",
        )
        # samples/s is the newest train line's (eval lines carry none); the ratio follows the step.
        assert gauges == {"step": 250, "total_steps": 500, "progress_ratio": 0.5, "samples_per_second": 35.2}
        for p in pods:
            kubelet.set_status(p, "Succeeded", exit_code=0, reason="Completed")
        _wait_phase(kube_api, namespace, "pg", "Succeeded", wait_for)
        wait_for(lambda: job_gauges(op, namespace, "pg") == {}, timeout=20, message="no series of a finished job")
    finally:
        node.close()


BERT_JA = "cl-tohoku/bert-base-japanese-whole-word-masking"  # a model `ftjob estimate` knows (estimate/models.yaml)
# What the runtime's rank 0 counts on that model (its linear layers: the encoder's, the pooler and a 2-way head).
BERT_NUMBERS = {
    "layers": 12,
    "attentionWidth": 768,
    "trainableMatmulParams": 84_934_656 + 768 * 768 + 768 * 2,
    "frozenMatmulParams": 0,
    "trainableParams": 110_618_882,
}


def _estimate_row(job_file: Path, kubeconfig: Path, *args: str) -> str:
    """The as-written row of `ftjob estimate` (the CLI, as a user runs it against the cluster)."""
    out = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "estimate", "-f", str(job_file), "--as-written", *args],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return next(line for line in out.stdout.splitlines() if line.startswith("cpu "))


def test_throughput_from_rank0_log_reaches_status_and_column_and_the_next_estimate(
    operator: Path,
    kubectl: Any,
    kube_api: Any,
    namespace: str,
    kubelet: Kubelet,
    cluster: Cluster,
    kubeconfig: Path,
    wait_for: Any,
    tmp_path: Path,
) -> None:
    """Rank 0's train lines (tokens, the mean padded length, precision, the model's numbers) become
    status.throughput with the FLOPs and MFU the operator derives from the profile's peak, and the THROUGHPUT
    column; once the job Succeeded, `ftjob estimate --calibration-from-cluster` for the same work goes from
    "uncalibrated" to "1 run"."""
    if cluster.pki is None:
        pytest.skip("needs the LocalCluster's CA to serve a node's logs (an external cluster has real kubelets)")
    job = (
        make_job("tp")
        .nodes(2)
        .classification(model=BERT_JA)
        .training(precision="bf16")
        .set("spec.hardware.nodeSelector", NO_KUBELET)
        .build()
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(job_yaml(job))
    cluster_args = ("--calibration-from-cluster", "--calibration-namespace", namespace)
    assert "uncalibrated" in _estimate_row(job_file, kubeconfig, *cluster_args)  # no run of it yet
    node = NodeLogs(kube_api, cluster.pki, f"tp-{namespace}"[:63])
    try:
        apply(kubectl, namespace, job)
        pods = _pods_up(kubelet, "tp", 2, wait_for)
        node.bind(namespace, "tp-rank-0")
        line = {"totalSteps": 60, "loss": 0.5, "precision": "bf16", "model": BERT_NUMBERS}
        node.logs[(namespace, "tp-rank-0", "trainer")] = "".join(
            format_line("train", **line, **fields) + "\n"
            for fields in (
                {"step": 1},
                {"step": 30, "samplesPerSecond": 0.8, "tokensPerSecond": 40.1, "paddedTokensPerSecond": 49.2}
                | {"paddedTokensPerSample": 61.5},
                {"step": 60, "samplesPerSecond": 0.9, "tokensPerSecond": 45.0, "paddedTokensPerSecond": 55.4}
                | {"paddedTokensPerSample": 61.6, "meanSamplesPerSecond": 0.85},
            )
        )
        for p in pods:
            kubelet.set_status(p, "Running")
        _wait_phase(kube_api, namespace, "tp", "Running", wait_for)
        # Rank 0's container exits 0: the pass that sees it reads its log at once.
        for p in pods:
            kubelet.set_status(p, "Succeeded", exit_code=0, reason="Completed")
        st = _wait_phase(kube_api, namespace, "tp", "Succeeded", wait_for)
        t = st["throughput"]
        assert (t["samplesPerSecond"], t["meanSamplesPerSecond"], t["tokensPerSecond"]) == (0.9, 0.85, 45.0)
        assert t["paddedTokensPerSecond"] == 55.4 and t["model"] == BERT_NUMBERS and t["precision"] == "bf16"
        s = 61.6
        flops = s * (6 * BERT_NUMBERS["trainableMatmulParams"] + 12 * 12 * 768 * s)
        assert t["flopsPerSample"] == pytest.approx(flops, rel=1e-5)
        assert t["mfu"] == pytest.approx(0.9 * flops / t["peakFlopsPerSecond"], rel=1e-3)
        assert t["summary"] == f"0.9 samples/s, MFU {100 * t['mfu']:.2g}%"
        columns = kubectl("get", "ftj", "tp", "-n", namespace).stdout.splitlines()
        assert "THROUGHPUT" in columns[0] and t["summary"] in columns[1]
        row = _estimate_row(job_file, kubeconfig, *cluster_args)
        assert " 1 run" in row and "uncalibrated" not in row, row
    finally:
        node.close()


def test_rank_failure_restarts_group_then_succeeds(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    apply(kubectl, namespace, two_rank_job("rs", backoffLimit=2))
    pods = _pods_up(kubelet, "rs", 2, wait_for)
    for p in pods:
        kubelet.set_status(p, "Running")
    _wait_phase(kube_api, namespace, "rs", "Running", wait_for)
    old_uids = {p.metadata.uid for p in kubelet.live_pods("rs")}
    kubelet.set_status("rs-rank-1", "Failed", exit_code=1, message="Traceback\nRuntimeError: NCCL timeout\n")
    pods = _pods_up(kubelet, "rs", 2, wait_for, attempt=1)
    assert not old_uids & {p.metadata.uid for p in kubelet.live_pods("rs")}  # every rank was recreated
    st = status(kube_api, namespace, "rs")
    assert st["restartCount"] == 1 and st["failures"][0]["rank"] == 1
    for p in pods:
        kubelet.set_status(p, "Succeeded", exit_code=0, reason="Completed")
    st = _wait_phase(kube_api, namespace, "rs", "Succeeded", wait_for)
    assert st["restartCount"] == 1


def test_running_rank_deleted_by_someone_else_restarts_the_group(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, cluster: Cluster, wait_for: Any
) -> None:
    """`kubectl delete pod` (or an eviction, a drain) of a running rank restarts the group at once instead of
    leaving the other ranks to hang in collectives until a timeout."""
    if cluster.pki is None:
        pytest.skip("binds a pod to a node of its own; an external cluster's kubelets would run it")
    kubelet = Kubelet(kube_api, namespace, finalize_deletions=False)  # deletions stay Terminating until we say
    node = NodeLogs(kube_api, cluster.pki, f"del-{namespace}"[:63])
    try:
        apply(kubectl, namespace, two_rank_job("dl", backoffLimit=2))
        pods = _pods_up(kubelet, "dl", 2, wait_for)
        node.bind(namespace, "dl-rank-1")  # graceful deletion needs a node: an unbound pod goes at once
        for p in pods:
            kubelet.set_status(p, "Running")
        _wait_phase(kube_api, namespace, "dl", "Running", wait_for)
        kubectl("delete", "pod", "dl-rank-1", "-n", namespace, "--wait=false")
        st = _wait_phase(kube_api, namespace, "dl", "Restarting", wait_for)
        assert st["restartCount"] == 1 and st["failures"][-1]["rank"] == 1
        assert st["failures"][-1]["reason"] == "Deleted" and "kubectl delete" in st["failures"][-1]["logTail"]
        # The kubelet finishes stopping the deleted pod; the new attempt starts under the same names.
        client.CoreV1Api(kube_api).delete_namespaced_pod("dl-rank-1", namespace, grace_period_seconds=0)
        _pods_up(kubelet, "dl", 2, wait_for, attempt=1)
    finally:
        kubelet.stop()
        node.close()


def test_failures_past_backoff_limit_fail_with_rank_and_reason(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    apply(kubectl, namespace, two_rank_job("bo", backoffLimit=1))
    for attempt in (0, 1):
        pods = _pods_up(kubelet, "bo", 2, wait_for, attempt=attempt)
        for p in pods:
            kubelet.set_status(p, "Running")
        kubelet.set_status("bo-rank-0", "Failed", exit_code=137, reason="OOMKilled", message="tokenizing...\n")
    st = _wait_phase(kube_api, namespace, "bo", "Failed", wait_for)
    assert st["reason"] == "OOMKilled"
    assert "rank 0 (pod bo-rank-0) failed: OOMKilled (exit code 137)" in st["message"]
    assert "tokenizing..." in st["message"]
    wait_for(
        lambda: [p.metadata.name for p in kubelet.live_pods("bo") if p.status.phase == "Running"] == [],
        timeout=30,
        message="no running pod after Failed",
    )
    assert status(kube_api, namespace, "bo")["restartCount"] == 1


def test_suspend_and_resume(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    apply(kubectl, namespace, two_rank_job("sus"))
    _pods_up(kubelet, "sus", 2, wait_for)
    kubectl("patch", "ftj", "sus", "-n", namespace, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    _wait_phase(kube_api, namespace, "sus", "Suspended", wait_for)
    wait_for(lambda: kubelet.pods("sus") == [], timeout=30, message="no pods while suspended")
    kubectl("patch", "ftj", "sus", "-n", namespace, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
    _pods_up(kubelet, "sus", 2, wait_for)
    assert status(kube_api, namespace, "sus")["restartCount"] == 0


def test_active_deadline_fails_job(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    apply(kubectl, namespace, two_rank_job("dl", activeDeadlineSeconds=3))
    for p in _pods_up(kubelet, "dl", 2, wait_for):
        kubelet.set_status(p, "Running")
    st = _wait_phase(kube_api, namespace, "dl", "Failed", wait_for, timeout=30)
    assert st["reason"] == "DeadlineExceeded"
    wait_for(lambda: kubelet.pods("dl") == [], timeout=30, message="running pods deleted at the deadline")


def test_ttl_after_finished_removes_job_and_children_for_good(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    apply(kubectl, namespace, two_rank_job("ttl", ttlSecondsAfterFinished=2))
    for p in _pods_up(kubelet, "ttl", 2, wait_for):
        kubelet.set_status(p, "Succeeded", exit_code=0, reason="Completed")
    _wait_phase(kube_api, namespace, "ttl", "Succeeded", wait_for)
    wait_for(lambda: get_job(kube_api, namespace, "ttl") is None, timeout=30, message="job deleted by TTL")
    core = client.CoreV1Api(kube_api)
    wait_for(
        lambda: (
            not core.list_namespaced_config_map(namespace, label_selector="finetune.dev/job-name=ttl").items
            and not kubelet.pods("ttl")
        ),
        timeout=60,
        message="children garbage-collected",
    )
    # Stays gone: nothing recreates it (poll a few reconcile periods).
    with pytest.raises(TimeoutError):
        wait_for(lambda: get_job(kube_api, namespace, "ttl") or kubelet.pods("ttl"), timeout=5, message="recreated")


def test_deleting_job_garbage_collects_children(
    operator: Path, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, wait_for: Any
) -> None:
    apply(kubectl, namespace, two_rank_job("gc"))
    _pods_up(kubelet, "gc", 2, wait_for)
    core = client.CoreV1Api(kube_api)
    assert core.list_namespaced_service(namespace, label_selector="finetune.dev/job-name=gc").items
    kubectl("delete", "ftj", "gc", "-n", namespace, "--wait=false")
    wait_for(
        lambda: (
            not kubelet.pods("gc")
            and not core.list_namespaced_service(namespace, label_selector="finetune.dev/job-name=gc").items
            and not core.list_namespaced_config_map(namespace, label_selector="finetune.dev/job-name=gc").items
        ),
        timeout=60,
        message="children garbage-collected",
    )


def test_repeated_events_are_aggregated(kube_api: Any, namespace: str) -> None:
    """A repeated event bumps count/lastTimestamp on one Event (as kubectl describe shows "x3"), a different
    message is an Event of its own."""
    job = {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "ev", "namespace": namespace, "uid": "6b1c7e6e-0000-4000-8000-000000000001"},
    }
    kube = Kube(kube_api)
    for _ in range(3):
        kube.event(job, "Warning", "ReconcileError", "reconcile error: ConfigMap clash")
    kube.event(job, "Warning", "ReconcileError", "reconcile error: something else")
    events = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
    assert sorted((e.message, e.count) for e in events) == [
        ("reconcile error: ConfigMap clash", 3),
        ("reconcile error: something else", 1),
    ]
    assert all(e.involved_object.uid == job["metadata"]["uid"] for e in events)
