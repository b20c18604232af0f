"""Real nodes beside the LocalCluster control plane: containerd + runc + CNI, kubelet and kube-proxy per node;
CoreDNS, and kube-network-policies (NetworkPolicy enforcement) where the kernel can run it, on the host.

Two nodes share this machine (docs/cluster.md "Two nodes"); each is a `NodeSpec`: name, address, pod subnet,
bridge, containerd (socket, state and root), kubelet root dir, pod-log dir, cgroup root and zone.
- Node A (`ftjob-node`) runs in the host's network namespace. An interface `ftjob0` of our own holds NODE_IP, an
  address this machine did not have before. The API server binds and advertises it, node A's kubelet serves on
  it (InternalIP), CoreDNS answers on it; pods route to it through the bridge's gateway, so the `kubernetes`
  Service (kube-proxy DNAT to NODE_IP) is the in-cluster path to the API server.
- Node B (`ftjob-node-b`) runs in a network namespace of its own, joined to the host by a veth pair, and in a
  mount namespace of its own (private propagation) in which the host paths the kubelet and containerd hard-code
  (the device-plugin socket directory, /var/log/containers, /var/lib/cni, /run/netns, /run/containerd) are
  private tmpfs: the two kubelets never touch each other's files there. Both namespaces are kept by bind mounts
  (`unshare --net=FILE`, `--mount=FILE`) and entered with `nsenter`; its processes run in its own cgroup tree
  (kubelet `cgroupRoot`), without which the two kubelets kill each other's pods as orphans. The host routes
  each node's pod subnet to it and forwards pod-to-pod traffic between the nodes, nothing else.
- Virtual ranges (Service CIDR, the pod range, the node addresses) get blackhole routes, and iptables rules
  reject pod and node-B traffic bound anywhere but pods and this machine: nothing a pod or node sends leaves
  this machine, even to a Service IP no rule rewrites or to a node that is gone.
- Host changes are recorded first (sysctls, what existed) in HOST_STATE and undone by `teardown_host()`.

Only one cluster with nodes can run per machine (fixed interfaces, bridges and /var/lib/kubelet): `node_lock()`.
`kill_node`, `restart_node` and `drain_node` inject node faults the way they happen to instances.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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
from ftjob_cluster.registry import containerd_cri_registry_config, containerd_hosts_toml

# Documentation-free private addresses that we add ourselves; nothing else on the machine uses them.
NODE_IP = "10.250.0.1"  # node A and the API server (on ftjob0)
NODE_NET = "10.250.0.0/16"  # node addresses: blackholed apart from those that exist (a local or connected route wins)
POD_RANGE = "10.244.0.0/16"  # kube-proxy's clusterCIDR; blackholed beyond the nodes' subnets
DUMMY_IF = "ftjob0"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # containerd's sandbox_image; built locally from pause.c
NSENTER = "/usr/bin/nsenter"
UNSHARE = "/usr/bin/unshare"
# Where Docker looks for a registry's CA ("<host:port>/ca.crt"), read at each push: the e2e session's registry on
# NODE_IP is trusted there for the session, and the folder removed after (leftovers reports one left).
DOCKER_CERTS_D = Path("/etc/docker/certs.d")
# Chains this module creates; every KUBE-*/CNI-* chain is also removed on teardown (kubelet, kube-proxy and
# the CNI firewall plugin create them; nothing else on these machines does).
EGRESS_CHAIN = "FTJOB-NODE-EGRESS"
NODES_CHAIN = "FTJOB-NODES"  # pod traffic between the nodes, and nothing else from a node in a namespace
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
FIXED_PATHS = ("/var/lib/kubelet", "/var/lib/cni", "/var/run/netns", "/etc/cni", "/var/log/containers")
# Paths a kubelet or containerd uses whatever its configuration says; node B gets a private tmpfs on each in its
# mount namespace (the device-plugin socket directory is the measured conflict: node B's kubelet replaced node
# A's socket; the others only leave files of a dead node B on the host).
NODE_PRIVATE_PATHS = (
    "/var/lib/kubelet/device-plugins",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/netns",
    "/run/containerd",
)
# The child cgroup of a node's cgroup root that its containerd, kubelet and kube-proxy run in (the pods go to
# <root>/kubepods): every process of the node, shims included, is then under its root.
NODE_SYSTEM_CGROUP = "system"


@dataclass(frozen=True)
class NodeNetns:
    """How a node in a network namespace of its own is joined to the host: a veth pair on a /`prefix` link."""

    host_if: str  # the host's end
    node_if: str  # the node's end, inside the namespace
    host_ip: str  # the host's end: the node's default gateway (API server, CoreDNS, the other nodes' pods)
    prefix: int = 24


@dataclass(frozen=True)
class NodeSpec:
    """Everything that must differ between two nodes on one machine."""

    name: str  # Node name (kubelet --hostname-override, kube-proxy hostnameOverride)
    suffix: str  # of its component names, its directory in the cluster's and its containerd cache dir
    ip: str  # InternalIP: the kubelet serves there; the API server reaches it there
    pod_cidr: str  # its bridge's subnet (host-local IPAM)
    bridge: str
    cni_network: str  # CNI network name: libcni keys its result cache by it
    run_dir: Path  # containerd socket/state, runc root: short paths (unix socket limit)
    zone: str  # topology.kubernetes.io/zone
    cgroup_root: str | None = None  # the kubelet's cgroupRoot; None: its default, /
    netns: NodeNetns | None = None  # None: the host's network and mount namespaces

    @property
    def containerd_sock(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def netns_file(self) -> Path:
        return self.run_dir / "ns" / "net"

    @property
    def mntns_file(self) -> Path:
        return self.run_dir / "ns" / "mnt"

    def directory(self, cluster_dir: Path) -> Path:
        """Its configs, kubelet root dir, pod logs and CNI state, under the cluster's directory."""
        return cluster_dir / f"node{self.suffix}"

    def containerd_root(self) -> Path:
        """Kept across cluster-up/down so imported images (GBs) are imported once per image ID and node."""
        return bins.cache_root() / f"node{self.suffix}" / "containerd"


