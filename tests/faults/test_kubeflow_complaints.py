"""One named test per failure Kubeflow's training and MPI operators are known for, against the real operator
and API server (pod status written as a kubelet writes it). The two start-order tests also run the pods' own
init commands for real, in a private mount namespace whose /etc/hosts stands in for cluster DNS."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultlib import OperatorProcess, record, status, two_rank_job, violations, wait_until
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_support import Kubelet, job_yaml
from tierdeps import require

from finetune_operator import constants as c
from finetune_runtime.sshd import ensure_privsep_dir


@pytest.fixture(scope="module")
def operator(crd: None, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log")
    wait_until(op.healthy, 60, "operator /healthz")
    yield op
    op.stop()


@pytest.fixture
def kubelet(kube_api: Any, namespace: str) -> Iterator[Kubelet]:
    k = Kubelet(kube_api, namespace)
    yield k
    k.stop()


def _apply(kubectl: Any, ns: str, job: dict[str, Any]) -> None:
    kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(job))


def _pod(kube_api: Any, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = kube_api.sanitize_for_serialization(client.CoreV1Api(kube_api).read_namespaced_pod(name, ns))
    return out


HOLD = "finetune.dev/test-hold"


def _once(name: str, injection: str) -> Any:
    rec = record(name, injection)
    rec.trials = 1
    return rec


def test_failed_job_leaves_no_pod_running(
    operator: OperatorProcess, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet
) -> None:
    """Kubeflow: a job marked Failed while its other pods keep running (and holding accelerators)."""
    rec = _once("test_failed_job_leaves_no_pod_running", "rank 0 exits 1 with backoffLimit 0 while rank 1 runs")
    _apply(kubectl, namespace, two_rank_job("fl", backoffLimit=0))
    wait_until(lambda: len(kubelet.live_pods("fl")) == 2, 60, "2 pods")
    for p in kubelet.live_pods("fl"):
        kubelet.set_status(p.metadata.name, "Running")
    wait_until(lambda: status(kube_api, namespace, "fl").get("phase") == "Running", 60, "Running")
    kubelet.set_status("fl-rank-0", "Failed", exit_code=1, message="Traceback: boom")
    wait_until(lambda: status(kube_api, namespace, "fl").get("phase") == "Failed", 60, "Failed")
    wait_until(
        lambda: [p.metadata.name for p in kubelet.live_pods("fl")] == ["fl-rank-0"],
        60,
        "rank 1 deleted; the failed pod kept for its logs",
    )
    st = status(kube_api, namespace, "fl")
    assert st["reason"] == "BackoffLimitExceeded" and "rank 0 (pod fl-rank-0) failed: exit code 1" in st["message"]
    rec.notes.append("the running rank was deleted as the job failed; the failed pod kept for its logs")


def _run_init(pod: dict[str, Any], hosts: dict[str, str], env: dict[str, str], timeout_s: int) -> tuple[int, str]:
    """Runs the pod's wait-for-peers init container's command here, with `hosts` as the only names that resolve
    besides localhost (a private mount namespace's /etc/hosts), its --timeout cut to `timeout_s`."""
    (init,) = [i for i in pod["spec"]["initContainers"] if i["name"] == c.INIT_WAIT]
    cmd = list(init["command"])
    cmd[cmd.index("--timeout") + 1] = str(timeout_s)
    cmd[0] = str(Path(sys.executable).with_name(cmd[0]))  # the runtime's console script, from this venv
    hosts_file = Path(env.pop("HOSTS_FILE"))
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {h}\n" for h, ip in hosts.items()))
    pod_env = {e["name"]: e["value"] for e in init.get("env") or [] if "value" in e}
    script = f'mount --bind {hosts_file} /etc/hosts && exec "$@"'
    r = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", *cmd],
        capture_output=True,
        text=True,
        env={**os.environ, **pod_env, **env},
        timeout=timeout_s + 30,
    )
    return r.returncode, r.stdout + r.stderr


def _unshare_works() -> bool:
    return (
        shutil.which("unshare") is not None
        and subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0
    )


