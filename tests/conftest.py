"""The fixtures every tier shares; helpers live in tests/support (installed by `make setup`, imported by name).

The control-plane fixtures start nothing until a test asks for them. By default the session starts one
`LocalCluster` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler built from the pinned release; see
docs/cluster.md). With `FTJOB_KUBECONFIG` set, the same tests run against that existing cluster instead
(`make e2e-kind`). A tier may override one (tests/faults/conftest.py's `cluster` is a LocalCluster it can restart).

Fixtures: `cluster`, `kubeconfig`, `kubectl`, `kube_api`, `namespace`, `wait_for`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_support import Cluster, Kubectl, Wait, make_kubectl
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from ftjob_cluster import bins
from ftjob_cluster.localcluster import LocalCluster, wait_for

_FAILED = pytest.StashKey[bool]()
# Lines for the end-of-run summary (start time, where kept logs are): output captured during a passing
# test's teardown would never be shown.
_NOTES = pytest.StashKey[list[str]]()


def _note(session: pytest.Session, line: str) -> None:
    session.config.stash.setdefault(_NOTES, []).append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    notes = terminalreporter.config.stash.get(_NOTES, [])
    for line in notes:
        terminalreporter.write_line(f"[ftjob-cluster] {line}")


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    # Remembered so the session fixture keeps the cluster's logs when any test failed (a skip is no failure).
    if (
        call.excinfo is not None
        and call.when in ("setup", "call")
        and not call.excinfo.errisinstance(pytest.skip.Exception)
    ):
        item.session.stash[_FAILED] = True


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    external = os.environ.get("FTJOB_KUBECONFIG")
    if external:
        path = Path(external).resolve()
        api = k8s_config.new_client_from_config(config_file=str(path))
        yield Cluster(kubeconfig=path, server=str(api.configuration.host), local=False, logs={})
        return
    local = LocalCluster()
    try:
        local.start()
    except Exception:
        _note(request.session, f"control plane failed to start; logs kept in {local.directory / 'logs'}")
        raise
    _note(request.session, f"control plane {bins.K8S_VERSION} up in {local.startup_seconds:.1f} s")
    try:
        yield Cluster(
            kubeconfig=local.kubeconfig, server=local.server, local=True, logs=local.logs(), pki=local.directory / "pki"
        )
    finally:
        keep = request.session.stash.get(_FAILED, False)
        local.stop(keep_directory=keep)
        if keep:
            _note(request.session, f"a test failed: cluster logs kept in {local.directory / 'logs'}")


@pytest.fixture(scope="session")
def kubeconfig(cluster: Cluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Path) -> Kubectl:
    """`kubectl("get", "pods", "-n", ns)` runs the pinned kubectl against the session's cluster.

    Returns CompletedProcess (text); raises KubectlError (with stderr) on a non-zero exit unless
    check=False. `input=` is passed to stdin (e.g. a manifest for `apply -f -`).
    """
    return make_kubectl(bins.ensure_binary("kubectl"), kubeconfig)


@pytest.fixture(scope="session")
def kube_api(kubeconfig: Path) -> Iterator[k8s_client.ApiClient]:
    """A kubernetes-client ApiClient for the session's cluster (admin credentials)."""
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(name="wait_for", scope="session")
def wait_for_fixture() -> Wait:
    """`wait_for(predicate, timeout=60, interval=0.25, message=...)`: poll with a deadline."""
    return wait_for


@pytest.fixture
def namespace(kube_api: k8s_client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards.

    Waits for its `default` ServiceAccount (the controller-manager creates it) because the ServiceAccount
    admission plugin rejects pods until it exists — a real cluster behaves the same.
    """
    core = k8s_client.CoreV1Api(kube_api)
    stem = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:40].strip("-")
    name = f"t-{stem}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s_client.V1Namespace(metadata=k8s_client.V1ObjectMeta(name=name)))
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=60,
        message=f"ServiceAccount default in {name}",
    )
    try:
        yield name
    finally:
        # Pods bound to a Node with no kubelet would never confirm a graceful delete and would hold the
        # namespace in Terminating; delete them at once (grace 0), then the namespace (not awaited).
        try:
            core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise
