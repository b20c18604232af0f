"""A real node beside the LocalCluster control plane: containerd + runc + CNI, kubelet, kube-proxy, CoreDNS, and
kube-network-policies (NetworkPolicy enforcement) where the kernel can run it.

Layout (docs/cluster.md, measured facts in the project's node-tier notes):
- An interface `ftjob0` of our own holds NODE_IP, an address this machine did not have before. The API server
  binds and advertises it, the kubelet serves on it (InternalIP), CoreDNS answers on it; pods route to it
  through the bridge's gateway, so the `kubernetes` Service (kube-proxy DNAT to NODE_IP) is the in-cluster
  path to the API server.
- Pods live on the bridge `ftjobbr0` (POD_CIDR). Virtual ranges (Service CIDR, the rest of the pod range) get
  blackhole routes, and an iptables rule rejects pod traffic bound anywhere but pods: nothing a pod sends
  leaves this machine, even to a Service IP no rule rewrites.
- Host changes are recorded first (sysctls, what existed) in HOST_STATE and undone by `teardown_host()`.

Only one node can run per machine (fixed interface, bridge and /var/lib/kubelet paths): `node_lock()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ftjob_cluster import bins
from ftjob_cluster.localcluster import (
    SERVICE_CIDR,
    ClusterError,
    Component,
    Context,
    Etcd,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
    LocalCluster,
    _terminate_group,
    free_port,
)
from ftjob_cluster.netpolicy import NETPOL_QUEUE, NETPOL_TABLE, network_policy_unavailable_reason

NODE_NAME = "ftjob-node"
# Documentation-free private addresses that we add ourselves; nothing else on the machine uses them.
NODE_IP = "10.250.0.1"
NODE_IP_RANGE = "10.250.0.0/24"  # blackholed apart from NODE_IP itself (a local address wins)
POD_CIDR = "10.244.0.0/24"  # host-local IPAM hands these out on the bridge
POD_RANGE = "10.244.0.0/16"  # kube-proxy's clusterCIDR; blackholed beyond the bridge's /24
DUMMY_IF = "ftjob0"
BRIDGE = "ftjobbr0"
RUN_DIR = Path("/run/ftjob-node")  # containerd socket/state, runc root: short paths (unix socket limit)
CONTAINERD_SOCK = RUN_DIR / "containerd.sock"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # containerd's sandbox_image; built locally from pause.c
# Chains this module creates; every KUBE-*/CNI-* chain is also removed on teardown (kubelet, kube-proxy and
# the CNI firewall plugin create them; nothing else on these machines does).
EGRESS_CHAIN = "FTJOB-NODE-EGRESS"
CHAIN_PREFIXES = ("KUBE-", "CNI-", "FTJOB-")
# Kernel settings the kubelet (setupKernelTunables), the bridge plugin and kube-proxy may change.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/netfilter/nf_conntrack_max",
)
# Host paths that the kubelet/CNI create at fixed places; removed on teardown only if they did not exist.
FIXED_PATHS = ("/var/lib/kubelet", "/var/lib/cni", "/var/run/netns", "/etc/cni")


class NodeUnavailable(RuntimeError):
    """This machine cannot run a node; the message says why (make cluster-up then starts no node)."""


def _run(*cmd: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(cmd, check=check, capture_output=True, input=input)


def unavailable_reason() -> str | None:
    """Why a node cannot run here, or None."""
    if os.geteuid() != 0:
        return "the node needs root (network interfaces, mounts, cgroups)"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no memory cgroup hierarchy under /sys/fs/cgroup"
    for tool in ("containerd", "runc", "ctr", "iptables", "ip"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is missing (hack/apt-install.sh --tier test-e2e installs it)"
    if not Path("/usr/lib/cni/bridge").exists():
        return "CNI plugins are missing (Debian containernetworking-plugins)"
    if Path(f"/sys/class/net/{DUMMY_IF}").exists():
        return f"a node already runs on this machine (interface {DUMMY_IF} exists; make cluster-down stops it)"
    if shutil.which("go") is None and not all((bins.bin_dir() / n).exists() for n in ("kubelet", "coredns")):
        return "the Go toolchain is needed to build kubelet, kube-proxy and CoreDNS"
    return None


@contextlib.contextmanager
def node_lock() -> Iterator[None]:
    path = bins.cache_root() / "node.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NodeUnavailable(f"another node runs on this machine ({path} is locked)") from None
        yield


# --- host network ---------------------------------------------------------------------------------------


def _read_sysctl(key: str) -> str | None:
    with contextlib.suppress(OSError):
        return Path(f"/proc/sys/{key}").read_text().strip()
    return None


def prepare_host(state_file: Path) -> None:
    """Record the host's state, then create the node's interface, routes and egress rule."""
    if not state_file.exists():
        before = {
            "sysctls": {k: v for k in SYSCTLS if (v := _read_sysctl(k)) is not None},
            "existing_paths": [p for p in FIXED_PATHS if Path(p).exists()],
        }
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(before, indent=2) + "\n")
    # A bridge with no ports stands in for a dummy interface (these kernels have no dummy module); its
    # address is local for as long as it is up, whatever its carrier.
    _run("ip", "link", "add", DUMMY_IF, "type", "bridge", check=False)
    _run("ip", "addr", "replace", f"{NODE_IP}/32", "dev", DUMMY_IF)
    _run("ip", "link", "set", DUMMY_IF, "up")
    for cidr in (SERVICE_CIDR, POD_RANGE, NODE_IP_RANGE):
        _run("ip", "route", "replace", "blackhole", cidr)
    # Pod traffic may reach pods and this machine's own addresses (INPUT, not FORWARD); nothing else. The rule
    # sits in our chain first in FORWARD and in CNI-ADMIN, which the CNI firewall plugin evaluates before the
    # per-pod ACCEPTs it adds (its jump may land above ours).
    for chain in (EGRESS_CHAIN, "CNI-ADMIN"):
        _run("iptables", "-N", chain, check=False)
        _run("iptables", "-F", chain)
        _run("iptables", "-A", chain, "-s", POD_RANGE, "!", "-d", POD_RANGE, "-j", "REJECT")
    if _run("iptables", "-C", "FORWARD", "-j", EGRESS_CHAIN, check=False).returncode != 0:
        _run("iptables", "-I", "FORWARD", "1", "-j", EGRESS_CHAIN)


def _remove_chains() -> None:
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = _run(tool, "-t", table, "-S", check=False).stdout.decode().splitlines()
            ours = [r.split()[1] for r in rules if r.startswith("-N ") and r.split()[1].startswith(CHAIN_PREFIXES)]
            for rule in rules:  # jumps from built-in chains into ours (comments are quoted: shlex)
                parts = shlex.split(rule)
                jumps_to_ours = "-j" in parts and parts[parts.index("-j") + 1] in ours
                if parts[:1] == ["-A"] and parts[1] not in ours and jumps_to_ours:
                    _run(tool, "-t", table, "-D", *parts[1:], check=False)
            for chain in ours:
                _run(tool, "-t", table, "-F", chain, check=False)
            for chain in ours:
                _run(tool, "-t", table, "-X", chain, check=False)


def _unmount_under(*roots: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted(mounts, key=len, reverse=True):
        under = any(m == str(r) or m.startswith(f"{r}/") for r in roots)
        if under and _run("umount", m, check=False).returncode != 0:
            _run("umount", "-l", m, check=False)


def teardown_host(state_file: Path, node_dir: Path) -> None:
    """Undo what the node changed on the host (after its processes stopped)."""
    before = json.loads(state_file.read_text()) if state_file.exists() else {"sysctls": {}, "existing_paths": []}
    netns = Path("/var/run/netns")
    for ns in netns.glob("cni-*") if netns.is_dir() else []:
        _run("umount", str(ns), check=False)
        ns.unlink(missing_ok=True)
    _unmount_under(node_dir, RUN_DIR, Path("/var/lib/kubelet"))
    _run("ip", "link", "del", BRIDGE, check=False)
    _run("ip", "link", "del", DUMMY_IF, check=False)
    for cidr in (SERVICE_CIDR, POD_RANGE, NODE_IP_RANGE):
        _run("ip", "route", "del", "blackhole", cidr, check=False)
    _remove_chains()
    if shutil.which("nft") is not None:
        _run("nft", "delete", "table", *NETPOL_TABLE, check=False)
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "kubepods"
        if top.is_dir():
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
    for key, value in before["sysctls"].items():
        if key == "net/ipv4/ip_forward" and _run("pgrep", "-x", "dockerd", check=False).returncode == 0:
            continue  # Docker needs forwarding for as long as it runs
        with contextlib.suppress(OSError):
            Path(f"/proc/sys/{key}").write_text(value)
    for p in FIXED_PATHS:
        if p not in before["existing_paths"]:
            shutil.rmtree(p, ignore_errors=True)
    # Shim sockets: containerd 1.6 hard-codes /run/containerd/s; remove the directory only if nobody else uses it.
    for shim_dir in ("/run/containerd/s", "/run/containerd"):
        with contextlib.suppress(OSError):
            os.rmdir(shim_dir)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    state_file.unlink(missing_ok=True)


# --- images ---------------------------------------------------------------------------------------------


def ctr(*args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return _run("ctr", "-a", str(CONTAINERD_SOCK), "-n", "k8s.io", *args, input=input, check=check)


def _docker_archive(files: dict[str, tuple[bytes, int]], ref: str, config: dict[str, object]) -> bytes:
    """A single-layer `docker save` tarball (what `ctr images import` reads) from {path: (data, mode)}."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, (data, mode) in sorted(files.items()):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), mode
            t.addfile(ti, io.BytesIO(data))
    layer = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    cfg = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    cfg_bytes = json.dumps(cfg, sort_keys=True).encode()
    cfg_name = hashlib.sha256(cfg_bytes).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [ref], "Layers": [f"{diff_id[7:]}/layer.tar"]}])
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for name, data in (
            (f"{diff_id[7:]}/layer.tar", layer),
            (cfg_name, cfg_bytes),
            ("manifest.json", manifest.encode()),
        ):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return out.getvalue()