NODE_A = NodeSpec(
    name="ftjob-node",
    suffix="",
    ip=NODE_IP,
    pod_cidr="10.244.0.0/24",
    bridge="ftjobbr0",
    cni_network="ftjob",
    run_dir=Path("/run/ftjob-node"),
    zone="ftjob-local-a",
)
NODE_B = NodeSpec(
    name="ftjob-node-b",
    suffix="-b",
    ip="10.250.1.2",
    pod_cidr="10.244.1.0/24",
    bridge="ftjobbrb",
    cni_network="ftjob-b",
    run_dir=Path("/run/ftjob-node-b"),
    zone="ftjob-local-b",
    cgroup_root="/ftjob-node-b",
    netns=NodeNetns(host_if="ftjobvb0", node_if="ftjobvb1", host_ip="10.250.1.1"),
)
NODES = (NODE_A, NODE_B)  # in start order; `make cluster-up NODES=1` and `nodes=1` take the first
# Node A's values under their former names (the e2e tests and the NetworkPolicy agent read them).
NODE_NAME = NODE_A.name
POD_CIDR = NODE_A.pod_cidr
BRIDGE = NODE_A.bridge
RUN_DIR = NODE_A.run_dir
CONTAINERD_SOCK = NODE_A.containerd_sock


def node_spec(name: str) -> NodeSpec:
    for spec in NODES:
        if spec.name == name:
            return spec
    raise KeyError(f"no node {name!r}; nodes: {', '.join(s.name for s in NODES)}")


class NodeUnavailable(RuntimeError):
    """This machine cannot run a node; the message says why (make cluster-up then starts no node)."""


