"""Kueue's controller manager as a host process against a running cluster (LocalCluster or any kubeconfig).

`KueueProcess(kubeconfig, directory).start()`:
1. applies Kueue's CRDs from the module the binary is built from (`bins.kueue_crds()`);
2. issues a serving certificate for 127.0.0.1 from a throwaway CA of its own;
3. writes a Kueue `Configuration` (webhook server on a free loopback port with that certificate, no internal
   cert management, no leader election, health and metrics on loopback, `FineTuneJob.v1alpha1.finetune.dev`
   as an external framework and no built-in integration; `waitForPodsReady` when `wait_for_pods_ready` names a
   timeout) and starts `kueue --config`;
4. registers Kueue's own admission webhooks (the kueue.x-k8s.io ones of its `config/components/webhook`: the
   Workload, ClusterQueue, ResourceFlavor and Cohort defaulting/validation) on the API server with a loopback
   URL and the CA bundle, once /readyz answers.

Kueue runs with the kubeconfig it is given (the tests pass the admin one); its RBAC in a real install is the
upstream chart's concern, not this tier's.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml

from ftjob_cluster import bins, pki
from ftjob_cluster.localcluster import _die_with_parent, _terminate_group, free_port

# The one framework the operator integrates as (Kind.version.group); Kueue treats Workloads owned by such
# objects as jobs managed by an external controller.
EXTERNAL_FRAMEWORK = "FineTuneJob.v1alpha1.finetune.dev"
WEBHOOK_GROUP = "kueue.x-k8s.io"
METRICS_CERT_DIR = "/etc/kueue/metrics/certs"  # fixed in Kueue's main.go; see KueueProcess._with_metrics_certs


def webhook_configurations(url: str, ca_bundle: bytes) -> list[dict[str, object]]:
    """Kueue's kueue.x-k8s.io webhooks, pointed at `url` (its loopback webhook server)."""
    source = bins.kueue_crds().parent.parent / "webhook" / "manifests.yaml"
    out = []
    for doc in yaml.safe_load_all(source.read_text()):
        hooks = [w for w in doc["webhooks"] if any(WEBHOOK_GROUP in r["apiGroups"] for r in w["rules"])]
        for w in hooks:
            path = w["clientConfig"]["service"]["path"]
            w["clientConfig"] = {"url": url + path, "caBundle": base64.b64encode(ca_bundle).decode()}
        name = "ftjob-kueue-" + ("mutating" if doc["kind"].startswith("Mutating") else "validating")
        out.append(
            {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": {"name": name}, "webhooks": hooks}
        )
    return out


class KueueProcess:
    def __init__(
        self, kubeconfig: Path, directory: Path, kubectl: Path | None = None, wait_for_pods_ready: str | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.directory = directory
        # Kueue's all-or-nothing setting: an admitted Workload not PodsReady within this timeout (a duration,
        # e.g. "20s") is evicted and requeued. None: off (Kueue's default). Read at start().
        self.wait_for_pods_ready = wait_for_pods_ready
        self.kubectl = kubectl or bins.ensure_binary("kubectl")
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "kueue.log"

    def _kubectl(self, *args: str, input: str | None = None) -> str:
        cmd = [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:4])}... failed: {proc.stderr}")
        return proc.stdout

    def install_crds(self) -> None:
        # Kueue's own namespace (its Configuration names it; events and leases of a real install live there).
        ns = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}})
        self._kubectl("apply", "-f", "-", input=ns)
        crds = bins.kueue_crds()
        # Server-side: the Workload CRD is larger than client-side apply's last-applied annotation allows.
        self._kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
        self._kubectl("wait", "--for=condition=Established", "--timeout=120s", "-f", str(crds))

    def start(self, timeout: float = 180.0) -> KueueProcess:
        binary = bins.ensure_binary("kueue")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.install_crds()
        certs = self.directory / "certs"
        ca = pki.webhook_serving_pair(certs, "kueue-webhook")
        self.webhook_port, health, metrics = free_port(), free_port(), free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": [], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
        }
        if self.wait_for_pods_ready:
            config["waitForPodsReady"] = {"timeout": self.wait_for_pods_ready}
        config_path = self.directory / "kueue-config.yaml"
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        kueue = [
            str(binary),
            f"--config={config_path}",
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ]
        cmd = self._with_metrics_certs(kueue, certs)
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
        hooks = webhook_configurations(f"https://127.0.0.1:{self.webhook_port}", ca.cert.read_bytes())
        self._kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(h) for h in hooks))
        return self

    def _with_metrics_certs(self, kueue: list[str], certs: Path) -> list[str]:
        """Kueue 0.17 without internal cert management reads its metrics serving certificate from the fixed
        path /etc/kueue/metrics/certs (cmd/kueue/main.go) and exits without it. Rather than write into this
        machine's /etc, Kueue runs in a private mount namespace whose /etc is an overlay (upper layer on a
        tmpfs that lives as long as that namespace) holding the certificate there: nothing outside changes.
        Needs root or unprivileged user namespaces (`unshare --map-root-user`)."""
        scratch = self.directory / "etc-overlay"
        scratch.mkdir(exist_ok=True)
        setup = (
            f'mount -t tmpfs tmpfs "{scratch}" && mkdir "{scratch}/up" "{scratch}/work" && '
            f'mount -t overlay overlay -o lowerdir=/etc,upperdir="{scratch}/up",workdir="{scratch}/work" /etc && '
            f'mkdir -p {METRICS_CERT_DIR} && cp "{certs}/tls.crt" "{certs}/tls.key" {METRICS_CERT_DIR}/ && '
            'exec "$@"'
        )
        userns = [] if os.geteuid() == 0 else ["--map-root-user"]
        return ["unshare", "--mount", "--propagation", "private", *userns, "sh", "-c", setup, "kueue", *kueue]

    def _wait_ready(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"kueue exited with {self.process.returncode}; log {self.log_path}:\n"
                    + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"kueue not ready within {timeout:.0f} s; log {self.log_path}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process is None:
            return
        try:  # webhooks pointing at a dead server would fail every later Workload write (failurePolicy: Fail)
            self._kubectl(
                "delete",
                "--ignore-not-found",
                "mutatingwebhookconfiguration/ftjob-kueue-mutating",
                "validatingwebhookconfiguration/ftjob-kueue-validating",
            )
        finally:
            _terminate_group(self.process.pid, 15.0, self.process)
            self.process = None