def build_pause_image(work: Path) -> bytes:
    """The sandbox image from the pinned k8s.io/kubernetes module's build/pause/linux/pause.c (gcc -static)."""
    gomodcache = _run("go", "env", "GOMODCACHE").stdout.decode().strip()
    src = Path(gomodcache) / f"k8s.io/kubernetes@{bins.K8S_VERSION}/build/pause/linux/pause.c"
    if not src.exists():
        _run("go", "mod", "download", f"k8s.io/kubernetes@{bins.K8S_VERSION}")
    work.mkdir(parents=True, exist_ok=True)
    out = work / "pause"
    _run("gcc", "-Os", "-static", "-DVERSION=v3.10-ftjob", "-o", str(out), str(src))
    _run("strip", str(out), check=False)
    return _docker_archive(
        {"pause": (out.read_bytes(), 0o755)}, PAUSE_IMAGE, {"Entrypoint": ["/pause"], "User": "65535:65535"}
    )


def _containerd_config_digest(ref: str) -> str | None:
    """Config digest (= Docker's image ID) of `ref` in the node's containerd, or None if absent."""
    full = ref if "/" in ref.split("/")[0] and "." in ref.split("/")[0] else f"docker.io/{ref}"
    listing = ctr("images", "ls").stdout.decode().splitlines()[1:]
    for line in listing:
        cols = line.split()
        if cols and cols[0] == full:
            manifest = json.loads(ctr("content", "get", cols[2]).stdout)
            return str(manifest["config"]["digest"])
    return None


