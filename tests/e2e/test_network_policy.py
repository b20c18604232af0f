"""NetworkPolicy enforced on the real node (issue 9, item 7): kube-network-policies, built from its Go module, runs
beside the kubelet (ftjob_cluster.node.NetworkPolicyAgent). With the operator's `networkPolicy.enabled`, a pod of
the job's namespace without the job's labels cannot open a connection to rank 0's rendezvous port, while rank 1
can and the job Succeeds. The control: the same outsider reaches the same port of a job the operator gave no
policy, so the test proves enforcement, not a broken network.

Where the node cannot enforce policies (`netpolicy.network_policy_unavailable_reason()`, e.g. a kernel without the
nftables `queue` expression) the test skips saying why, before any node starts.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Kubectl
from conftest import upgrade_operator

from finetune_operator.api.schema import CACHE_FOLDER
from ftjob_cluster import netpolicy, node
from ftjob_cluster.localcluster import wait_for

JOB_YAML = Path(__file__).resolve().parent / "jobs" / "netpol-gated.yaml"
JOB_TIMEOUT = 900.0
RENDEZVOUS_PORT = 29500  # finetune_operator.constants.MASTER_PORT, what PET_MASTER_PORT carries

# Both ranks join one world (rank 1 dials rank 0's port 29500: torchrun's rendezvous store), say so, and wait
# for the test's go-file. Then each opens a NEW connection to rank 0's rendezvous port (by then the test has
# seen the outsider dropped, so the policy is in force) and they all_reduce.
GATED = """\
import json, os, socket, sys, time
import torch
import torch.distributed as dist
out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
open(os.path.join(out, f"ready-rank{rank}"), "w").close()
deadline = time.monotonic() + 900
while not os.path.exists(os.path.join(out, "go")):
    if time.monotonic() > deadline:
        sys.exit("no go-file from the test after 900 s")
    time.sleep(0.5)
try:
    socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=10).close()
    reach = "connected"
except OSError as e:
    reach = f"{type(e).__name__}: {e}"
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
result = {"rank": rank, "world": dist.get_world_size(), "sum": t.item(), "reach": reach}
open(os.path.join(out, f"rank{rank}.json"), "w").write(json.dumps(result))
dist.destroy_process_group()
"""

# Run by the outsider pod: one connection attempt. A policy drop (NFQUEUE verdict) shows as a timeout; a port
# nobody listens on would be refused instead.
PROBE = """\
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    print("connected")
except TimeoutError:
    print("timeout")
except OSError as e:
    print(f"error {e}")
"""


def _skip_unless_enforcing() -> None:
    reason = netpolicy.network_policy_unavailable_reason()
    if reason:
        pytest.skip(f"no NetworkPolicy enforcement on this machine: {reason}")


def test_enforcement_probe_agrees_with_the_kernel_config() -> None:
    """The availability probe (a `queue` rule in a throwaway network namespace) says what the kernel says."""
    config = Path("/proc/config.gz")
    if os.geteuid() != 0 or shutil.which("nft") is None or not config.exists():
        pytest.skip("needs root, nft and /proc/config.gz")
    text = gzip.decompress(config.read_bytes()).decode()
    built_in = re.search(r"^CONFIG_NFT_QUEUE=y$", text, re.M) is not None
    reason = netpolicy.network_policy_unavailable_reason() or ""
    assert ("CONFIG_NFT_QUEUE" in reason) != built_in, reason


def _outsider(kubectl: Kubectl, ns: str, image: str) -> str:
    """A pod of the namespace with none of the job's labels, under the restricted Pod Security profile."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "outsider", "namespace": ns, "labels": {"app": "outsider"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.NODE_NAME},  # where the agent polices (node A)
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", "import time; time.sleep(3600)"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    wait_for(
        lambda: kubectl("-n", ns, "get", "pod", "outsider", "-o", "jsonpath={.status.phase}").stdout == "Running",
        timeout=180,
        message="outsider pod Running",
    )
    return "outsider"


def _probe(kubectl: Kubectl, ns: str, pod: str, ip: str) -> str:
    out = kubectl("-n", ns, "exec", pod, "--", "python3", "-c", PROBE, ip, str(RENDEZVOUS_PORT), timeout=60)
    return str(out.stdout.strip())


def _pod_ip(kubectl: Kubectl, ns: str, pod: str) -> str:
    return str(kubectl("-n", ns, "get", "pod", pod, "-o", "jsonpath={.status.podIP}").stdout.strip())


def _policed_ips() -> str:
    """The agent's set of local pod IPs that some policy selects (only their new connections are judged)."""
    out = subprocess.run(["nft", "list", "set", *netpolicy.NETPOL_TABLE, "podips-v4"], capture_output=True, text=True)
    return out.stdout


