"""Whether the node can enforce NetworkPolicy: kube-network-policies' needs, checked without changing the host.

Standard library only (like bins.py): `ftjob_cluster build --node` asks it on a bare python3, and builds the
agent only where it can run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ftjob_cluster import bins

# kube-network-policies' nftables table (its default name, family inet): it removes it only on SIGINT, so
# node.teardown_host() deletes it and node.leftovers() reports it. Its NFQUEUE number is its default too.
NETPOL_TABLE = ("inet", "kube-network-policies")
NETPOL_QUEUE = 100

# The dataplane kube-network-policies installs, in miniature: a postrouting base chain whose rule hands packets
# to NFQUEUE through nftables' native `queue` expression (not iptables' xt NFQUEUE target through nft_compat).
_NFT_QUEUE_PROBE = (
    "nft add table inet ftjob-probe && "
    "nft add chain inet ftjob-probe c '{ type filter hook postrouting priority 95; }' && "
    f"nft add rule inet ftjob-probe c queue num {NETPOL_QUEUE}"
)


def _in_new_netns(script: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, check=False)


def network_policy_unavailable_reason() -> str | None:
    """Why the node cannot enforce NetworkPolicy here (kube-network-policies cannot run), or None.

    The kernel check runs the agent's kind of rule in a throwaway network namespace: nothing on the host
    changes, and a kernel built without CONFIG_NFT_QUEUE is told apart from one that has it."""
    if os.geteuid() != 0:
        return "the NetworkPolicy agent needs root (nftables, NFQUEUE, a mount namespace)"
    for tool in ("nft", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (hack/apt-install.sh --tier test-e2e installs it)"
    if not Path("/proc/net/netfilter/nfnetlink_queue").exists():
        return "the kernel has no nfnetlink_queue (CONFIG_NETFILTER_NETLINK_QUEUE), which kube-network-policies needs"
    if _in_new_netns("true").returncode != 0:
        return "cannot create a network namespace (unshare --net) to check the kernel's nftables support"
    probe = _in_new_netns(_NFT_QUEUE_PROBE)
    if probe.returncode != 0:
        said = (probe.stderr.decode(errors="replace").strip().splitlines() or ["nothing"])[0][:200]
        return (
            "the kernel has no nftables `queue` expression (CONFIG_NFT_QUEUE is not set), which is how "
            f"kube-network-policies {bins.NETPOL_VERSION} hands new connections to its policy engine; "
            f"`nft add rule ... queue num {NETPOL_QUEUE}` in a throwaway network namespace said: {said}"
        )
    if shutil.which("go") is None and not (bins.bin_dir() / "kube-network-policies").exists():
        return "the Go toolchain is needed to build kube-network-policies"
    return None
