"""Helpers for the chart tiers that install into a real control plane (test_install.py, test_upgrade.py):
kubectl with the admin kubeconfig, a kubeconfig holding only a ServiceAccount's token, and the operator run as
a local process with exactly what the chart's Deployment, ConfigMap and ServiceAccount give it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from crd_adoption import adoption_command
from yaml12 import Yaml12Loader

from ftjob_cluster.localcluster import wait_for


class Kubectl:
    def __init__(self, binary: str, kubeconfig: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [self.binary, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
        return proc.stdout

    def get(self, *args: str) -> Any:
        """The object as a dict, or None when it does not exist; any other error fails the test."""
        proc = subprocess.run(
            [self.binary, f"--kubeconfig={self.kubeconfig}", "get", *args, "-o", "yaml"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(args)} failed:\n{proc.stderr}")
        # YAML 1.2, as kubectl wrote it: a CRD default such as 5e-05 is a number, not a string.
        return yaml.load(proc.stdout, Loader=Yaml12Loader)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def service_account_kubeconfig(kubectl: Kubectl, namespace: str, sa: str, dest: Path) -> Path:
    """The admin kubeconfig's cluster entry with a TokenRequest token of `sa` as the only credential."""
    admin = yaml.safe_load(kubectl.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    token = kubectl("create", "token", sa, "-n", namespace, "--duration=1h").strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": sa}}],
        "current-context": "sa",
    }
    # A relative certificate-authority path in the admin kubeconfig must keep pointing at the same file.
    ca = cluster.get("certificate-authority")
    if ca and not os.path.isabs(ca):
        cluster["certificate-authority"] = str((kubectl.kubeconfig.parent / ca).resolve())
    dest.write_text(yaml.safe_dump(config))
    return dest


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status), resp.read().decode()
    except OSError:
        return 0, ""


@dataclass
class ChartOperator:
    """An operator process started from the release's Deployment (see `chart_operator`)."""

    proc: subprocess.Popen[bytes]
    args: list[str]
    health: int
    metrics: int
    log: Path
    pod_name: str

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, as the kubelet stops a container; SIGKILL if it outlives `timeout`."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextlib.contextmanager
def chart_operator(
    kubectl: Kubectl,
    release_ns: str,
    fullname: str,
    work: Path,
    pod_name: str,
    source: Path | None = None,
) -> Iterator[ChartOperator]:
    """The operator as the release's Deployment runs it, as a local process (no kubelet runs the pod here):
    its ServiceAccount's token, the ConfigMap's config file, the container's args (local paths and free ports in
    place of the in-cluster ones) and the downward-API environment, with `pod_name` as its pod's name.

    `source`: a checkout whose operator/ and runtime/ packages run instead of the installed ones (an older
    release's operator, with this venv's dependencies)."""
    work.mkdir(parents=True, exist_ok=True)
    deployment = kubectl.get("deployment", fullname, "-n", release_ns)
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config_map = kubectl.get("configmap", f"{fullname}-config", "-n", release_ns)
    config = work / "config.yaml"
    config.write_text(config_map["data"]["config.yaml"])
    kubeconfig = service_account_kubeconfig(kubectl, release_ns, pod["serviceAccountName"], work / "sa.kubeconfig")
    metrics_port, health_port = free_port(), free_port()
    args = []
    for arg in container["args"]:
        if arg.startswith("--config="):
            arg = f"--config={config}"
        elif arg.startswith("--metrics-port="):
            arg = f"--metrics-port={metrics_port}"
        elif arg.startswith("--health-port="):
            arg = f"--health-port={health_port}"
        args.append(arg)
    assert container["command"] == ["ftjob"], container["command"]
    env = {**os.environ}
    if source is None:
        command = [str(Path(sys.executable).with_name("ftjob"))]
    else:
        # `ftjob` is finetune_operator.cli:main; the older packages come first on the path.
        command = [sys.executable, "-m", "finetune_operator.cli"]
        env["PYTHONPATH"] = os.pathsep.join(str(source / p) for p in ("operator", "runtime"))
    # The container's environment as the kubelet gives it: the downward API's pod name and namespace.
    fields = {"metadata.name": pod_name, "metadata.namespace": release_ns}
    pod_env = {
        e["name"]: e.get("value") or fields[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in container.get("env", [])
    }
    env.update({"KUBECONFIG": str(kubeconfig), **pod_env})
    log_path = work / "operator.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*command, *args], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    running = ChartOperator(proc, args, health_port, metrics_port, log_path, pod_name)
    try:
        yield running
    finally:
        running.stop()


def wait_healthy(operator: ChartOperator, timeout: float = 90) -> None:
    def healthy() -> bool:
        operator.check_alive()
        return http_get(f"http://127.0.0.1:{operator.health}/healthz")[0] == 200

    wait_for(healthy, timeout=timeout, message="operator /healthz")


def adopt_crd(kubectl: Kubectl, release: str, namespace: str) -> None:
    """Runs the chart README's adoption command for `release` in `namespace`."""
    kubectl(*adoption_command(release, namespace))
