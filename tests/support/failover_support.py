"""Helpers for failover tests (several operator replicas under leader election), written to serve any tier:
tests/controlplane/test_failover.py runs operator processes on the host; an in-cluster variant (the chart with
two replicas, the leader pod deleted) needs the same Lease reading and the same pod ledger.

- `Lease`: who holds the operator's Lease, and waiting for a change of holder (timed).
- `PodLedger`: a real watch on a job's pods that fails the test if two pods of the same role, rank and attempt
  ever existed at the same moment, and reports every attempt it saw.
- `elected_operator`: `ftjob operator --leader-elect` as a process, with the pod identity a Deployment gives it.
- `audit_events`: one user's requests from a kube-apiserver audit log, with their times.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from operator_support import RunningOperator, running_operator

# The pod labels that identify a child pod's place in a job (operator/finetune_operator/constants.py).
LABEL_JOB_NAME = "finetune.dev/job-name"
LABEL_ROLE = "finetune.dev/role"
LABEL_RANK = "finetune.dev/rank"
LABEL_ATTEMPT = "finetune.dev/attempt"

# Short election timings for tests: a takeover within seconds. Renewals every second; a leader that has not
# renewed for 6 s stops acting (so a loaded test machine would have to delay five renewals in a row to make a
# healthy leader give up), and a standby takes over 8 s after it last saw a renewal.
TEST_TIMING = {"lease-duration": "8s", "renew-deadline": "6s", "retry-period": "1s"}


class Lease:
    """The operator's coordination.k8s.io/v1 Lease, as the API server holds it."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name

    def read(self) -> Any:
        try:
            return self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def holder(self) -> str | None:
        lease = self.read()
        return None if lease is None else (lease.spec.holder_identity or None)

    def wait_for_holder(self, holder: str, wait_for: Callable[..., Any], timeout: float) -> float:
        """Seconds until `holder` holds the lease (polled every 0.1 s)."""
        start = time.monotonic()
        wait_for(lambda: self.holder() == holder, timeout=timeout, interval=0.1, message=f"{holder} holds the lease")
        return time.monotonic() - start


@dataclass
class PodLedger:
    """Every pod of one job as a real watch reports it (ADDED, MODIFIED, DELETED), from before the job exists
    until `stop()`. A pod counts as existing from its ADDED event to its DELETED event, terminating or not (a
    terminating rank may still be running). `violations` lists each moment at which two pods of the same role,
    rank and attempt existed at once."""

    api: client.ApiClient
    namespace: str
    job: str
    alive: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # uid -> (role, rank, attempt)
    seen: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # every pod ever seen, by uid
    violations: list[str] = field(default_factory=list)
    events: int = 0

    def __post_init__(self) -> None:
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"ledger-{self.job}")
        self._thread.start()
        if not self._started.wait(30) or self.error is not None:
            raise RuntimeError("the pod watch did not start") from self.error

    def _run(self) -> None:
        try:
            self._watch()
        except BaseException as e:  # a ledger that stopped watching would pass any test: stop() raises it
            self.error = e
            self._started.set()

    def _watch(self) -> None:
        core = client.CoreV1Api(self.api)
        selector = f"{LABEL_JOB_NAME}={self.job}"
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = core.list_namespaced_pod(self.namespace, label_selector=selector)
                    with self._lock:
                        self.alive = {}
                        for pod in listed.items:
                            self._record("ADDED", pod)
                    version = listed.metadata.resource_version
                    self._started.set()
                w = watch.Watch()
                for ev in w.stream(
                    core.list_namespaced_pod,
                    self.namespace,
                    label_selector=selector,
                    resource_version=version,
                    timeout_seconds=5,
                    allow_watch_bookmarks=True,
                ):
                    if ev["type"] == "BOOKMARK":  # no pod: only a newer resourceVersion (a dict, not decoded)
                        version = ev["raw_object"]["metadata"]["resourceVersion"]
                    else:
                        pod = ev["object"]
                        version = pod.metadata.resource_version
                        with self._lock:
                            self._record(ev["type"], pod)
                    if self._stop.is_set():
                        w.stop()
                        break
            except ApiException as e:
                if e.status == 410:  # too old: list again (pods gone meanwhile would be missed: none is here)
                    version = None
                    continue
                raise
            except urllib3.exceptions.HTTPError:
                self._stop.wait(0.2)

    def _record(self, kind: str, pod: Any) -> None:
        labels = pod.metadata.labels or {}
        key = (labels.get(LABEL_ROLE, "?"), labels.get(LABEL_RANK, "-"), labels.get(LABEL_ATTEMPT, "?"))
        uid = pod.metadata.uid
        self.events += 1
        self.seen[uid] = key
        if kind == "DELETED":
            self.alive.pop(uid, None)
            return
        self.alive[uid] = key
        same = [u for u, k in self.alive.items() if k == key]
        if len(same) > 1:
            self.violations.append(f"{kind} {pod.metadata.name}: {len(same)} pods of role/rank/attempt {key} at once")

    def attempts(self) -> set[str]:
        with self._lock:
            return {attempt for _, _, attempt in self.seen.values()}

    def pods_seen(self) -> int:
        with self._lock:
            return len(self.seen)

    def stop(self) -> None:
        """Ends the watch; raises what ended it early, if anything did."""
        self._stop.set()
        self._thread.join(timeout=15)
        if self.error is not None:
            raise RuntimeError(f"the pod ledger of {self.job} stopped watching") from self.error