def _image_names_sharing(full: str) -> list[str]:
    """`full` and every other name of the same image in the node's store. containerd's CRI plugin records each
    image it has seen under its ID too (`sha256:<config digest>`) and under its repo digest; removing the tag
    alone left those, so the old build's layers were never collected (the store grew until the disk filled:
    docs/cluster.md)."""
    rows = [line.split() for line in ctr("images", "ls").stdout.decode().splitlines()[1:]]
    target = next((cols[2] for cols in rows if cols and cols[0] == full), None)
    return [full] + [cols[0] for cols in rows if cols and cols[0] != full and target and cols[2] == target]


def sync_image(ref: str) -> bool:
    """Import Docker's `ref` into the node unless the node already has the same image ID. True if imported."""
    docker_id = _run("docker", "image", "inspect", "-f", "{{.Id}}", ref, check=False)
    if docker_id.returncode != 0:
        raise ClusterError(f"image {ref} is not in Docker; build it first (make image-cpu / make image-operator)")
    held = _containerd_config_digest(ref)
    if held == docker_id.stdout.decode().strip():
        return False
    if held is not None:
        # The node's store lives in the cache across sessions: drop the previous build first so that its
        # layers are garbage-collected (--sync) instead of piling up with every rebuild (several GB each).
        full = ref if "/" in ref.split("/")[0] and "." in ref.split("/")[0] else f"docker.io/{ref}"
        names = _image_names_sharing(full)
        ctr("images", "rm", "--sync", *names, check=False)
    save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
    assert save.stdout is not None
    imp = subprocess.run(
        ["ctr", "-a", str(CONTAINERD_SOCK), "-n", "k8s.io", "images", "import", "-"],
        stdin=save.stdout,
        capture_output=True,
    )
    save.stdout.close()
    if save.wait() != 0 or imp.returncode != 0:
        raise ClusterError(f"importing {ref} into the node failed: {imp.stderr.decode()}")
    return True