def test_workers_wait_for_the_masters_name(
    operator: OperatorProcess, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet, tmp_path: Path
) -> None:
    """Kubeflow PyTorchJob: workers start before the master's Service name resolves and crash in rendezvous."""
    if not _unshare_works():
        pytest.skip("needs `unshare --mount` (root or user namespaces) to give the init command its own /etc/hosts")
    rec = _once(
        "test_workers_wait_for_the_masters_name",
        "rank 1's own init command run while the master's name does not resolve, then once it does",
    )
    _apply(kubectl, namespace, two_rank_job("wm"))
    wait_until(lambda: len(kubelet.live_pods("wm")) == 2, 60, "2 pods")
    svc = client.CoreV1Api(kube_api).read_namespaced_service("wm", namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses, (
        "the master's name must resolve as soon as its pod has an address, not once it is Ready"
    )
    master = _pod(kube_api, namespace, "wm-rank-0")
    assert not [i for i in master["spec"].get("initContainers") or [] if i["name"] == c.INIT_WAIT]
    worker = _pod(kube_api, namespace, "wm-rank-1")
    (init,) = [i for i in worker["spec"]["initContainers"] if i["name"] == c.INIT_WAIT]
    master_addr = init["command"][init["command"].index("--dns") + 1]
    assert master_addr == f"wm-rank-0.wm.{namespace}.svc", init["command"]
    rc, out = _run_init(worker, {}, {"HOSTS_FILE": str(tmp_path / "hosts")}, timeout_s=3)
    assert rc == 1 and f"dns:{master_addr} does not resolve" in out, out
    rc, out = _run_init(worker, {master_addr: "127.0.0.1"}, {"HOSTS_FILE": str(tmp_path / "hosts")}, timeout_s=30)
    assert rc == 0 and f"dns:{master_addr} ready" in out, out
    rec.notes.append(
        "rank 1's init container blocks until the master's name resolves (headless Service, publishNotReadyAddresses)"
    )


@pytest.fixture
def sshd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A real OpenSSH sshd's port and path (what an MPI worker runs); the test starts it when the workers would
    be ready."""
    exe = require(request, "sshd")
    require(request, "ssh")  # ssh-keygen comes with it
    key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cfg = tmp_path / "sshd_config"
    cfg.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {key}\nPidFile {tmp_path / 'sshd.pid'}\nUsePAM no\n")
    ensure_privsep_dir()  # as the runtime does before its sshd: a fresh machine may not have /run/sshd yet
    yield port, exe


def test_launcher_waits_for_every_workers_sshd(
    operator: OperatorProcess,
    kubectl: Any,
    kube_api: Any,
    namespace: str,
    kubelet: Kubelet,
    sshd: tuple[int, str],
    tmp_path: Path,
) -> None:
    """Kubeflow MPIJob: the launcher starts mpirun before the workers' sshd is up and fails at once."""
    if not _unshare_works():
        pytest.skip("needs `unshare --mount` (root or user namespaces) to give the init command its own /etc/hosts")
    rec = _once(
        "test_launcher_waits_for_every_workers_sshd",
        "the launcher's own init command run while the workers' names resolve but no sshd answers, then "
        "with a real sshd answering",
    )
    _apply(kubectl, namespace, two_rank_job("lw", mpi=True))
    wait_until(lambda: len(kubelet.live_pods("lw")) == 3, 60, "launcher and 2 workers")
    for i in range(2):
        probe = _pod(kube_api, namespace, f"lw-worker-{i}")["spec"]["containers"][0]["readinessProbe"]
        assert probe["tcpSocket"]["port"] == c.SSH_PORT, "a worker is Ready only once its sshd listens"
    launcher = _pod(kube_api, namespace, "lw-launcher")
    (init,) = [i for i in launcher["spec"]["initContainers"] if i["name"] == c.INIT_WAIT]
    hosts = [init["command"][i + 1] for i, a in enumerate(init["command"]) if a == "--ssh"]
    assert len(hosts) == 2 and all(h.startswith("lw-worker-") for h in hosts), init["command"]
    # Every name it resolves: the workers', and the launcher's own (Hydra's proxies dial mpiexec back by it).
    names = [init["command"][i + 1] for i, a in enumerate(init["command"]) if a == "--dns"]
    assert set(hosts) | {f"lw-launcher.lw.{namespace}.svc"} == set(names), init["command"]
    env = {"FTJOB_SSH_PORT": str(sshd[0]), "HOSTS_FILE": str(tmp_path / "hosts")}  # the workers' sshd port, here
    rc, out = _run_init(launcher, dict.fromkeys(names, "127.0.0.1"), dict(env), timeout_s=3)
    assert rc == 1 and "not reachable" in out, out
    port, exe = sshd
    proc = subprocess.Popen(
        [exe, "-D", "-e", "-f", str(tmp_path / "sshd_config")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        rc, out = _run_init(launcher, dict.fromkeys(names, "127.0.0.1"), dict(env), timeout_s=30)
    finally:
        proc.terminate()
        sshd_out, _ = proc.communicate(timeout=10)
    assert rc == 0, f"{out}\nsshd (exit {proc.returncode}) said:\n{sshd_out.decode(errors='replace')}"
    for h in hosts:
        assert f"ssh:{h}:{port} ready" in out, out
    rec.notes.append("mpirun starts only after every worker's name resolves and its sshd answers with a banner")


def test_worker_oom_is_not_shown_as_a_launcher_crash(
    operator: OperatorProcess, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet
) -> None:
    """Kubeflow MPIJob: a worker OOMKilled shows only as the launcher's exit code 1 (mpirun lost its ssh)."""
    rec = _once(
        "test_worker_oom_is_not_shown_as_a_launcher_crash",
        "worker 1's sshd OOMKilled (exit 137), the launcher exiting 1 right after; backoffLimit 0",
    )
    _apply(kubectl, namespace, two_rank_job("oom", mpi=True, backoffLimit=0))
    wait_until(lambda: len(kubelet.live_pods("oom")) == 3, 60, "launcher and 2 workers")
    for p in kubelet.live_pods("oom"):
        kubelet.set_status(
            p.metadata.name, "Running", container="launcher" if "launcher" in p.metadata.name else "sshd"
        )
    wait_until(lambda: status(kube_api, namespace, "oom").get("phase") == "Running", 60, "Running")
    kubelet.set_status("oom-worker-1", "Failed", container="sshd", exit_code=137, reason="OOMKilled")
    try:
        kubelet.set_status(
            "oom-launcher",
            "Failed",
            container="launcher",
            exit_code=1,
            message="ORTE has lost communication with a remote daemon",
        )
    except ApiException as e:  # the operator already ended the job on the worker's OOM and removed the launcher
        if e.status != 404:
            raise
    wait_until(lambda: status(kube_api, namespace, "oom").get("phase") == "Failed", 60, "Failed")
    st = status(kube_api, namespace, "oom")
    assert st["reason"] == "OOMKilled", st
    assert st["message"].startswith("rank 1 (pod oom-worker-1) failed: OOMKilled (exit code 137)"), st["message"]
    rec.notes.append("status.reason OOMKilled naming the worker, not the launcher's exit code")


def test_ttl_clean_up_then_re_creation(
    operator: OperatorProcess, kubectl: Any, kube_api: Any, namespace: str, wait_for: Any
) -> None:
    """Kubeflow: a job re-created under the same name right after its TTL clean-up finished at once, seeing the
    old job's Succeeded pods that the garbage collector had not removed yet."""
    rec = _once(
        "test_ttl_clean_up_then_re_creation",
        "ttlSecondsAfterFinished=1 deletes a Succeeded job; the same name is applied again while the old "
        "pods still exist (held by a finalizer past the garbage collector's delete)",
    )
    kubelet = Kubelet(kube_api, namespace, finalize_deletions=False)  # old pods stay Terminating until we say
    core = client.CoreV1Api(kube_api)
    try:
        _apply(kubectl, namespace, two_rank_job("ttl", ttlSecondsAfterFinished=1))
        wait_until(lambda: len(kubelet.live_pods("ttl")) == 2, 60, "2 pods")
        old_uids = {p.metadata.uid for p in kubelet.live_pods("ttl")}
        # Finished pods are removed at once when deleted; a finalizer (as Kueue's pod integration adds one) keeps
        # them past the garbage collector's delete, which otherwise only makes the window short, not closed.
        for p in kubelet.live_pods("ttl"):
            core.patch_namespaced_pod(p.metadata.name, namespace, {"metadata": {"finalizers": [HOLD]}})
        for p in kubelet.live_pods("ttl"):
            kubelet.set_status(p.metadata.name, "Succeeded", exit_code=0, reason="Completed")
        wait_until(lambda: not status(kube_api, namespace, "ttl"), 60, "the TTL deleted the job")
        _apply(kubectl, namespace, two_rank_job("ttl"))
        # While the old, Succeeded pods remain, the new job must neither count them nor create over them.
        try:
            wait_until(
                lambda: status(kube_api, namespace, "ttl").get("reason") == "ForeignChildren",
                60,
                "the new job waiting on the old pods",
            )
        except AssertionError as e:
            pods = [
                (p.metadata.name, p.metadata.uid in old_uids, p.status.phase, bool(p.metadata.deletion_timestamp))
                for p in kubelet.pods("ttl")
            ]
            raise AssertionError(f"{e}; status {status(kube_api, namespace, 'ttl')}; pods {pods}") from None
        st = status(kube_api, namespace, "ttl")
        assert st["phase"] == "Pending", st
        for p in kubelet.pods("ttl"):  # the finalizer's owner lets go of the old pods
            if p.metadata.uid in old_uids:
                core.patch_namespaced_pod(p.metadata.name, namespace, {"metadata": {"finalizers": None}})
        wait_until(
            lambda: (
                len(kubelet.live_pods("ttl")) == 2 and not {p.metadata.uid for p in kubelet.live_pods("ttl")} & old_uids
            ),
            60,
            "the new job's own pods",
        )
        st = status(kube_api, namespace, "ttl")
        assert st["phase"] == "Pending" and not st.get("foreignChildren"), st
        assert violations(kube_api, namespace) == []
    finally:
        for p in kubelet.pods("ttl"):  # never leave a held pod behind (it would hold the namespace too)
            if HOLD in (p.metadata.finalizers or []):
                core.patch_namespaced_pod(p.metadata.name, namespace, {"metadata": {"finalizers": None}})
        kubelet.stop()
    rec.notes.append(
        "the new job waited (ForeignChildren) and then ran its own pods; it never finished from the old ones"
    )


def _warnings(kubectl: Any, ns: str) -> list[dict[str, Any]]:
    out = json.loads(
        kubectl(
            "get", "events", "-n", ns, "--field-selector", "type=Warning,involvedObject.kind=FineTuneJob", "-o", "json"
        ).stdout
    )
    return list(out["items"])


def test_errors_are_never_only_in_events(
    operator: OperatorProcess, kubectl: Any, kube_api: Any, namespace: str, kubelet: Kubelet
) -> None:
    """Kubeflow: the reason a job is stuck or failed shows only as an Event (gone after an hour). Every Warning
    Event the operator posts is, when it appears, also in the job's status: message, a condition or failures."""
    rec = _once(
        "test_errors_are_never_only_in_events",
        "a rank failure (restart), a foreign object in a child's name (ReconcileError), a pod the API "
        "server refuses (InvalidSpec), backoffLimit reached",
    )
    core = client.CoreV1Api(kube_api)
    # A ConfigMap in the name of the job's own, with no owner and no labels: the operator's create meets a 409.
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="ev-a-config")))
    _apply(kubectl, namespace, two_rank_job("ev-a"))
    bad = two_rank_job("ev-b")
    bad["spec"]["hardware"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    }
    _apply(kubectl, namespace, bad)
    _apply(kubectl, namespace, two_rank_job("ev-c", backoffLimit=1))
    wait_until(lambda: len(kubelet.live_pods("ev-c")) == 2, 60, "ev-c pods")
    for attempt in range(2):
        wait_until(lambda: len(kubelet.live_pods("ev-c")) == 2, 60, "ev-c pods")
        kubelet.set_status(
            sorted(p.metadata.name for p in kubelet.live_pods("ev-c"))[1],
            "Failed",
            exit_code=3,
            message=f"injected failure {attempt}",
        )
        wait_until(
            lambda a=attempt: (
                status(kube_api, namespace, "ev-c").get("phase") == "Failed"
                if a
                else status(kube_api, namespace, "ev-c").get("restartCount") == 1
            ),
            60,
            "ev-c restarted, then Failed",
        )

    def every_warning_in_status() -> list[str] | None:
        events = _warnings(kubectl, namespace)
        reasons = {e["reason"] for e in events}
        if not {"ReconcileError", "InvalidSpec", "RankFailed", "BackoffLimitExceeded"} <= reasons:
            return None
        missing = []
        for e in events:
            st = status(kube_api, namespace, e["involvedObject"]["name"])
            text = json.dumps(st)
            head = e["message"].splitlines()[0][:120]
            # A restart's message gives way to the next phase's; its failure stays in status.failures.
            recorded = any(f"(pod {f['pod']})" in head for f in st.get("failures", []))
            if json.dumps(head)[1:-1] not in text and not (e["reason"] == "RankFailed" and recorded):
                missing.append(f"{e['reason']}: {head!r} not in status of {e['involvedObject']['name']}")
        return missing

    missing = wait_until(lambda: every_warning_in_status() is not None and [1], 60, "every kind of warning")
    missing = every_warning_in_status()
    assert missing == [], missing
    rec.notes.append("ReconcileError, InvalidSpec, RankFailed and BackoffLimitExceeded each also in status")