def _run(*cmd: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(cmd, check=False, capture_output=True, input=input)
    if check and proc.returncode != 0:
        raise ClusterError(f"{shlex.join(cmd)} exited with {proc.returncode}: {proc.stderr.decode().strip()}")
    return proc


def machine_reason() -> str | None:
    """Why no node can ever run on this machine (what packages cannot fix), or None."""
    if os.geteuid() != 0:
        return "the node needs root (network interfaces, mounts, cgroups)"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no memory cgroup hierarchy under /sys/fs/cgroup"
    return None


def unavailable_reason() -> str | None:
    """Why a node cannot run here, or None: what this machine lacks, else busy_reason()."""
    if (reason := machine_reason()) is not None:
        return reason
    for tool in ("containerd", "runc", "ctr", "iptables", "ip"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is missing (hack/apt-install.sh --tier test-e2e installs it)"
    for tool in (NSENTER, UNSHARE):
        if not Path(tool).exists():
            return f"{tool} is missing (Debian util-linux)"
    if not Path("/usr/lib/cni/bridge").exists():
        return "CNI plugins are missing (Debian containernetworking-plugins)"
    if shutil.which("go") is None and not all((bins.bin_dir() / n).exists() for n in ("kubelet", "coredns")):
        return "the Go toolchain is needed to build kubelet, kube-proxy and CoreDNS"
    return busy_reason()


def busy_reason() -> str | None:
    """Why a node cannot start now although this machine can run one (another node runs), or None."""
    if Path(f"/sys/class/net/{DUMMY_IF}").exists():
        return f"a node already runs on this machine (interface {DUMMY_IF} exists; make cluster-down stops it)"
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


def prepare_host(state_file: Path, nodes: Sequence[NodeSpec] = NODES) -> None:
    """Record the host's state, then create node A's interface, the routes and egress rules, and the host side
    of every node in a namespace of its own (`prepare_node_host`)."""
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
    for cidr in (SERVICE_CIDR, POD_RANGE, NODE_NET):
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
    namespaced = [n for n in nodes if n.netns is not None]
    if namespaced:
        # Between the nodes' pods the host routes (Docker's FORWARD policy is DROP, and the CNI firewall plugin
        # accepts only established traffic to node A's pods); a node in a namespace reaches the API server and
        # CoreDNS on NODE_IP as this machine's INPUT, and nothing else it sends is forwarded.
        _run("iptables", "-N", NODES_CHAIN, check=False)
        _run("iptables", "-F", NODES_CHAIN)
        _run("iptables", "-A", NODES_CHAIN, "-s", POD_RANGE, "-d", POD_RANGE, "-j", "ACCEPT")
        for spec in namespaced:
            assert spec.netns is not None
            _run("iptables", "-A", NODES_CHAIN, "-i", spec.netns.host_if, "-j", "REJECT")
        if _run("iptables", "-C", "FORWARD", "-j", NODES_CHAIN, check=False).returncode != 0:
            _run("iptables", "-I", "FORWARD", "1", "-j", NODES_CHAIN)
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")  # recorded above, restored by teardown_host
    for spec in namespaced:
        prepare_node_host(spec, nodes)


# --- cgroups of a node in a namespace of its own --------------------------------------------------------


def _cgroup_hierarchies() -> list[Path]:
    """The v1 hierarchies under /sys/fs/cgroup (cpu, memory, ..., name=systemd), or the v2 root on a unified host."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root]
    return [h for h in sorted(root.iterdir()) if h.is_dir() and not h.is_symlink() and h.name != "unified"]


def _make_cgroup(hierarchy: Path, path: str) -> None:
    d = hierarchy / path.strip("/")
    d.mkdir(parents=True, exist_ok=True)
    if (d / "cpuset.cpus").exists():  # v1 cpuset: a task may join only once cpus and mems are set
        for key in ("cpuset.cpus", "cpuset.mems"):
            if not (d / key).read_text().strip():
                (d / key).write_text((d.parent / key).read_text())


def _prepare_cgroups(spec: NodeSpec) -> None:
    """The node's cgroup root in every hierarchy (the kubelet refuses a cgroupRoot missing from one), and its
    system child for its own processes."""
    assert spec.cgroup_root is not None
    for h in _cgroup_hierarchies():
        _make_cgroup(h, spec.cgroup_root)
        _make_cgroup(h, f"{spec.cgroup_root}/{NODE_SYSTEM_CGROUP}")


def join_node_cgroup(spec: NodeSpec) -> None:
    """Move the calling process into the node's system cgroup in every hierarchy (run between fork and exec)."""
    assert spec.cgroup_root is not None
    pid = str(os.getpid())
    for h in _cgroup_hierarchies():
        procs = h / spec.cgroup_root.strip("/") / NODE_SYSTEM_CGROUP / "cgroup.procs"
        if procs.exists():
            procs.write_text(pid)


def _alive(pid: int) -> bool:
    """Not gone and not a zombie (a killed child of ours stays one until we reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _cgroup_pids(root: str) -> set[int]:
    """The live processes in cgroup `root` and below, in any hierarchy."""
    pids: set[int] = set()
    for h in _cgroup_hierarchies():
        top = h / root.strip("/")
        if top.is_dir():
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
    return {p for p in pids if _alive(p)}


def _kill_cgroup_tree(root: str, timeout: float = 30.0) -> int:
    """SIGKILL every process in cgroup `root` and below: frozen first (v1 freezer) so that none of them forks or
    restarts another while the others die, as when a machine loses power. Returns how many were killed."""
    freezer = Path("/sys/fs/cgroup/freezer") / root.strip("/") / "freezer.state"
    if freezer.exists():
        freezer.write_text("FROZEN")
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while pids := _cgroup_pids(root):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed |= pids
            if freezer.exists():  # frozen tasks take their SIGKILL once thawed
                freezer.write_text("THAWED")
            if time.monotonic() > deadline:
                raise ClusterError(f"processes of cgroup {root} still alive after SIGKILL: {sorted(pids)}")
            time.sleep(0.05)
    finally:
        if freezer.exists():
            with contextlib.suppress(OSError):
                freezer.write_text("THAWED")
    return len(killed)


def _remove_cgroup_tree(root: str) -> None:
    """rmdir `root` and everything below it, deepest first, in every hierarchy (v2's `unified` included: the
    kubelet creates its root there too)."""
    bases = [*_cgroup_hierarchies(), Path("/sys/fs/cgroup/unified")]
    for h in bases:
        top = h / root.strip("/")
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


# --- namespaces of a node -------------------------------------------------------------------------------


def _is_mount_point(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/self/mounts").read_text().splitlines())


def _in_netns(spec: NodeSpec, *cmd: str) -> subprocess.CompletedProcess[bytes]:
    return _run(NSENTER, f"--net={spec.netns_file}", "--", *cmd)


def prepare_node_host(spec: NodeSpec, nodes: Sequence[NodeSpec] = NODES) -> None:
    """Create what a node in a namespace of its own runs in: its cgroup tree, its mount namespace (with a
    private tmpfs on each NODE_PRIVATE_PATHS), its network namespace joined to the host by a veth pair, and the
    routes to and from its pod subnet. What a reboot of the node's machine would give it afresh."""
    assert spec.netns is not None and spec.cgroup_root is not None
    net = spec.netns
    _prepare_cgroups(spec)
    ns_dir = spec.netns_file.parent
    ns_dir.mkdir(parents=True, exist_ok=True)
    if not _is_mount_point(ns_dir):
        # Namespace files are bind mounts; on a private mount they never propagate into the namespaces.
        _run("mount", "--bind", str(ns_dir), str(ns_dir))
        _run("mount", "--make-private", str(ns_dir))
    # The mount namespace first: its copy of the host's mounts then holds no reference to the network namespace.
    if not _is_mount_point(spec.mntns_file):
        spec.mntns_file.touch()
        _run(UNSHARE, f"--mount={spec.mntns_file}", "--propagation", "private", "true")
        for path in NODE_PRIVATE_PATHS:
            Path(path).mkdir(parents=True, exist_ok=True)  # the mount point, on the host's filesystem
            tmpfs = ("mount", "-t", "tmpfs", "-o", "mode=0755", f"ftjob{spec.suffix}", path)
            _run(NSENTER, f"--mount={spec.mntns_file}", "--", *tmpfs)
    if not _is_mount_point(spec.netns_file):
        spec.netns_file.touch()
        _run(UNSHARE, f"--net={spec.netns_file}", "true")
        _run(
            "ip", "link", "add", net.host_if, "type", "veth", "peer", "name", net.node_if, "netns", str(spec.netns_file)
        )
        _run("ip", "addr", "add", f"{net.host_ip}/{net.prefix}", "dev", net.host_if)
        _run("ip", "link", "set", net.host_if, "up")
        _in_netns(spec, "ip", "link", "set", "lo", "up")
        _in_netns(spec, "ip", "addr", "add", f"{spec.ip}/{net.prefix}", "dev", net.node_if)
        _in_netns(spec, "ip", "link", "set", net.node_if, "up")
        _in_netns(spec, "ip", "route", "add", "default", "via", net.host_ip)
        # Only kube-proxy's DNAT may use Service IPs; pod addresses are served by the bridge or the routes below.
        for cidr in (SERVICE_CIDR, POD_RANGE):
            _in_netns(spec, "ip", "route", "add", "blackhole", cidr)
        for other in nodes:
            if other != spec:
                _in_netns(spec, "ip", "route", "add", other.pod_cidr, "via", net.host_ip)
        _in_netns(spec, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")  # a new namespace starts with 0
    _run("ip", "route", "replace", spec.pod_cidr, "via", spec.ip)  # beats the POD_RANGE blackhole


def remove_node_host(spec: NodeSpec, reap: Callable[[], None] | None = None) -> int:
    """Everything of a node in a namespace of its own goes at once: every process in its cgroup tree (kubelet,
    kube-proxy, containerd, shims, the pods' containers) is SIGKILLed, its mount namespace (and with it every
    mount it made), its network namespace (its address, bridge and pods' interfaces), its routes, cgroups and
    runtime state under its run dir. Its containerd root and kubelet root dir (its disk) stay. Idempotent.
    `reap` waits for the killed processes that are our children (a zombie may keep its cgroup busy). Returns how
    many processes were killed."""
    assert spec.netns is not None and spec.cgroup_root is not None
    killed = _kill_cgroup_tree(spec.cgroup_root)
    if reap is not None:
        reap()
    for ns_file in (spec.mntns_file, spec.netns_file):  # the mount namespace holds nothing of the other
        if _is_mount_point(ns_file):
            _run("umount", str(ns_file), check=False)
    _run("ip", "link", "del", spec.netns.host_if, check=False)  # gone with the namespace unless still held
    _run("ip", "route", "del", spec.pod_cidr, check=False)
    if _is_mount_point(spec.netns_file.parent):
        _run("umount", str(spec.netns_file.parent), check=False)
    _remove_cgroup_tree(spec.cgroup_root)
    shutil.rmtree(spec.run_dir, ignore_errors=True)
    return killed


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


def teardown_host(state_file: Path, directory: Path) -> None:
    """Undo what the nodes of the cluster in `directory` changed on the host (after their processes stopped)."""
    before = json.loads(state_file.read_text()) if state_file.exists() else {"sysctls": {}, "existing_paths": []}
    for spec in NODES:
        if spec.netns is not None:
            remove_node_host(spec)
    netns = Path("/var/run/netns")
    for ns in netns.glob("cni-*") if netns.is_dir() else []:
        _run("umount", str(ns), check=False)
        ns.unlink(missing_ok=True)
    _unmount_under(*(s.directory(directory) for s in NODES), *(s.run_dir for s in NODES), Path("/var/lib/kubelet"))
    _run("ip", "link", "del", NODE_A.bridge, check=False)
    _run("ip", "link", "del", DUMMY_IF, check=False)
    for cidr in (SERVICE_CIDR, POD_RANGE, NODE_NET):
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
    for spec in NODES:
        shutil.rmtree(spec.run_dir, ignore_errors=True)
    state_file.unlink(missing_ok=True)


# --- images ---------------------------------------------------------------------------------------------


def ctr(
    *args: str, input: bytes | None = None, check: bool = True, node: NodeSpec = NODE_A
) -> subprocess.CompletedProcess[bytes]:
    """`ctr` against `node`'s containerd, in the CRI plugin's namespace."""
    return _run("ctr", "-a", str(node.containerd_sock), "-n", "k8s.io", *args, input=input, check=check)


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


def _full_ref(ref: str) -> str:
    return ref if "/" in ref.split("/")[0] and "." in ref.split("/")[0] else f"docker.io/{ref}"


def _containerd_config_digest(ref: str, node: NodeSpec) -> str | None:
    """Config digest (= Docker's image ID) of `ref` in the node's containerd, or None if absent."""
    full = _full_ref(ref)
    listing = ctr("images", "ls", node=node).stdout.decode().splitlines()[1:]
    for line in listing:
        cols = line.split()
        if cols and cols[0] == full:
            manifest = json.loads(ctr("content", "get", cols[2], node=node).stdout)
            return str(manifest["config"]["digest"])
    return None


def registry_hosts_dir(spec: NodeSpec, cluster_dir: Path) -> Path:
    """The node's containerd registry config_path: one `<host>/hosts.toml` per registry it trusts."""
    return spec.directory(cluster_dir) / "certs.d"


def trust_registry(cluster: LocalCluster, host: str, ca_file: Path) -> list[Path]:
    """Make every node's containerd pull from the registry at `host` ("IP:PORT") over HTTPS, verifying it with
    `ca_file`; returns the hosts.toml files written (under the cluster directory: removed with it)."""
    assert cluster.directory is not None
    written = []
    for spec in cluster_nodes(cluster):
        path = registry_hosts_dir(spec, cluster.directory) / host / "hosts.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(containerd_hosts_toml(host, ca_file))
        written.append(path)
    return written


def _image_rows(spec: NodeSpec) -> list[list[str]]:
    """The node store's `ctr images ls` rows (name, type, digest, ...), header dropped."""
    return [line.split() for line in ctr("images", "ls", node=spec).stdout.decode().splitlines()[1:]]


def _remove_images(nodes: Sequence[NodeSpec], select: Callable[[list[list[str]]], list[str]]) -> list[str]:
    """Remove from each node's store the names `select` picks from its rows, garbage-collecting what no other name
    holds (--sync). Returns "node: name" for each name removed."""
    removed = []
    for spec in nodes:
        if names := select(_image_rows(spec)):
            ctr("images", "rm", "--sync", *names, check=False, node=spec)
            removed += [f"{spec.name}: {n}" for n in names]
    return removed


def forget_images(host: str, nodes: Sequence[NodeSpec]) -> list[str]:
    """Remove from each node's store every image named under registry `host`'s address (any port): what earlier
    sessions pulled from their registry, so that this session's pods pull again. Layers that another name still
    holds (the cache warm-up's import) stay. Returns the names removed."""
    address = host.rsplit(":", 1)[0]
    return _remove_images(
        nodes, lambda rows: [c[0] for c in rows if c and c[0].split("/", 1)[0].rsplit(":", 1)[0] == address]
    )


def forget_repository(full: str, nodes: Sequence[NodeSpec]) -> list[str]:
    """Remove every image of `full`'s repository (any tag, and the names CRI adds: stale_names) from each node."""
    return _remove_images(nodes, lambda rows: stale_names(full, rows))


def repository_of(name: str) -> str:
    """An image name without its tag or digest: docker.io/finetune-operator/cpu for
    docker.io/finetune-operator/cpu:old and for docker.io/finetune-operator/cpu@sha256:..."""
    name = name.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def stale_names(full: str, rows: Sequence[Sequence[str]]) -> list[str]:
    """Every name, in a node store's `ctr images ls` rows (name, type, digest, ...), of an image of `full`'s
    repository: any tag (an earlier version's, another worktree's build) and the other names containerd's CRI
    plugin records for the same image (its ID `sha256:<config digest>`, its repo digest). Removing the tag alone
    left those, and the other tags' builds stayed too: their layers were never collected and the store grew
    until the disk filled (docs/cluster.md)."""
    repository = repository_of(full)
    targets = {cols[2] for cols in rows if len(cols) > 2 and repository_of(cols[0]) == repository}
    return [cols[0] for cols in rows if len(cols) > 2 and cols[2] in targets]


def _import_stream(stream: IO[bytes], nodes: Sequence[NodeSpec], what: str) -> None:
    """`ctr images import -` of one image stream into every node at once: one reader, the bytes written to each
    node's importer in turn (one node reads the stream directly)."""
    with contextlib.ExitStack() as stack:
        errors = [stack.enter_context(tempfile.TemporaryFile()) for _ in nodes]
        imports = [
            subprocess.Popen(
                ["ctr", "-a", str(n.containerd_sock), "-n", "k8s.io", "images", "import", "-"],
                stdin=stream if len(nodes) == 1 else subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            for n, err in zip(nodes, errors, strict=True)
        ]
        if len(nodes) > 1:
            live = list(imports)
            while live and (chunk := stream.read(1 << 20)):
                for p in list(live):
                    assert p.stdin is not None
                    try:
                        p.stdin.write(chunk)
                    except BrokenPipeError:
                        live.remove(p)  # its exit status and stderr say why
            for p in imports:
                assert p.stdin is not None
                with contextlib.suppress(BrokenPipeError):
                    p.stdin.close()
        failed = []
        for n, p, err in zip(nodes, imports, errors, strict=True):
            if p.wait() != 0:
                err.seek(0)
                failed.append(f"{n.name}: {err.read().decode(errors='replace').strip()}")
    if failed:
        raise ClusterError(f"importing {what} failed: {'; '.join(failed)}")


def sync_image(ref: str, nodes: Sequence[NodeSpec] = (NODE_A,)) -> list[str]:
    """Import Docker's `ref` into each of `nodes` whose containerd lacks that image ID, from one `docker save`.
    Returns the names of the nodes it was imported into. The one place images reach the nodes: a registry pull
    would replace this function."""
    docker_id = _run("docker", "image", "inspect", "-f", "{{.Id}}", ref, check=False)
    if docker_id.returncode != 0:
        raise ClusterError(f"image {ref} is not in Docker; build it first (make image-cpu / make image-operator)")
    wanted = docker_id.stdout.decode().strip()
    stale = []
    for node in nodes:
        held = _containerd_config_digest(ref, node)
        if held == wanted:
            continue
        # The node's store lives in the cache across sessions: drop every earlier build of the repository first
        # so that its layers are garbage-collected (--sync) before the new ones arrive, instead of piling up with
        # every rebuild (several GB each: one import beside an old build filled the disk).
        forget_repository(_full_ref(ref), [node])
        stale.append(node)
    if not stale:
        return []
    save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
    assert save.stdout is not None
    try:
        _import_stream(save.stdout, stale, ref)
    finally:
        save.stdout.close()
        if save.wait() != 0:
            raise ClusterError(f"docker save {ref} failed (exit {save.returncode})")
    return [n.name for n in stale]


def import_archive(data: bytes, nodes: Sequence[NodeSpec], what: str) -> None:
    """Import an image archive made here (`_docker_archive`) into every node."""
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        _import_stream(f, nodes, what)


# --- components -----------------------------------------------------------------------------------------


# Health endpoints are on this machine (loopback, or a node's address behind its veth): never through a proxy.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_ok(url: str) -> bool:
    with _DIRECT.open(url, timeout=2) as resp:
        return int(resp.status) == 200


class _NodeComponent(Component):
    """A process of one node, named `<base_name><suffix>` (logs/kubelet-b.log). A node in a namespace of its own
    runs it there: `nsenter` into the node's network and mount namespaces, which then execs the program (so the
    process's command line starts with the program: `process_name`), after joining the node's system cgroup
    between fork and exec (`child_setup`): `kill_node` finds every process of the node in its cgroup tree."""

    base_name = ""

    def __init__(self, spec: NodeSpec) -> None:
        super().__init__()
        self.spec = spec
        self.name = f"{self.base_name}{spec.suffix}"
        self.process_name = Path(self.binary).name
        self._program: Path | None = None

    def executable(self) -> Path:
        self._program = super().executable()
        return Path(NSENTER) if self.spec.netns is not None else self._program

    def program_args(self, ctx: Context) -> list[str]:
        raise NotImplementedError

    def args(self, ctx: Context) -> list[str]:
        args = self.program_args(ctx)
        if self.spec.netns is None:
            return args
        assert self._program is not None
        return [f"--net={self.spec.netns_file}", f"--mount={self.spec.mntns_file}", "--", str(self._program), *args]

    def child_setup(self) -> None:
        if self.spec.cgroup_root is not None:
            join_node_cgroup(self.spec)


class Containerd(_NodeComponent):
    base_name = "containerd"
    binary = "/usr/bin/containerd"

    def prepare(self, ctx: Context) -> None:
        spec = self.spec
        root = spec.containerd_root()
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        d = spec.directory(ctx.directory)
        (d / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": spec.cni_network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": spec.bridge,
                    "isGateway": True,
                    "ipMasq": False,  # nothing leaves the machine, so nothing to masquerade
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(d / "cni" / "ipam"),
                        "ranges": [[{"subnet": spec.pod_cidr}]],
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
# containerd 1.6 (Debian) for node {spec.name}; its own socket and dirs, so it never meets Docker's containerd or
# another node's.
version = 2
root = "{root}"
state = "{spec.run_dir / "state"}"
oom_score = 0
[grpc]
  address = "{spec.containerd_sock}"
[ttrpc]
  address = "{spec.containerd_sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
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
        Root = "{spec.run_dir / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d / "cni" / "net.d"}"
    max_conf_num = 1
# Registries the node trusts (trust_registry writes their hosts.toml), read at each pull: a registry started after
# containerd is trusted from its first pull.
{containerd_cri_registry_config(registry_hosts_dir(spec, ctx.directory))}""")

    def program_args(self, ctx: Context) -> list[str]:
        return [f"--config={self.config}"]

    def healthy(self, ctx: Context) -> bool:
        return ctr("version", check=False, node=self.spec).returncode == 0


class _NodeAgent(_NodeComponent):
    """kubelet / kube-proxy: a client certificate, a kubeconfig and healthz (on loopback for node A, on the
    node's address for a node in a namespace, whose loopback the host cannot reach)."""

    healthz_host = "127.0.0.1"
    healthz_port = 0

    def healthy(self, ctx: Context) -> bool:
        return _http_ok(f"http://{self.healthz_host}:{self.healthz_port}/healthz")


class Kubelet(_NodeAgent):
    base_name = "kubelet"
    binary = "kubelet"

    def __init__(self, spec: NodeSpec, labels: dict[str, str] | None = None, lease_seconds: int | None = None) -> None:
        super().__init__(spec)
        self.labels = {"topology.kubernetes.io/zone": spec.zone, **(labels or {})}
        self.lease_seconds = lease_seconds

    def prepare(self, ctx: Context) -> None:
        spec = self.spec
        d = spec.directory(ctx.directory)
        (d / "pod-logs").mkdir(parents=True, exist_ok=True)
        if spec.netns is not None:  # its own network namespace: the usual ports are free there
            self.healthz_host, self.healthz_port, self.port = spec.ip, 10248, 10250
        else:
            self.healthz_port, self.port = free_port(), free_port()
        # Node authorizer + NodeRestriction identify the kubelet by this name and group.
        self.kubeconfig = ctx.write_kubeconfig(f"kubelet{spec.suffix}", f"system:node:{spec.name}", ("system:nodes",))
        serving = ctx.ca.issue(
            f"node-serving{spec.suffix}", spec.name, dns_names=(spec.name,), ips=(spec.ip,), server=True
        )
        resolv = d / "resolv.conf"  # pods' search path and nameserver: ours only, never the host's resolver
        resolv.write_text(f"nameserver {NODE_IP}\n")
        self.config = d / "kubelet.yaml"
        config: dict[str, object] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # these machines are cgroup v1; 1.37 still runs there when told to
            "cgroupDriver": "cgroupfs",  # no systemd; containerd 1.6 cannot report its driver
            "containerRuntimeEndpoint": f"unix://{spec.containerd_sock}",
            "address": spec.ip,
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": self.healthz_host,
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
        if spec.cgroup_root is not None:
            # Two kubelets under one QoS root each kill the other's pod cgroups as orphans every 2 s (measured).
            config["cgroupRoot"] = spec.cgroup_root
        if self.lease_seconds is not None:
            # Renewed every quarter of this: several renewals fit in the controller-manager's shortened grace.
            config["nodeLeaseDurationSeconds"] = self.lease_seconds
        self.config.write_text(json.dumps(config, indent=2))

    def program_args(self, ctx: Context) -> list[str]:
        return [
            f"--config={self.config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.spec.directory(ctx.directory) / 'kubelet'}",
            f"--hostname-override={self.spec.name}",
            f"--node-ip={self.spec.ip}",
            f"--node-labels={','.join(f'{k}={v}' for k, v in sorted(self.labels.items()))}",
            "--v=1",
        ]


class KubeProxy(_NodeAgent):
    base_name = "kube-proxy"
    binary = "kube-proxy"

    def prepare(self, ctx: Context) -> None:
        spec = self.spec
        if spec.netns is not None:
            self.healthz_host, self.healthz_port, metrics = spec.ip, 10256, 10249
        else:
            self.healthz_port, metrics = free_port(), free_port()
        kubeconfig = ctx.write_kubeconfig("kube-proxy", "system:kube-proxy")  # bound to system:node-proxier
        self.config = spec.directory(ctx.directory) / "kube-proxy.yaml"
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": spec.name,
            "bindAddress": spec.ip,
            "clusterCIDR": POD_RANGE,
            "healthzBindAddress": f"{self.healthz_host}:{self.healthz_port}",
            "metricsBindAddress": f"127.0.0.1:{metrics}",
            "nodePortAddresses": [f"{spec.ip}/32"],
            "iptables": {"localhostNodePorts": False},
            "conntrack": {"maxPerCore": 0},  # leave the host's conntrack table size alone
        }
        self.config.write_text(json.dumps(config, indent=2))

    def program_args(self, ctx: Context) -> list[str]:
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


NODE_MONITOR_PERIOD_S = 1  # how often the node lifecycle controller checks, when its grace period is shortened


def node_components(
    nodes: Sequence[NodeSpec] = NODES,
    *,
    node_monitor_grace_s: int | None = None,
    labels: dict[str, str] | None = None,
) -> list[Component]:
    """The control plane on NODE_IP, then each node (containerd, kubelet, kube-proxy; CoreDNS and, where
    `network_policy_unavailable_reason()` is None, the NetworkPolicy agent after node A), in start order.
    `node_monitor_grace_s` shortens the controller-manager's node-monitor grace period (default 50 s) and the
    kubelets' lease to fit in it; `labels` go on every node (besides its zone)."""
    if not nodes or nodes[0] != NODE_A:
        raise ValueError("node A comes first: the API server and CoreDNS live on its address")
    apiserver = KubeApiserver(
        extra_args=[
            # The `kubernetes` Service's endpoint is NODE_IP (lease reconciler), which pods can route to.
            "--endpoint-reconciler-type=lease",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    )
    kcm_args: list[str] = []
    lease: int | None = None
    if node_monitor_grace_s is not None:
        kcm_args = [
            f"--node-monitor-grace-period={node_monitor_grace_s}s",
            f"--node-monitor-period={NODE_MONITOR_PERIOD_S}s",
        ]
        lease = max(4, node_monitor_grace_s // 2)
    components: list[Component] = [Etcd(), apiserver, KubeControllerManager(kcm_args), KubeScheduler()]
    for spec in nodes:
        components += [Containerd(spec), Kubelet(spec, labels, lease), KubeProxy(spec)]
        if spec == NODE_A:
            agent: list[Component] = [] if network_policy_unavailable_reason() else [NetworkPolicyAgent()]
            components += [CoreDNS(), *agent]
    return components


def node_cluster(
    directory: Path | None = None,
    *,
    nodes: int = len(NODES),
    node_monitor_grace_s: int | None = None,
    labels: dict[str, str] | None = None,
) -> LocalCluster:
    """A LocalCluster with the first `nodes` of NODES (1 or 2); see node_components for the options."""
    if not 1 <= nodes <= len(NODES):
        raise ValueError(f"nodes must be 1..{len(NODES)}, not {nodes}")
    components = node_components(NODES[:nodes], node_monitor_grace_s=node_monitor_grace_s, labels=labels)
    return LocalCluster(directory, components=components, api_address=NODE_IP)


def cluster_nodes(cluster: LocalCluster) -> list[NodeSpec]:
    """The nodes of a cluster made by node_cluster, in start order."""
    return [c.spec for c in cluster.components if isinstance(c, Kubelet)]


def _components_of(cluster: LocalCluster, spec: NodeSpec) -> list[_NodeComponent]:
    return [c for c in cluster.components if isinstance(c, _NodeComponent) and c.spec == spec]


def _reap(cluster: LocalCluster, spec: NodeSpec) -> None:
    """Wait for the node's processes that this process started and that were killed (SIGKILL, by cgroup)."""
    for c in _components_of(cluster, spec):
        if c.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.process.wait(timeout=30)
            c.process = None


def _node_ready(kubectl: Path, kubeconfig: Path, name: str) -> str:
    jsonpath = '{.status.conditions[?(@.type=="Ready")].status}'
    out = subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", "get", "node", name, "-o", f"jsonpath={jsonpath}"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def wait_node_ready(
    kubectl: Path, kubeconfig: Path, timeout: float = 120.0, names: Sequence[str] = (NODE_NAME,)
) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(names)
    while waiting:
        waiting = [n for n in waiting if _node_ready(kubectl, kubeconfig, n) != "True"]
        if waiting and time.monotonic() > deadline:
            raise ClusterError(f"nodes {', '.join(waiting)} not Ready after {timeout:.0f} s")
        if waiting:
            time.sleep(0.25)


def start(cluster: LocalCluster, images: list[str], *, detach: bool) -> dict[str, float]:
    """prepare_host, start the cluster with its nodes, import the pause and given images into every node.
    Returns timings."""
    assert cluster.directory is not None
    nodes = cluster_nodes(cluster)
    times: dict[str, float] = {}
    prepare_host(cluster.directory / "node" / "host-state.json", nodes)
    t = time.monotonic()
    cluster.start(detach=detach)
    times["cluster+nodes start"] = time.monotonic() - t
    t = time.monotonic()
    import_archive(build_pause_image(cluster.directory / "node" / "pause"), nodes, PAUSE_IMAGE)
    imported = [name for ref in images for name in sync_image(ref, nodes)]
    times["image import"] = time.monotonic() - t
    times["images imported"] = float(len(imported))  # (image, node) pairs
    t = time.monotonic()
    wait_node_ready(bins.ensure_binary("kubectl"), cluster.kubeconfig, names=[n.name for n in nodes])
    times["nodes Ready"] = time.monotonic() - t
    return times


def stop_containers(node: NodeSpec = NODE_A) -> None:
    """Kill and delete every task and container in the node's containerd (pods the kubelet left behind)."""
    for task in ctr("tasks", "ls", "-q", check=False, node=node).stdout.decode().split():
        ctr("tasks", "kill", "-s", "KILL", task, check=False, node=node)
    deadline = time.monotonic() + 20
    for task in ctr("tasks", "ls", "-q", check=False, node=node).stdout.decode().split():
        while ctr("tasks", "delete", task, check=False, node=node).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    for container in ctr("containers", "ls", "-q", check=False, node=node).stdout.decode().split():
        ctr("containers", "delete", container, check=False, node=node)


def _stop_detached_one(directory: Path, name: str) -> None:
    state_file = directory / "state.json"
    if not state_file.exists():
        return
    for comp in json.loads(state_file.read_text())["components"]:
        pid = int(comp["pid"])
        with contextlib.suppress(OSError):
            exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            if comp["name"] == name and Path(exe).name == comp.get("process", name):
                _terminate_group(pid, 15.0)


def stop(cluster: LocalCluster | None, directory: Path) -> None:
    """Stop node A's kubelet (so it restarts nothing) and its containers, every process of the nodes in
    namespaces (at once, by cgroup), then every other process; undo host changes."""
    if cluster is not None:
        for c in cluster.components:
            if c.name == "kubelet":
                c.stop()
    else:
        _stop_detached_one(directory, "kubelet")
    if NODE_A.containerd_sock.exists():
        stop_containers(NODE_A)
    for spec in NODES:
        if spec.netns is not None:
            remove_node_host(spec, None if cluster is None else functools.partial(_reap, cluster, spec))
    if cluster is not None:
        cluster.stop(keep_directory=True)
    else:
        LocalCluster.stop_detached(directory)
    teardown_host(directory / "node" / "host-state.json", directory)


# --- node faults, as they happen to instances -------------------------------------------------------------


def kill_node(cluster: LocalCluster, name: str) -> int:
    """Node `name` dies the way an instance does: its kubelet, kube-proxy, containerd, shims and the pods'
    containers are SIGKILLed at once, and its mounts, network namespace (its address and its pods' addresses stop
    answering) and runtime state go, as in a power loss. Nothing is drained and no API object is touched: the Node
    and its pods stay as the API server last heard of them until the node controller notices (grace period).
    Its disk (containerd's image store, the kubelet's root dir) stays for `restart_node`. Returns how many
    processes were killed. Only a node in a namespace of its own can die alone (node A shares the host's network
    with the control plane)."""
    spec = node_spec(name)
    if spec.netns is None:
        raise ClusterError(f"{name} runs in the host's namespaces with the control plane; only a namespaced node dies")
    return remove_node_host(spec, lambda: _reap(cluster, spec))


def restart_node(cluster: LocalCluster, name: str, timeout: float = 120.0) -> float:
    """Bring a node back after `kill_node`, as a rebooted instance comes back: fresh namespaces and runtime state,
    the same disk, name and address; its containerd, kubelet and kube-proxy start again. Returns the seconds
    until the node is Ready."""
    spec = node_spec(name)
    ctx = cluster.ctx
    assert ctx is not None, "cluster not started"
    components = _components_of(cluster, spec)
    if any(c.process is not None and c.process.poll() is None for c in components):
        raise ClusterError(f"{name} still runs (kill_node first)")
    began = time.monotonic()
    prepare_node_host(spec, cluster_nodes(cluster))
    for c in components:
        c.start(ctx, die_with_parent=True)
        c.wait_healthy(ctx, time.monotonic() + cluster.ready_timeout)
    wait_node_ready(bins.ensure_binary("kubectl"), cluster.kubeconfig, timeout, names=(name,))
    return time.monotonic() - began


def drain_node(
    kubeconfig: Path, name: str, *, timeout_s: int = 300, grace_period_s: int | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`kubectl drain` (the pinned kubectl) of node `name`: cordon it, then evict its pods through the eviction API
    (PodDisruptionBudgets apply; each pod gets its termination grace period, or `grace_period_s`), as the AWS Node
    Termination Handler and Karpenter do. DaemonSet pods stay; emptyDir data goes with its pod."""
    cmd = [
        str(bins.ensure_binary("kubectl")),
        f"--kubeconfig={kubeconfig}",
        "drain",
        name,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        f"--timeout={timeout_s}s",
    ]
    if grace_period_s is not None:
        cmd.append(f"--grace-period={grace_period_s}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60)
    if check and proc.returncode != 0:
        raise ClusterError(f"kubectl drain {name} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def uncordon_node(kubeconfig: Path, name: str) -> None:
    kubectl = str(bins.ensure_binary("kubectl"))
    _run(kubectl, f"--kubeconfig={kubeconfig}", "uncordon", name)


def docker_has(ref: str, *, warn: bool = False) -> bool:
    found = shutil.which("docker") is not None and _run("docker", "image", "inspect", ref, check=False).returncode == 0
    if not found and warn:
        print(f"[ftjob-cluster] {ref} is not built (not in Docker): not imported into the nodes")
    return found


def _mounts() -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]


def _routes() -> list[tuple[str, str]]:
    """(destination, the whole line) of the main table's routes; blackhole lines name their destination second."""
    out = []
    for route in _run("ip", "route", "show", check=False).stdout.decode().splitlines():
        words = route.split()  # "10.244.1.0/24 via 10.250.1.2 dev ftjobvb0" or "blackhole 10.96.0.0/16"
        if words:
            out.append((words[1] if words[0] == "blackhole" and len(words) > 1 else words[0], route.strip()))
    return out


def leftovers_of(spec: NodeSpec) -> list[str]:
    """What a node in a namespace of its own still has on the host: processes in its cgroup tree, its cgroups,
    namespace and other mounts under its run dir, its veth, its pod-subnet route, its run dir. Empty after
    `kill_node` (or `stop`)."""
    assert spec.netns is not None and spec.cgroup_root is not None
    top = spec.cgroup_root.strip("/")
    found = [f"process {pid}" for pid in sorted(_cgroup_pids(spec.cgroup_root))]
    found += [f"cgroup {h}/{top}" for h in sorted(Path("/sys/fs/cgroup").iterdir()) if (h / top).is_dir()]
    found += [f"mount {m}" for m in _mounts() if m == str(spec.run_dir) or m.startswith(f"{spec.run_dir}/")]
    if Path(f"/sys/class/net/{spec.netns.host_if}").exists():
        found.append(f"interface {spec.netns.host_if}")
    found += [f"route {line}" for dest, line in _routes() if dest == spec.pod_cidr]
    if spec.run_dir.exists():
        found.append(f"path {spec.run_dir}")
    return found


def leftovers(directory: Path) -> list[str]:
    """Host changes of the nodes of the cluster in `directory` still present (after `stop`, this is empty: the e2e
    session asserts it)."""
    found = [f"interface {i}" for i in (DUMMY_IF, NODE_A.bridge) if Path(f"/sys/class/net/{i}").exists()]
    found += [f"route {line}" for dest, line in _routes() if dest in (SERVICE_CIDR, POD_RANGE, NODE_NET)]
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = _run(tool, "-t", table, "-S", check=False).stdout.decode().splitlines()
            found += [
                f"{tool} -t {table} {r}" for r in rules if r.startswith("-N ") and r[3:].startswith(CHAIN_PREFIXES)
            ]
    roots = (
        *(str(s.directory(directory)) for s in NODES),
        str(NODE_A.run_dir),
        "/var/lib/kubelet",
        "/var/run/netns/cni-",
        "/run/netns/cni-",
    )
    found += [f"mount {m}" for m in _mounts() if m.startswith(roots)]
    found += [f"cgroup {h}/kubepods" for h in sorted(Path("/sys/fs/cgroup").iterdir()) if (h / "kubepods").is_dir()]
    if NODE_A.run_dir.exists():
        found.append(f"path {NODE_A.run_dir}")
    for spec in NODES:
        if spec.netns is not None:
            found += leftovers_of(spec)
    if shutil.which("nft") is not None and _run("nft", "list", "table", *NETPOL_TABLE, check=False).returncode == 0:
        found.append(f"nftables table {' '.join(NETPOL_TABLE)}")
    if DOCKER_CERTS_D.is_dir():
        found += [f"Docker trust {p}" for p in sorted(DOCKER_CERTS_D.glob(f"{NODE_IP}:*"))]
    return found