# --- components -----------------------------------------------------------------------------------------


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return int(resp.status) == 200


class Containerd(Component):
    name = "containerd"
    binary = "/usr/bin/containerd"

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def prepare(self, ctx: Context) -> None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        d = ctx.directory / "node"
        (d / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "ftjob",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # nothing leaves the machine, so nothing to masquerade
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(d / "cni" / "ipam"),
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                # Accepts pod traffic in FORWARD even where Docker set the policy to DROP.
                {"type": "firewall", "backend": "iptables"},
            ],
        }
        (d / "cni" / "net.d" / "10-ftjob.conflist").write_text(json.dumps(conflist, indent=2))
        self.config = d / "containerd.toml"
        self.config.write_text(f"""\
# containerd 1.6 (Debian) for the node; its own socket and dirs, so it never meets Docker's containerd.
version = 2
root = "{self.root}"
state = "{RUN_DIR / "state"}"
oom_score = 0
[grpc]
  address = "{CONTAINERD_SOCK}"
[ttrpc]
  address = "{CONTAINERD_SOCK}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{shutil.which("runc") or "/usr/sbin/runc"}"
        Root = "{RUN_DIR / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d / "cni" / "net.d"}"
    max_conf_num = 1
""")

    def args(self, ctx: Context) -> list[str]:
        return [f"--config={self.config}"]

    def healthy(self, ctx: Context) -> bool:
        return ctr("version", check=False).returncode == 0


class _NodeAgent(Component):
    """kubelet / kube-proxy: a client certificate, a kubeconfig and healthz on loopback."""

    healthz_port = 0

    def healthy(self, ctx: Context) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.healthz_port}/healthz")


class Kubelet(_NodeAgent):
    name = "kubelet"
    binary = "kubelet"

    def prepare(self, ctx: Context) -> None:
        d = ctx.directory / "node"
        (d / "pod-logs").mkdir(parents=True, exist_ok=True)
        self.healthz_port, self.port = free_port(), free_port()
        # Node authorizer + NodeRestriction identify the kubelet by this name and group.
        self.kubeconfig = ctx.write_kubeconfig("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",))
        serving = ctx.ca.issue("node-serving", NODE_NAME, dns_names=(NODE_NAME,), ips=(NODE_IP,), server=True)
        resolv = d / "resolv.conf"  # pods' search path and nameserver: ours only, never the host's resolver
        resolv.write_text(f"nameserver {NODE_IP}\n")
        self.config = d / "kubelet.yaml"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # these machines are cgroup v1; 1.37 still runs there when told to
            "cgroupDriver": "cgroupfs",  # no systemd; containerd 1.6 cannot report its driver
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
            "address": NODE_IP,
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ctx.ca.pair.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDomain": "cluster.local",
            "clusterDNS": [NODE_IP],
            "resolvConf": str(resolv),
            "failSwapOn": False,
            "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE to lower it to -999
            "podLogsDir": str(d / "pod-logs"),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # A shared development disk: an image import (docker save -> ctr import, about twice the image's
            # size for a moment) can dip below a percentage threshold, and the DiskPressure taint then kept
            # every pod unschedulable for the default 5-minute transition period (the e2e operator's
            # helm --wait timed out). Absolute floors, and pressure lifts 30 s after it ends.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "512Mi", "imagefs.available": "512Mi"},
            "evictionPressureTransitionPeriod": "30s",
            "maxPods": 50,
        }
        self.config.write_text(json.dumps(config, indent=2))

    def args(self, ctx: Context) -> list[str]:
        return [
            f"--config={self.config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={ctx.directory / 'node' / 'kubelet'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            "--v=1",
        ]


