"""Running the real operator against the test control plane, and playing the kubelet's part for pod status.

There is no kubelet in this tier (a later tier adds one), so tests report pod lifecycles the way a kubelet
does: status patches on the pods' status subresource, and confirming graceful deletions. Jobs made here carry a
node selector that no node matches, so on a real cluster (`make e2e-kind`) no kubelet competes with them.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
import yaml
from ftjobs import make_job
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
NO_KUBELET = {"finetune.dev/test-no-kubelet": "true"}
API = ("finetune.dev", "v1alpha1")  # the FineTuneJob group and version, as CustomObjectsApi takes them


def get_job(kube_api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    """The FineTuneJob as the API server holds it; None when there is none."""
    try:
        obj: dict[str, Any] = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
            *API, ns, "finetunejobs", name
        )
        return obj
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def status(kube_api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """The job's status; {} when the job has none yet or does not exist."""
    return dict((get_job(kube_api, ns, name) or {}).get("status") or {})


def two_rank_job(name: str, mpi: bool = False, **run_policy: Any) -> dict[str, Any]:
    """A 2-rank text-classification FineTuneJob whose pods no kubelet runs (NO_KUBELET), with `run_policy`
    fields when given and the MPICH launcher when `mpi`."""
    b = make_job(name).nodes(2).classification().set("spec.hardware.nodeSelector", NO_KUBELET)
    if run_policy:
        b.run_policy(**run_policy)
    if mpi:
        b.launcher("mpi", "mpich")
    return b.build()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_crd(kubectl: Callable[..., Any], wait_for: Callable[..., Any]) -> None:
    crd = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "crd"], capture_output=True, text=True, check=True
    ).stdout
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=crd)
    # `kubectl wait` fails at once (not waits) while the new CRD has no status.conditions yet: poll it.
    wait_for(
        lambda: (
            kubectl(
                "wait", "--for=condition=Established", "crd/finetunejobs.finetune.dev", "--timeout=10s", check=False
            ).returncode
            == 0
        ),
        timeout=60,
        message="CRD Established",
    )
    # Established comes a moment before the API server's discovery documents list the new resource.
    wait_for(
        lambda: kubectl("get", "ftj", "-A", check=False).returncode == 0,
        timeout=60,
        message="finetunejobs in discovery",
    )
    # ... and the schema reaches the published OpenAPI (what `kubectl explain` reads) a moment later still.
    wait_for(
        lambda: kubectl("explain", "finetunejobs.spec", check=False).returncode == 0,
        timeout=60,
        message="CRD schema in OpenAPI",
    )


@dataclass
class RunningOperator:
    process: subprocess.Popen[bytes]
    metrics_url: str

    def reconciles(self) -> float:
        """finetune_operator_reconciles_total: full passes completed so far (from /metrics)."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            text = r.read().decode()
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("finetune_operator_reconciles_total ")
        )


@contextmanager
def running_operator(
    kubeconfig: Path,
    wait_for: Callable[..., Any],
    log_path: Path,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[RunningOperator]:
    """`ftjob operator` as a subprocess (the same entry point the image runs), ready when /healthz answers;
    `env` adds to its environment. Stopped with SIGTERM at the end (one a test stopped is continued first)."""
    health, metrics = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), **(env or {})}
    ftjob = str(Path(sys.executable).with_name("ftjob"))
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [ftjob, "operator", "--metrics-port", str(metrics), "--health-port", str(health), *(extra or [])],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"operator exited with {proc.returncode}; log {log_path}:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for(healthy, timeout=60, message="operator /healthz")
    try:
        yield RunningOperator(proc, f"http://127.0.0.1:{metrics}/metrics")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a SIGSTOPped process would hold the SIGTERM until continued
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class Kubelet:
    """Reports pod status like a kubelet would, and completes graceful deletions (as the kubelet does once
    containers have stopped)."""

    def __init__(self, api: client.ApiClient, namespace: str, finalize_deletions: bool = True):
        self.core = client.CoreV1Api(api)
        self.ns = namespace
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._finalize_deletions, daemon=True)
        if finalize_deletions:  # off: a deleted pod stays Terminating, as with a kubelet still stopping it
            self._thread.start()

    def _finalize_deletions(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, self.ns, timeout_seconds=5):
                    pod = ev["object"]
                    if pod.metadata.deletion_timestamp and ev["type"] != "DELETED":
                        # By uid, as a kubelet does: a new pod of the same name (the next attempt) may exist by now.
                        only_this = client.V1DeleteOptions(
                            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
                        )
                        try:
                            self.core.delete_namespaced_pod(pod.metadata.name, self.ns, body=only_this)
                        except ApiException as e:
                            if e.status not in (404, 409):  # gone, or the name is another pod's now
                                raise
                    if self._stop.is_set():
                        break
            except (ApiException, urllib3.exceptions.HTTPError):
                # The API server restarting (tests/faults) refuses connections for a while: watch again.
                self._stop.wait(0.5)
                continue
            finally:
                w.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def pods(self, job: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.ns, label_selector=f"finetune.dev/job-name={job}").items)

    def live_pods(self, job: str) -> list[Any]:
        return [p for p in self.pods(job) if not p.metadata.deletion_timestamp]

    def set_status(
        self,
        pod: str,
        phase: str,
        *,
        container: str = "trainer",
        exit_code: int | None = None,
        reason: str | None = None,
        message: str = "",
    ) -> None:
        status: dict[str, Any] = {"phase": phase}
        if phase == "Running":
            # Ready, as a kubelet reports a running pod without readiness probes (Kueue's PodsReady follows it).
            now = "2026-12-02T10:00:00Z"
            status["conditions"] = [
                {"type": t, "status": "True", "lastTransitionTime": now} for t in ("Ready", "ContainersReady")
            ]
            status["containerStatuses"] = [
                {
                    "name": container,
                    "ready": True,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {"running": {"startedAt": "2026-12-02T10:00:00Z"}},
                }
            ]
        elif exit_code is not None:
            status["containerStatuses"] = [
                {
                    "name": container,
                    "ready": False,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": reason or "Error",
                            "message": message,
                            "startedAt": "2026-12-02T10:00:00Z",
                            "finishedAt": "2026-12-02T10:00:01Z",
                        }
                    },
                }
            ]
        self.core.patch_namespaced_pod_status(pod, self.ns, {"status": status})


def job_yaml(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj)


def is_subset(want: Any, have: Any, path: str = "") -> str | None:
    """None if every field of `want` is in `have` with the same value (the API server may add more)."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return f"{path}: expected a mapping, got {have!r}"
        for k, v in want.items():
            if k not in have:
                return f"{path}.{k}: missing"
            err = is_subset(v, have[k], f"{path}.{k}")
            if err:
                return err
        return None
    if isinstance(want, list):
        if isinstance(have, list) and path.endswith(".tolerations"):
            have = have[: len(want)]  # the DefaultTolerationSeconds admission plugin appends not-ready/unreachable
        if not isinstance(have, list) or len(want) != len(have):
            return f"{path}: expected {len(want)} items, got {have!r}"
        for i, (a, b) in enumerate(zip(want, have, strict=True)):
            err = is_subset(a, b, f"{path}[{i}]")
            if err:
                return err
        return None
    if want != have and str(want) != str(have):
        return f"{path}: expected {want!r}, got {have!r}"
    return None


