"""ftjob-cluster: pinned Kubernetes binaries and a local control plane (see docs/cluster.md).

bin NAME...      print absolute paths of pinned binaries, fetching/building them first (`bin kueue` builds Kueue,
                 `bin training-operator` the Kubeflow peer of make bench-peer, `bin registry` and
                 `bin prometheus` the registry and Prometheus of the test tooling)
build [--node]   fetch kubectl/helm and build etcd + control plane (--node: kubelet, kube-proxy, CoreDNS,
                 and kube-network-policies where the kernel can run it, instead; --with-node: both, the node's
                 where this machine could run one; never Kueue: `make kueue-bin`)
node-check       say whether this machine can run a node
up --dir DIR     start a control plane that keeps running after this command exits; --node auto|on adds
                 nodes (kubelet, containerd, kube-proxy each; CoreDNS) when this machine can run them,
                 --nodes 1|2 of them (default 2)
down --dir DIR   stop it and undo the node's host changes
status --dir DIR say whether it runs and where its kubeconfig is
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ftjob_cluster import bins


def _cmd_bin(args: argparse.Namespace) -> int:
    for name in args.names:
        print(bins.ensure_binary(name))
    return 0


def _node_groups() -> list[str]:
    from ftjob_cluster.netpolicy import network_policy_unavailable_reason

    groups = ["node", "coredns"]
    # ~20 min of a loaded 2-core machine for an agent that could not run here: say so instead.
    if (reason := network_policy_unavailable_reason()) is None:
        groups.append("netpol")
    else:
        print(f"kube-network-policies not built (`bin kube-network-policies` builds it anyway): {reason}")
    return groups


def _node_possible() -> bool:
    from ftjob_cluster.node import machine_reason

    if (reason := machine_reason()) is not None:
        print(f"node binaries not built (no node can run here): {reason}")
    return reason is None


def _shared_gocache() -> tempfile.TemporaryDirectory[str]:
    """A Go build cache for the groups of one `build`, removed when it ends; one that a killed `build` left (its pid
    in the name no longer runs) is removed first: it is gigabytes."""
    parent = bins.bin_dir().parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(".gocache-shared-*"):
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.TemporaryDirectory(dir=parent, prefix=f".gocache-shared-{os.getpid()}-")


def _cmd_build(args: argparse.Namespace) -> int:
    bins.fetch_client_binaries(force=args.force)
    groups = [] if args.node else ["control-plane"]
    if args.node or (args.with_node and _node_possible()):
        groups += _node_groups()
    # One Go build cache for the groups of this command: the kubelet's build compiles mostly what the control
    # plane's did (the same k8s.io modules), so after it the node group takes seconds instead of minutes
    # (docs/cluster.md, "Build cost").
    with _shared_gocache() as shared:
        for group in groups:
            result = bins.build_go_binaries(force=args.force, group=group, gocache=Path(shared))
            if result is not None:
                print(f"go build of {group} took {result.seconds:.0f} s")
    for group in groups:
        for name in bins.go_builds()[group].packages:
            print(bins.ensure_binary(name))
    return 0


def _cmd_node_check(args: argparse.Namespace) -> int:
    from ftjob_cluster import node

    reason = node.unavailable_reason()
    print(f"no node on this machine: {reason}" if reason else "this machine can run a node")
    # 2: the machine can run a node but one runs now. A test tier must then fail, not pass as on a machine
    # that cannot run nodes at all: its tests did not run.
    return (2 if reason == node.busy_reason() else 1) if reason else 0


def _cmd_up(args: argparse.Namespace) -> int:
    # Imported here: the PKI needs `cryptography`, which `bin`/`build` on a bare python3 must not require.
    from ftjob_cluster import node
    from ftjob_cluster.localcluster import LocalCluster

    directory = args.dir.resolve()
    if (directory / "state.json").exists():
        print(f"a cluster already runs from {directory} (make cluster-down first)", file=sys.stderr)
        return 1
    directory.mkdir(parents=True, exist_ok=True)
    reason = node.unavailable_reason() if args.node != "off" else "--node off"
    if reason and args.node == "on":
        print(f"cannot start a node: {reason}", file=sys.stderr)
        return 1
    if reason:
        print(f"control plane only, no node: {reason}")
        cluster = LocalCluster(directory).start(detach=True)
    else:
        cluster = node.node_cluster(directory, nodes=args.nodes)
        try:
            times = node.start(cluster, [i for i in args.image if node.docker_has(i, warn=True)], detach=True)
        except BaseException:
            node.stop(None, directory)
            raise
        names = ", ".join(f"{n.name} ({n.zone})" for n in node.cluster_nodes(cluster))
        print(f"nodes {names} Ready ({', '.join(f'{k} {v:.1f}' for k, v in times.items())})")
        if any(c.name == node.NetworkPolicyAgent.name for c in cluster.components):
            print(f"NetworkPolicy enforced by kube-network-policies {bins.NETPOL_VERSION}")
        else:
            from ftjob_cluster.netpolicy import network_policy_unavailable_reason

            print(f"NetworkPolicy is not enforced on this node: {network_policy_unavailable_reason()}")
    kubectl = bins.ensure_binary("kubectl")
    print(f"control plane {bins.K8S_VERSION} up in {cluster.startup_seconds:.1f} s at {cluster.server}")
    print(f"logs: {directory / 'logs'}")
    print("use it with:")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  {kubectl} get --raw '/readyz?verbose'")
    print("stop it with: make cluster-down")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from ftjob_cluster import node
    from ftjob_cluster.localcluster import LocalCluster

    start = time.monotonic()
    directory = args.dir.resolve()
    if (directory / "node" / "host-state.json").exists():
        node.stop(None, directory)
        left = node.leftovers(directory)
        print(f"stopped the cluster and its nodes in {time.monotonic() - start:.1f} s; host changes undone")
        for item in left:
            print(f"  still present: {item}", file=sys.stderr)
        return 1 if left else 0
    stopped = LocalCluster.stop_detached(directory)
    if stopped:
        print(f"stopped {', '.join(stopped)} in {time.monotonic() - start:.1f} s")
    else:
        print(f"no cluster running from {args.dir}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state_file = args.dir.resolve() / "state.json"
    if not state_file.exists():
        print(f"no cluster running from {args.dir}")
        return 1
    state = json.loads(state_file.read_text())
    alive = [c["name"] for c in state["components"] if Path(f"/proc/{c['pid']}").exists()]
    print(f"KUBECONFIG={state['kubeconfig']}")
    print(f"running: {', '.join(alive) or 'nothing'}")
    return 0 if len(alive) == len(state["components"]) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ftjob-cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bin", help="print absolute paths of pinned binaries, fetching/building them first")
    p.add_argument("names", nargs="+", choices=bins.tool_names(), metavar="NAME")
    p.set_defaults(func=_cmd_bin)
    p = sub.add_parser("build", help="fetch kubectl/helm and build etcd + control plane into the cache")
    p.add_argument("--force", action="store_true", help="rebuild even if the cache is current")
    p.add_argument("--node", action="store_true", help="build the node's kubelet, kube-proxy and CoreDNS instead")
    p.add_argument(
        "--with-node",
        action="store_true",
        help="build the node's binaries too, sharing one Go build cache, where a node could run (root, cgroups)",
    )
    p.set_defaults(func=_cmd_build)
    p = sub.add_parser(
        "node-check", help="say whether this machine can run a node (exit 1 and why if not; 2 while one runs)"
    )
    p.set_defaults(func=_cmd_node_check)
    for name, func, text in (
        ("up", _cmd_up, "start a detached control plane"),
        ("down", _cmd_down, "stop a detached control plane"),
        ("status", _cmd_status, "show a detached control plane"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", type=Path, required=True, help="cluster directory (kubeconfig, pki, logs)")
        if name == "up":
            # Off by default: a node is a machine-wide singleton; `make cluster-up` asks for auto.
            p.add_argument(
                "--node",
                choices=("auto", "on", "off"),
                default="off",
                help="start a node: auto = when this machine can (root, cgroups, containerd)",
            )
            p.add_argument(
                "--nodes",
                type=int,
                choices=(1, 2),
                default=2,
                help="how many kubelet nodes (with --node): ftjob-node, and ftjob-node-b in namespaces of its own",
            )
            p.add_argument(
                "--image",
                action="append",
                default=[],
                help="Docker image to import into each node's containerd (re-imported when its ID changes)",
            )
        p.set_defaults(func=func)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
