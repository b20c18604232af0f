"""Kubeflow training-operator v1 (the PyTorchJob controller) as a host process against a running cluster: the Go
peer that benchmarks/operator_scale.py --peer measures beside our operator.

`PeerProcess(kubeconfig, directory).start()`:
1. applies the PyTorchJob CRD from the module the binary is built from (`bins.peer_crd()`), server-side (it is
   larger than client-side apply's last-applied annotation allows);
2. creates the namespace and the empty Secret its cert rotator (open-policy-agent/cert-controller) reads
   first: without them the manager exits. The rotator fills the Secret; the validating webhook configuration
   it would inject the CA into is not registered, so PyTorchJobs are admitted without the peer's webhook
   (the rotator logs "Webhook not found" and carries on);
3. writes a throwaway serving pair to the webhook cert dir, which v1.8.1 hard-codes as
   /tmp/k8s-webhook-server/serving-certs (pkg/cert/cert.go; also controller-runtime's default with TMPDIR=/tmp).
   Rather than write into this machine's /tmp, the peer runs in a private mount namespace with a tmpfs on
   /tmp/k8s-webhook-server holding the pair: outside, that folder stays an empty mount point;
4. starts it with `--enable-scheme=pytorchjob --leader-elect=false` and loopback ports of our choosing, and
   waits for /readyz (certificates ready) and the PyTorchJob controller's "Starting workers" log line.

Its client keeps client-go's default rate limit (20 requests/s, burst 30), as upstream ships it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from ftjob_cluster import bins, pki
from ftjob_cluster.localcluster import _die_with_parent, _terminate_group, free_port

CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in training-operator v1.8.1 pkg/cert/cert.go
NAMESPACE = "kubeflow"  # the rotator's Secret lives here (MY_POD_NAMESPACE, default kubeflow)
SECRET = "training-operator-webhook-cert"  # --webhook-secret-name's default
READY_LINE = "pytorchjob-controller"  # with "Starting workers" on one log line: its workers run


def peer_args(health_port: int, metrics_port: int, webhook_port: int) -> list[str]:
    """The peer's flags: the PyTorchJob controller alone, one replica, every port on loopback or ours."""
    return [
        "--enable-scheme=pytorchjob",
        "--leader-elect=false",
        f"--health-probe-bind-address=127.0.0.1:{health_port}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        f"--webhook-server-port={webhook_port}",
    ]


def in_private_cert_dir(command: list[str], certs: Path, cert_dir: Path = CERT_DIR) -> list[str]:
    """`command` run in a private mount namespace where `cert_dir` holds certs/tls.crt and certs/tls.key (a
    tmpfs on cert_dir's parent, which must exist as a mount point). Needs root or unprivileged user
    namespaces (`unshare --map-root-user`). `exec` keeps the pid: it is the peer's own."""
    mount = cert_dir.parent
    setup = (
        f'mount -t tmpfs tmpfs "{mount}" && mkdir -p "{cert_dir}" && '
        f'cp "{certs}/tls.crt" "{certs}/tls.key" "{cert_dir}/" && exec "$@"'
    )
    userns = [] if os.geteuid() == 0 else ["--map-root-user"]
    return ["unshare", "--mount", "--propagation", "private", *userns, "sh", "-c", setup, "peer", *command]


class PeerProcess:
    def __init__(self, kubeconfig: Path, directory: Path, admin_kubeconfig: Path | None = None) -> None:
        """`kubeconfig`: the identity the peer runs as; `admin_kubeconfig` (default: the same) installs."""
        self.kubeconfig = kubeconfig
        self.admin_kubeconfig = admin_kubeconfig or kubeconfig
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "training-operator.log"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _kubectl(self, *args: str, input: str | None = None) -> str:
        cmd = [str(bins.ensure_binary("kubectl")), f"--kubeconfig={self.admin_kubeconfig}", *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[2:5])}... failed: {proc.stderr}")
        return proc.stdout

    def install(self) -> None:
        crd = bins.peer_crd()
        self._kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))

        # Not `kubectl wait` or a jsonpath filter: both fail on a new CRD while .status.conditions is absent.
        def established() -> bool:
            status = json.loads(self._kubectl("get", "-f", str(crd), "-o", "json")).get("status") or {}
            return any(c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or [])

        deadline = time.monotonic() + 120
        while not established():
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {crd.name} not Established within 120 s")
            time.sleep(0.5)
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE}}
        docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, secret]
        self._kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))

    def start(self, timeout: float = 120.0) -> PeerProcess:
        binary = bins.ensure_binary("training-operator")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.install()
        certs = self.directory / "certs"
        pki.webhook_serving_pair(certs, "training-operator")
        CERT_DIR.parent.mkdir(parents=True, exist_ok=True)  # the mount point; stays empty outside
        health, metrics, webhook = free_port(), free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "TMPDIR": "/tmp"}
        env.pop("MY_POD_NAMESPACE", None)
        cmd = in_private_cert_dir([str(binary), *peer_args(health, metrics, webhook)], certs)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._wait_ready(f"http://127.0.0.1:{health}/readyz", timeout)
        return self

    def _ready(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status != 200:
                    return False
        except OSError:
            return False
        log = self.log_path.read_text(errors="replace")
        return any("Starting workers" in line and READY_LINE in line for line in log.splitlines())

    def _wait_ready(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._ready(url):
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"training-operator exited with {self.process.returncode}; log {self.log_path}:\n"
                    + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"training-operator not ready within {timeout:.0f} s; log {self.log_path}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process is not None:
            _terminate_group(self.process.pid, 15.0, self.process)
            self.process = None

    def __enter__(self) -> PeerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