class KubeProxy(_NodeAgent):
    name = "kube-proxy"
    binary = "kube-proxy"

    def prepare(self, ctx: Context) -> None:
        self.healthz_port, metrics = free_port(), free_port()
        kubeconfig = ctx.write_kubeconfig("kube-proxy", "system:kube-proxy")  # bound to system:node-proxier
        self.config = ctx.directory / "node" / "kube-proxy.yaml"
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "clusterCIDR": POD_RANGE,
            "healthzBindAddress": f"127.0.0.1:{self.healthz_port}",
            "metricsBindAddress": f"127.0.0.1:{metrics}",
            "nodePortAddresses": [f"{NODE_IP}/32"],
            "iptables": {"localhostNodePorts": False},
            "conntrack": {"maxPerCore": 0},  # leave the host's conntrack table size alone
        }
        self.config.write_text(json.dumps(config, indent=2))

    def args(self, ctx: Context) -> list[str]:
        return [f"--config={self.config}"]


class CoreDNS(Component):
    name = "coredns"
    binary = "coredns"

    def prepare(self, ctx: Context) -> None:
        self.ready_port, health = free_port(), free_port()
        kubeconfig = ctx.write_kubeconfig("coredns", "ftjob-coredns", ("system:masters",))
        self.corefile = ctx.directory / "node" / "Corefile"
        # No `forward`: names outside the cluster get no answer from here, so no query leaves the machine.
        self.corefile.write_text(f"""\
.:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{health}
    ready 127.0.0.1:{self.ready_port}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
    cache 5
}}
""")

    def args(self, ctx: Context) -> list[str]:
        return ["-conf", str(self.corefile)]

    def healthy(self, ctx: Context) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.ready_port}/ready")


# What kube-network-policies v0.8.0 reads and writes (pods, namespaces and policies through informers; Events
# through its recorder); nodes and the AdminNetworkPolicy API only with its ANP flags, which stay off here.
NETPOL_SA = ("kube-system", "kube-network-policies")
_NETPOL_RULES = [
    {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
]


def _netpol_rbac() -> dict[str, object]:
    ns, name = NETPOL_SA
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": _NETPOL_RULES,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            },
        ],
    }