class NodeLogs:
    """A node whose kubelet endpoint serves container logs: the one kubelet API the operator depends on (the
    API server proxies `pods/log` to `https://<node InternalIP>:<kubeletEndpoint>/containerLogs/...`).

    Stands in for a kubelet until the node tier runs a real one; the API server side is real: it finds the
    node, dials it with its kubelet client certificate and checks the serving certificate against the
    cluster CA (LocalCluster's --kubelet-certificate-authority), exactly as with a kubelet."""

    def __init__(self, api: client.ApiClient, pki: Path, node: str) -> None:
        self.core = client.CoreV1Api(api)
        self.node = node
        self.logs: dict[tuple[str, str, str], str] = {}  # (namespace, pod, container) -> log text
        self.requests: list[str] = []
        logs, requests = self.logs, self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append(self.path)
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                text = logs.get(tuple(parts[1:4])) if len(parts) == 4 and parts[0] == "containerLogs" else None
                if text is None:
                    self.send_error(404)
                    return
                tail = urllib.parse.parse_qs(url.query).get("tailLines")
                if tail:
                    text = "".join(text.splitlines(keepends=True)[-int(tail[0]) :])
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(pki / "kubelet-serving.crt", pki / "kubelet-serving.key")
        tls.load_verify_locations(pki / "ca.crt")
        tls.verify_mode = ssl.CERT_REQUIRED  # like a kubelet: only clients our CA vouches for
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now}
        self.core.patch_node_status(
            node,
            {
                "status": {
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                    "conditions": [ready | {"lastTransitionTime": now, "message": "stand-in"}],
                }
            },
        )
        # Ready, and kept so as a kubelet does: by renewing its node Lease, which the node lifecycle controller
        # reads; otherwise it takes the node for lost after its grace period and the operator, which watches
        # nodes, would replace the pods bound here (runPolicy.nodeLossSeconds).
        self.coordination = client.CoordinationV1Api(api)
        self._stop = threading.Event()
        self._renew()
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _renew(self) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = {
            "metadata": {"name": self.node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": now},
        }
        try:
            self.coordination.replace_namespaced_lease(self.node, "kube-node-lease", lease)
        except ApiException as e:
            if e.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", lease)

    def _heartbeat(self) -> None:
        while not self._stop.wait(5.0):
            with contextlib.suppress(Exception):  # the cluster is going away with the test; the next one retries
                self._renew()

    def bind(self, namespace: str, pod: str) -> None:
        """Place a pod on this node, as the scheduler would (a binding ignores the pod's node selector)."""
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node),
        )
        # The generated client cannot parse the binding response (a Status); the request itself is what counts.
        self.core.create_namespaced_pod_binding(pod, namespace, body, _preload_content=False)

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        try:
            self.core.delete_node(self.node)
        except ApiException as e:
            if e.status != 404:
                raise