@contextmanager
def elected_operator(
    kubeconfig: Path,
    wait_for: Callable[..., Any],
    log_path: Path,
    *,
    identity: str,
    namespace: str,
    lease: str,
    timing: dict[str, str] | None = None,
    extra: list[str] | None = None,
) -> Iterator[RunningOperator]:
    """`ftjob operator --leader-elect` with POD_NAME and POD_NAMESPACE as the chart's Deployment sets them (the
    downward API): `identity` is its pod name. Ready when /healthz answers, which a standby does too."""
    flags = [f"--leader-elect-{k}={v}" for k, v in (timing or TEST_TIMING).items()]
    env = {"POD_NAME": identity, "POD_NAMESPACE": namespace}
    with running_operator(
        kubeconfig,
        wait_for,
        log_path,
        ["--leader-elect", f"--leader-elect-resource-name={lease}", *flags, *(extra or [])],
        env=env,
    ) as op:
        yield op


def signal_process(op: RunningOperator, sig: signal.Signals) -> float:
    """Sends `sig` to the operator process; returns the wall-clock time it was sent (audit logs are in wall time)."""
    sent = time.time()
    os.kill(op.process.pid, sig)
    return sent


def audit_policy(*users: str) -> dict[str, Any]:
    """An audit policy for `users` only: their Lease writes with the request body (the renewTime a replica wrote
    tells when it decided to write), everything else of theirs at Metadata level."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {
                "level": "Request",
                "users": list(users),
                "verbs": ["create", "update"],
                "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
            },
            {"level": "Metadata", "users": list(users)},
            {"level": "None"},
        ],
    }


@dataclass(frozen=True)
class Request:
    at: float  # when the API server received it, seconds since the epoch
    verb: str
    resource: str  # resource[/subresource]; the URI for non-resource requests
    code: int
    renew_time: float | None = None  # a Lease write's spec.renewTime (with `audit_policy`), seconds since the epoch


def audit_events(log: Path, user: str) -> list[Request]:
    """`user`'s completed requests (a watch: when its stream opened), from a JSON-lines audit log."""
    out = []
    if not log.exists():
        return out
    with log.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            if (e.get("user") or {}).get("username") != user:
                continue
            if e.get("stage") != ("ResponseStarted" if e.get("verb") == "watch" else "ResponseComplete"):
                continue
            ref = e.get("objectRef") or {}
            resource = ref.get("resource") or e.get("requestURI", "").split("?")[0]
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            received = datetime.fromisoformat(e["requestReceivedTimestamp"]).timestamp()
            renewed = ((e.get("requestObject") or {}).get("spec") or {}).get("renewTime")
            out.append(
                Request(
                    received,
                    str(e.get("verb")),
                    resource,
                    int((e.get("responseStatus") or {}).get("code") or 0),
                    datetime.fromisoformat(renewed).timestamp() if renewed else None,
                )
            )
    return out


MUTATING = {"create", "update", "patch", "delete", "deletecollection"}