class NetworkPolicyAgent(Component):
    """kube-network-policies on the host, in the host's network namespace, for this one node.

    v0.8.0 has no kubeconfig flag: it only uses in-cluster config, which reads its ServiceAccount token from
    the fixed path /var/run/secrets/kubernetes.io/serviceaccount. So it runs in a private mount namespace
    (`unshare --mount`) where a tmpfs covers /run (the host's /var/run) and that path is bound to a directory of
    the cluster holding a TokenRequest token of its own ServiceAccount (RBAC above) and the cluster CA; the
    host's /run is not touched. It needs nothing else from /run: nftables and NFQUEUE are netlink, and its NRI
    client (containerd 1.6 has no NRI) finds no socket and logs that it uses the API server's pod IPs only."""

    name = "kube-network-policies"
    binary = "/usr/bin/unshare"
    token_hours = 168  # a cluster-up left running for a week keeps working; e2e sessions take minutes

    def prepare(self, ctx: Context) -> None:
        self.metrics_port = free_port()
        sa_dir = ctx.directory / "node" / "netpol-serviceaccount"
        sa_dir.mkdir(parents=True, exist_ok=True)
        setup = ctx.write_kubeconfig("netpol-setup", "ftjob-netpol-setup", ("system:masters",))
        kubectl = [str(bins.ensure_binary("kubectl")), f"--kubeconfig={setup}"]
        subprocess.run(
            [*kubectl, "apply", "-f", "-"], input=json.dumps(_netpol_rbac()).encode(), check=True, capture_output=True
        )
        ns, name = NETPOL_SA
        token = (
            subprocess.run(
                [*kubectl, "-n", ns, "create", "token", name, f"--duration={self.token_hours}h"],
                check=True,
                capture_output=True,
            )
            .stdout.decode()
            .strip()
        )
        (sa_dir / "token").write_text(token + "\n")
        (sa_dir / "token").chmod(0o600)
        shutil.copyfile(ctx.ca.pair.cert, sa_dir / "ca.crt")
        (sa_dir / "namespace").write_text(ns)
        api_port = ctx.endpoints["kube-apiserver"].rsplit(":", 1)[1]
        secrets = "/run/secrets/kubernetes.io/serviceaccount"
        self.setup_script = (
            f"mount -t tmpfs -o mode=0755 ftjob-netpol /run && mkdir -p {secrets} && "
            f"mount --bind {shlex.quote(str(sa_dir))} {secrets} && "
            f"export KUBERNETES_SERVICE_HOST={ctx.api_address} KUBERNETES_SERVICE_PORT={api_port} && "
            'exec "$0" "$@"'
        )

    def args(self, ctx: Context) -> list[str]:
        # unshare execs sh, which execs the agent: one pid, whose command line names the agent (stop_detached).
        return [
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            self.setup_script,
            str(bins.ensure_binary("kube-network-policies")),
            f"--hostname-override={NODE_NAME}",  # only pods bound to this node are policed
            f"--nfqueue-id={NETPOL_QUEUE}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            "--v=2",  # one line per verdict: the log says which connection a policy dropped
        ]

    def healthy(self, ctx: Context) -> bool:
        # Its table appears once its informers synced and it wrote its rules; before that nothing is enforced.
        table = _run("nft", "list", "table", *NETPOL_TABLE, check=False).returncode == 0
        return table and _http_ok(f"http://127.0.0.1:{self.metrics_port}/metrics")


