"""A Kubernetes control plane made of the real upstream binaries, run as local processes on loopback.

`LocalCluster` owns a working directory (PKI, kubeconfigs, etcd data, one log per component) and an ordered
list of `Component`s. `start()` starts each in order and waits until its health endpoint answers before the
next; `stop()` stops them in reverse. A later node tier adds a kubelet + containerd by appending components
(see `Component`): nothing here assumes the list is fixed.

The cluster can also outlive the Python process that started it (`make cluster-up`): `start(detach=True)`
leaves the processes running and `state.json` in the directory lets `LocalCluster.stop_detached(dir)` find
them again.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ftjob_cluster import bins, pki

# Cluster-internal addresses only: these ranges are never routed, they exist for IP allocation (Service
# ClusterIPs). The first address of the service range is the `kubernetes` Service's ClusterIP and must be a
# SAN of the serving certificate.
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_FIRST_IP = "10.96.0.1"
# Groups and users that the apiserver's bootstrap RBAC policy already binds.
ADMIN_USER, ADMIN_GROUP = "ftjob-admin", "system:masters"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SCHEDULER_USER = "system:kube-scheduler"
# The first apiserver start runs RBAC bootstrap and CRD/OpenAPI post-start hooks, slow on a loaded machine
# (docs/cluster.md, "Start time"). The deadline is generous because CI shares the cores with other jobs.
DEFAULT_READY_TIMEOUT = 120.0

_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A component failed to start or become healthy; the message names its log file."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the child when the starting process dies, so a killed pytest leaks nothing."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _kubeconfig(server: str, ca: Path, client: pki.KeyPair, user: str) -> dict[str, object]:
    # Paths, not embedded data: the files sit next to the kubeconfig in the cluster directory.
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "ftjob-local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}],
        "contexts": [{"name": "ftjob-local", "context": {"cluster": "ftjob-local", "user": user}}],
        "current-context": "ftjob-local",
    }


@dataclass
class Context:
    """What components share: the directory layout, PKI and the addresses of components started before."""

    directory: Path
    ca: pki.CertificateAuthority
    serving: pki.KeyPair
    service_account: pki.KeyPair
    endpoints: dict[str, str] = field(default_factory=dict)  # e.g. "etcd" -> "http://127.0.0.1:2379"
    # Where the API server listens and what it advertises: loopback, or (node tier) an address pods can route
    # to, so the `kubernetes` Service reaches it through kube-proxy.
    api_address: str = "127.0.0.1"

    @property
    def pki_dir(self) -> Path:
        return self.directory / "pki"

    @property
    def log_dir(self) -> Path:
        return self.directory / "logs"

    def write_kubeconfig(self, stem: str, common_name: str, groups: tuple[str, ...] = ()) -> Path:
        """Client cert for `common_name` (+ groups) and a kubeconfig for it pointing at the apiserver.

        An existing pki/<stem>.crt is reused (the admin pair is issued early for health checks)."""
        client = pki.KeyPair(self.pki_dir / f"{stem}.crt", self.pki_dir / f"{stem}.key")
        if not client.cert.exists():
            client = self.ca.issue(stem, common_name, organizations=groups, client=True)
        path = self.directory / f"{stem}.kubeconfig"
        config = _kubeconfig(self.endpoints["kube-apiserver"], self.ca.pair.cert, client, common_name)
        path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML; no YAML dependency here
        path.chmod(0o600)
        return path

    def https_get(self, url: str, timeout: float = 3.0) -> tuple[int, str]:
        """GET with our CA and the admin client certificate (health endpoints of every component)."""
        ctx = ssl.create_default_context(cafile=str(self.ca.pair.cert))
        admin = self.pki_dir / "admin.crt"
        if admin.exists():
            ctx.load_cert_chain(str(admin), str(self.pki_dir / "admin.key"))
        try:
            with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode(errors="replace")


class Component:
    """One long-running process of the cluster.

    Subclasses give `name`, `binary` (a name `bins.ensure_binary` knows, or an absolute path), `prepare()` to
    pick ports and write config, `args()` and `healthy()`; `endpoint` is published in `Context.endpoints`
    once the component is healthy, for the components after it.
    """

    name: str = ""
    binary: str = ""
    # The name of the executable the running process shows first in /proc/<pid>/cmdline, which
    # `stop_detached` checks against pid reuse: `name` unless the component is started through a wrapper that
    # execs something else (nsenter, unshare) or several components run the same program (two kubelets).
    process_name: str = ""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.endpoint: str | None = None

    def prepare(self, ctx: Context) -> None:
        """Choose ports and write files before start."""

    def args(self, ctx: Context) -> list[str]:
        raise NotImplementedError

    def healthy(self, ctx: Context) -> bool:
        raise NotImplementedError

    def child_setup(self) -> None:
        """Runs in the child between fork and exec (e.g. to join a cgroup before the program starts); nothing by
        default."""

    def executable(self) -> Path:
        return Path(self.binary) if os.path.isabs(self.binary) else bins.ensure_binary(self.binary)

    def start(self, ctx: Context, *, die_with_parent: bool) -> None:
        self.prepare(ctx)
        self.log_path = ctx.log_dir / f"{self.name}.log"
        cmd = [str(self.executable()), *self.args(ctx)]
        (ctx.log_dir / f"{self.name}.cmdline").write_text(" \\\n  ".join(cmd) + "\n")
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "ETCDCTL_API")}

        def preexec() -> None:
            if die_with_parent:
                _die_with_parent()
            self.child_setup()

        with open(self.log_path, "ab") as log:
            # Own session = own process group, so stop() signals the component and anything it forks.
            self.process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ctx.directory,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
            )

    def wait_healthy(self, ctx: Context, deadline: float) -> None:
        assert self.process is not None
        while True:
            code = self.process.poll()
            if code is not None:
                raise ClusterError(
                    f"{self.name} exited with {code} during start; log {self.log_path}:\n{self._log_tail()}"
                )
            with contextlib.suppress(OSError, ssl.SSLError):
                if self.healthy(ctx):
                    if self.endpoint:
                        ctx.endpoints[self.name] = self.endpoint
                    return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{self.name} not healthy before the deadline; log {self.log_path}:\n{self._log_tail()}"
                )
            time.sleep(0.2)

    def _log_tail(self) -> str:
        return _tail(self.log_path) if self.log_path else "(no log)"

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is None:
            return
        _terminate_group(self.process.pid, timeout, self.process)
        self.process = None


def _terminate_group(pid: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the process group led by `pid`, SIGKILL it after `timeout`, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            break
        if process is None and not _pid_alive(pid):
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    if process is not None:
        process.wait()


class Etcd(Component):
    name = "etcd"
    binary = "etcd"

    def prepare(self, ctx: Context) -> None:
        self.client_port, self.peer_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"

    def args(self, ctx: Context) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            "--name=ftjob",
            f"--data-dir={ctx.directory / 'etcd'}",
            f"--listen-client-urls={self.endpoint}",
            f"--advertise-client-urls={self.endpoint}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=ftjob={peer}",
            # Test data is disposable: skipping fsync makes writes (and every API call) much faster.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def healthy(self, ctx: Context) -> bool:
        with urllib.request.urlopen(f"{self.endpoint}/health", timeout=2) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")


class KubeApiserver(Component):
    name = "kube-apiserver"
    binary = "kube-apiserver"

    def __init__(self, extra_args: Sequence[str] = ()) -> None:
        super().__init__()
        self.extra_args = list(extra_args)

    def prepare(self, ctx: Context) -> None:
        # A restart (LocalCluster.restart) keeps the port, so kubeconfigs and running clients stay valid.
        self.port = getattr(self, "port", None) or free_port()
        self.endpoint = f"https://{ctx.api_address}:{self.port}"

    def args(self, ctx: Context) -> list[str]:
        p = ctx.pki_dir
        return [
            f"--etcd-servers={ctx.endpoints['etcd']}",
            f"--bind-address={ctx.api_address}",
            f"--advertise-address={ctx.api_address}",
            # The `kubernetes` Service's endpoints may not point at loopback, and nothing in this tier
            # reaches the apiserver through that Service. A node tier with pods that do sets a routable
            # --advertise-address and --endpoint-reconciler-type=lease via extra_args.
            "--endpoint-reconciler-type=none",
            f"--secure-port={self.port}",
            f"--tls-cert-file={ctx.serving.cert}",
            f"--tls-private-key-file={ctx.serving.key}",
            f"--client-ca-file={ctx.ca.pair.cert}",
            f"--service-account-key-file={ctx.service_account.cert}",
            f"--service-account-signing-key-file={ctx.service_account.key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Node authorizer now so a later kubelet tier works unchanged; RBAC for everything else.
            "--authorization-mode=Node,RBAC",
            f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={ctx.ca.pair.cert}",
            "--allow-privileged=true",
            f"--cert-dir={p}",
            "--profiling=false",
            *self.extra_args,
        ]

    def healthy(self, ctx: Context) -> bool:
        status, _ = ctx.https_get(f"{self.endpoint}/readyz")
        return status == 200


class _ControlPlaneClient(Component):
    """A component that reaches the API server with its own kubeconfig and serves /healthz over TLS on
    loopback (controller-manager, scheduler): the same serving and delegated-auth flags for both."""

    user = ""

    def prepare(self, ctx: Context) -> None:
        # A restart (LocalCluster.restart) keeps the port, so kubeconfigs and running clients stay valid.
        self.port = getattr(self, "port", None) or free_port()
        self.endpoint = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = ctx.write_kubeconfig(self.name.removeprefix("kube-"), self.user)

    def serving_args(self, ctx: Context) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={ctx.serving.cert}",
            f"--tls-private-key-file={ctx.serving.key}",
            f"--client-ca-file={ctx.ca.pair.cert}",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def healthy(self, ctx: Context) -> bool:
        status, _ = ctx.https_get(f"{self.endpoint}/healthz")
        return status == 200


class KubeControllerManager(_ControlPlaneClient):
    name = "kube-controller-manager"
    binary = "kube-controller-manager"
    user = CONTROLLER_MANAGER_USER

    def __init__(self, extra_args: Sequence[str] = ()) -> None:
        super().__init__()
        self.extra_args = list(extra_args)

    def args(self, ctx: Context) -> list[str]:
        return [
            *self.serving_args(ctx),
            # Every controller, including garbage collector and namespace controller; each one runs under
            # its own service account, as in a real cluster, so RBAC problems show up here too.
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={ctx.service_account.key}",
            f"--root-ca-file={ctx.ca.pair.cert}",
            f"--cluster-signing-cert-file={ctx.ca.pair.cert}",
            f"--cluster-signing-key-file={ctx.ca.pair.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            *self.extra_args,
        ]


class KubeScheduler(_ControlPlaneClient):
    name = "kube-scheduler"
    binary = "kube-scheduler"
    user = SCHEDULER_USER

    def args(self, ctx: Context) -> list[str]:
        return self.serving_args(ctx)


def control_plane() -> list[Component]:
    """The default component list, in start order."""
    return [Etcd(), KubeApiserver(), KubeControllerManager(), KubeScheduler()]


class LocalCluster:
    """Start/stop a control plane in `directory` (a fresh temp dir when None).

    Usable as a context manager; on an exception inside the block the directory (with logs) is kept and its
    path printed.
    """

    def __init__(
        self,
        directory: Path | None = None,
        components: Sequence[Component] | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        api_address: str = "127.0.0.1",
    ) -> None:
        self.api_address = api_address
        self._owns_dir = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="ftjob-cluster-")) if directory is None else directory
        self.components = list(components) if components is not None else control_plane()
        self.ready_timeout = ready_timeout
        self.ctx: Context | None = None
        self.startup_seconds: float | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    @property
    def server(self) -> str:
        assert self.ctx is not None, "cluster not started"
        return self.ctx.endpoints["kube-apiserver"]

    def _make_context(self) -> Context:
        d = self.directory
        if (d / "state.json").exists():
            raise ClusterError(f"{d} already holds a cluster (state.json); stop it first")
        for sub in ("pki", "logs", "etcd"):
            if sub != "logs":
                shutil.rmtree(d / sub, ignore_errors=True)
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "etcd").chmod(0o700)  # etcd refuses a data dir others can read
        ca = pki.CertificateAuthority(d / "pki")
        serving = ca.issue(
            "serving",
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=tuple(dict.fromkeys(("127.0.0.1", SERVICE_FIRST_IP, self.api_address))),
            server=True,
        )
        ca.issue("admin", ADMIN_USER, organizations=(ADMIN_GROUP,), client=True)
        # The API server's side of its connections to kubelets (pod logs, exec): it presents this client cert
        # and trusts kubelets whose serving cert our CA signed. `kubelet-serving` is that cert for a kubelet on
        # loopback (a node tier's kubelet, or a test that serves a node's container logs).
        ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", organizations=(ADMIN_GROUP,), client=True)
        ca.issue("kubelet-serving", "kubelet", dns_names=("localhost",), ips=("127.0.0.1",), server=True)
        return Context(d, ca, serving, pki.service_account_keys(d / "pki"), api_address=self.api_address)

    def start(self, *, detach: bool = False) -> LocalCluster:
        """Start every component in order, each healthy before the next. Raises ClusterError (logs kept)."""
        start = time.monotonic()
        for c in self.components:  # fetch/build before the clock of any readiness deadline starts
            c.executable()
        self.ctx = ctx = self._make_context()
        try:
            for c in self.components:
                c.start(ctx, die_with_parent=not detach)
                c.wait_healthy(ctx, time.monotonic() + self.ready_timeout)
                if c.name == "kube-apiserver":
                    ctx.write_kubeconfig("admin", ADMIN_USER, (ADMIN_GROUP,))
        except BaseException:
            self.stop(keep_directory=True)
            raise
        self.startup_seconds = time.monotonic() - start
        if detach:
            self._write_state()
        return self

    def _write_state(self) -> None:
        assert self.ctx is not None
        state = {
            "kubeconfig": str(self.kubeconfig),
            "endpoints": self.ctx.endpoints,
            "components": [
                {"name": c.name, "process": c.process_name or c.name, "pid": c.process.pid, "log": str(c.log_path)}
                for c in self.components
                if c.process is not None
            ],
        }
        (self.directory / "state.json").write_text(json.dumps(state, indent=2) + "\n")

    def stop(self, *, keep_directory: bool = False) -> None:
        """Stop components in reverse order; remove the directory unless kept (or not ours)."""
        for c in reversed(self.components):
            c.stop()
        if keep_directory:
            print(f"[ftjob-cluster] cluster directory kept, logs in {self.directory / 'logs'}", flush=True)
        elif self._owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    @staticmethod
    def stop_detached(directory: Path, timeout: float = 15.0) -> list[str]:
        """Stop a cluster started with `start(detach=True)`; returns the names of components it stopped."""
        state_file = directory / "state.json"
        if not state_file.exists():
            return []
        state = json.loads(state_file.read_text())
        stopped = []
        for comp in reversed(state["components"]):
            pid = int(comp["pid"])
            # Guard against pid reuse: only signal a process that still runs the component's binary.
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if Path(cmdline).name == comp.get("process", comp["name"]) and _pid_alive(pid):
                _terminate_group(pid, timeout)
                stopped.append(comp["name"])
        state_file.unlink()
        return stopped

    def restart(self, name: str) -> float:
        """Stop one component (SIGTERM, as a rollout would) and start it again on the same port; returns the
        seconds until it was healthy again. The fault suite restarts kube-apiserver under a running operator."""
        assert self.ctx is not None, "cluster not started"
        (comp,) = [c for c in self.components if c.name == name]
        began = time.monotonic()
        comp.stop()
        comp.start(self.ctx, die_with_parent=True)
        comp.wait_healthy(self.ctx, time.monotonic() + self.ready_timeout)
        return time.monotonic() - began

    def logs(self) -> dict[str, Path]:
        return {c.name: c.log_path for c in self.components if c.log_path is not None}

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(keep_directory=exc_type is not None)


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 60.0,
    interval: float = 0.25,
    message: str = "condition",
) -> object:
    """Poll `predicate` until it returns something truthy (returned) or `timeout` passes (TimeoutError).

    Exceptions from the predicate count as "not yet" (an object not created yet raises 404), and the last
    one is chained to the TimeoutError so a failure says why it never became true.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    last_value: object = None
    while True:
        try:
            last_value = predicate()
            if last_value:
                return last_value
            last_exc = None
        except Exception as e:
            last_exc = e
        if time.monotonic() >= deadline:
            detail = f"; last error: {last_exc!r}" if last_exc else f"; last value: {last_value!r}"
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {message}{detail}") from last_exc
        time.sleep(interval)


@contextlib.contextmanager
def running_cluster(directory: Path | None = None) -> Iterator[LocalCluster]:
    """`with running_cluster() as c:` — shorthand for scripts."""
    with LocalCluster(directory) as cluster:
        yield cluster