def _finished(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    job = json.loads(kubectl("-n", ns, "get", "ftj", name, "-o", "json").stdout)
    return dict(job) if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None


def _diagnose(kubectl: Kubectl, ns: str, cluster: Any) -> str:
    pods = kubectl("-n", ns, "get", "pods,networkpolicies", "-o", "wide", check=False).stdout
    logs = []
    for pod in kubectl("-n", ns, "get", "pods", "-o", "name", check=False).stdout.split():
        logs.append(f"--- {pod}\n{kubectl('-n', ns, 'logs', pod, '--all-containers', '--tail=30', check=False).stdout}")
    agent_log = cluster.cluster.directory / "logs" / f"{node.NetworkPolicyAgent.name}.log"
    agent = agent_log.read_text(errors="replace")[-4000:] if agent_log.exists() else "(no agent log)"
    return f"{pods}\n" + "\n".join(logs) + f"\n--- agent\n{agent}\n--- nft set\n{_policed_ips()}"


def _set_network_policy(request: pytest.FixtureRequest, enabled: bool) -> None:
    """`helm upgrade` of the session's release with only networkPolicy.enabled changed; the Deployment's config
    checksum rolls the operator pod, which reads its configuration at start."""
    upgrade_operator(
        request.getfixturevalue("node_cluster"),
        request.getfixturevalue("release"),
        f"networkPolicy.enabled={str(enabled).lower()}",
    )


def _run_gated_job(
    kubectl: Kubectl, ns: str, host: Path, cluster: Any, name: str, outsider: str, policed: bool
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """Apply the gated job as `name`; once both ranks joined one world, probe rank 0's rendezvous port from the
    outsider, then release the ranks. Returns (probe result, finished job, rank results)."""
    job = yaml.safe_load(JOB_YAML.read_text())
    job["metadata"]["name"] = name
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(job))
    out = host / "netpol" / ns / name
    try:
        wait_for(
            lambda: (out / "ready-rank0").exists() and (out / "ready-rank1").exists(),
            timeout=JOB_TIMEOUT,
            interval=1.0,
            message=f"{name}: both ranks joined one world",
        )
    except TimeoutError:
        pytest.fail(f"{name}: ranks did not rendezvous:\n{_diagnose(kubectl, ns, cluster)}")
    rank0_ip = _pod_ip(kubectl, ns, f"{name}-rank-0")
    if policed:  # probe only once the agent polices rank 0 (policies are eventually consistent)
        wait_for(
            lambda: kubectl("-n", ns, "get", "networkpolicy", name, check=False).returncode == 0,
            timeout=60,
            message=f"the operator made NetworkPolicy {name}",
        )
        wait_for(lambda: rank0_ip in _policed_ips(), timeout=60, message=f"the agent polices {rank0_ip}")
    else:
        assert kubectl("-n", ns, "get", "networkpolicy", "-o", "name").stdout.strip() == ""
        assert rank0_ip not in _policed_ips(), _diagnose(kubectl, ns, cluster)
    probe = _probe(kubectl, ns, outsider, rank0_ip)
    (out / "go").write_text("")
    try:
        done = wait_for(
            lambda: _finished(kubectl, ns, name), timeout=JOB_TIMEOUT, interval=2.0, message=f"{name} to finish"
        )
    except TimeoutError:
        pytest.fail(f"{name} did not finish:\n{_diagnose(kubectl, ns, cluster)}")
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    assert isinstance(done, dict)
    return probe, done, ranks


def test_outsider_cannot_reach_rank0_rendezvous_port_while_the_ranks_can(request: pytest.FixtureRequest) -> None:
    _skip_unless_enforcing()  # before the fixtures: no node starts on a machine that cannot enforce
    cluster = request.getfixturevalue("node_cluster")  # conftest.NodeCluster
    kubectl: Kubectl = request.getfixturevalue("kubectl")
    request.getfixturevalue("operator")  # the release the test upgrades
    ns, host = request.getfixturevalue("job_namespace")
    assert node.NetworkPolicyAgent.name in {c.name for c in cluster.cluster.components}
    scripts = host / CACHE_FOLDER / "scripts"  # /cache/scripts in the pods (the compile-cache claim's folder)
    scripts.mkdir(mode=0o777)
    (scripts / "gated.py").write_text(GATED)
    (scripts / "gated.py").chmod(0o644)
    outsider = _outsider(kubectl, ns, request.getfixturevalue("runtime_image"))

    # Control: the session's release makes no policies, so the outsider reaches rank 0's port.
    probe, job, ranks = _run_gated_job(kubectl, ns, host, cluster, "np-open", outsider, policed=False)
    assert probe == "connected", f"no policy, so the outsider must connect: {probe}\n{_diagnose(kubectl, ns, cluster)}"
    assert job["status"]["phase"] == "Succeeded", job["status"]

    _set_network_policy(request, True)
    try:
        probe, job, ranks = _run_gated_job(kubectl, ns, host, cluster, "np-closed", outsider, policed=True)
        policy = json.loads(kubectl("-n", ns, "get", "networkpolicy", "np-closed", "-o", "json").stdout)
        assert policy["spec"]["podSelector"]["matchLabels"]["finetune.dev/job-name"] == "np-closed"
        assert probe == "timeout", f"the policy must drop the outsider: {probe}\n{_diagnose(kubectl, ns, cluster)}"
        assert job["status"]["phase"] == "Succeeded", f"{job['status']}\n{_diagnose(kubectl, ns, cluster)}"
        # Rank 1 opened a new connection to rank 0's rendezvous port after the outsider was dropped.
        assert [(r["rank"], r["world"], r["sum"], r["reach"]) for r in ranks] == [
            (0, 2, 3.0, "connected"),
            (1, 2, 3.0, "connected"),
        ], ranks
    finally:
        _set_network_policy(request, False)  # the session's other tests run under the release as installed