def node_components(containerd_root: Path) -> list[Component]:
    """The control plane on NODE_IP, then the node, in start order; the NetworkPolicy agent only where
    `network_policy_unavailable_reason()` is None (the node runs without enforcement otherwise)."""
    apiserver = KubeApiserver(
        extra_args=[
            # The `kubernetes` Service's endpoint is NODE_IP (lease reconciler), which pods can route to.
            "--endpoint-reconciler-type=lease",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    )
    agent: list[Component] = [] if network_policy_unavailable_reason() else [NetworkPolicyAgent()]
    return [
        Etcd(),
        apiserver,
        KubeControllerManager(),
        KubeScheduler(),
        Containerd(containerd_root),
        Kubelet(),
        KubeProxy(),
        CoreDNS(),
        *agent,
    ]


def containerd_root() -> Path:
    """Kept across cluster-up/down so imported images (GBs) are imported once per image ID."""
    return bins.cache_root() / "node" / "containerd"


def node_cluster(directory: Path | None = None) -> LocalCluster:
    return LocalCluster(directory, components=node_components(containerd_root()), api_address=NODE_IP)


def wait_node_ready(kubectl: Path, kubeconfig: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    jsonpath = '{.status.conditions[?(@.type=="Ready")].status}'
    while time.monotonic() < deadline:
        out = subprocess.run(
            [str(kubectl), f"--kubeconfig={kubeconfig}", "get", "node", NODE_NAME, "-o", f"jsonpath={jsonpath}"],
            capture_output=True,
            text=True,
        )
        if out.stdout.strip() == "True":
            return
        time.sleep(0.25)
    raise ClusterError(f"node {NODE_NAME} not Ready after {timeout:.0f} s")


def start(cluster: LocalCluster, images: list[str], *, detach: bool) -> dict[str, float]:
    """prepare_host, start the cluster with its node, import the pause and given images. Returns timings."""
    assert cluster.directory is not None
    times: dict[str, float] = {}
    state_file = cluster.directory / "node" / "host-state.json"
    prepare_host(state_file)
    t = time.monotonic()
    cluster.start(detach=detach)
    times["cluster+node start"] = time.monotonic() - t
    t = time.monotonic()
    ctr("images", "import", "-", input=build_pause_image(cluster.directory / "node" / "pause"))
    imported = [ref for ref in images if sync_image(ref)]
    times["image import"] = time.monotonic() - t
    times["images imported"] = float(len(imported))
    t = time.monotonic()
    wait_node_ready(bins.ensure_binary("kubectl"), cluster.kubeconfig)
    times["node Ready"] = time.monotonic() - t
    return times


def stop_containers() -> None:
    """Kill and delete every task and container in the node's containerd (pods the kubelet left behind)."""
    for task in ctr("tasks", "ls", "-q", check=False).stdout.decode().split():
        ctr("tasks", "kill", "-s", "KILL", task, check=False)
    deadline = time.monotonic() + 20
    for task in ctr("tasks", "ls", "-q", check=False).stdout.decode().split():
        while ctr("tasks", "delete", task, check=False).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    for container in ctr("containers", "ls", "-q", check=False).stdout.decode().split():
        ctr("containers", "delete", container, check=False)


def _stop_detached_one(directory: Path, name: str) -> None:
    state_file = directory / "state.json"
    if not state_file.exists():
        return
    for comp in json.loads(state_file.read_text())["components"]:
        pid = int(comp["pid"])
        with contextlib.suppress(OSError):
            exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            if comp["name"] == name and Path(exe).name == name:
                _terminate_group(pid, 15.0)


def stop(cluster: LocalCluster | None, directory: Path) -> None:
    """Stop the kubelet (so it restarts nothing), the node's containers, every process; undo host changes."""
    if cluster is not None:
        for c in cluster.components:
            if c.name == "kubelet":
                c.stop()
    else:
        _stop_detached_one(directory, "kubelet")
    if CONTAINERD_SOCK.exists():
        stop_containers()
    if cluster is not None:
        cluster.stop(keep_directory=True)
    else:
        LocalCluster.stop_detached(directory)
    teardown_host(directory / "node" / "host-state.json", directory / "node")


def docker_has(ref: str, *, warn: bool = False) -> bool:
    found = shutil.which("docker") is not None and _run("docker", "image", "inspect", ref, check=False).returncode == 0
    if not found and warn:
        print(f"[ftjob-cluster] {ref} is not built (not in Docker): not imported into the node")
    return found


def leftovers(node_dir: Path) -> list[str]:
    """Host changes of a node still present (after `stop`, this is empty: the e2e session asserts it)."""
    found = [f"interface {i}" for i in (DUMMY_IF, BRIDGE) if Path(f"/sys/class/net/{i}").exists()]
    routes = _run("ip", "route", "show", "type", "blackhole", check=False).stdout.decode()
    found += [f"route blackhole {c}" for c in (SERVICE_CIDR, POD_RANGE, NODE_IP_RANGE) if c in routes]
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = _run(tool, "-t", table, "-S", check=False).stdout.decode().splitlines()
            found += [
                f"{tool} -t {table} {r}" for r in rules if r.startswith("-N ") and r[3:].startswith(CHAIN_PREFIXES)
            ]
    roots = (str(node_dir), str(RUN_DIR), "/var/lib/kubelet", "/var/run/netns/cni-")
    found += [
        f"mount {m}"
        for m in (ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines())
        if m.startswith(roots)
    ]
    found += [f"cgroup {h}/kubepods" for h in Path("/sys/fs/cgroup").iterdir() if (h / "kubepods").is_dir()]
    found += [f"path {p}" for p in (str(RUN_DIR),) if Path(p).exists()]
    if shutil.which("nft") is not None and _run("nft", "list", "table", *NETPOL_TABLE, check=False).returncode == 0:
        found.append(f"nftables table {' '.join(NETPOL_TABLE)}")
    return found
