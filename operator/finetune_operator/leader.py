"""Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's `leaderelection` (what
controller-runtime runs) does it, so that several operator replicas can run and exactly one acts.

Two parts:
- `Election`, a pure state machine: given the time on this process's monotonic clock and the Lease as read,
  what to do (wait, write the Lease, or step down). No I/O and no clock of its own, so the unit tests drive it
  with a fake clock (tests/unit/test_leader.py).
- `Elector`, the thin runner: reads and writes the Lease through `k8s.Kube` (404/409 policy there), blocks a
  standby until it leads, renews from a thread, refuses every other write of the process once the lease is no
  longer surely held (`guard`, which `k8s.Kube` calls before each write), and exits the process when it loses
  the lease, as controller-runtime does: the Deployment restarts it, as a standby.

The rules (client-go's):
- A standby judges a lease held by another by its OWN clock: from the moment it first saw the Lease's spec as
  it is now, the holder's `leaseDurationSeconds` must pass with no change before it may take over. Wall clocks
  of different machines (the Lease's renewTime) are never compared, so clock skew or a wall-clock jump changes
  nothing; the monotonic clock does not jump.
- A leader acts only until `renewDeadline` after the start of its last successful renewal; it renews every
  `retryPeriod`. Because renewDeadline < leaseDuration, a leader that cannot renew (API server unreachable,
  process hung or SIGSTOPped, a GIL held) stops acting before any standby can consider the lease expired:
  the standby's count starts no earlier than the renewal it saw, which began after the leader's own start
  time. The margin (leaseDuration - renewDeadline) absorbs the delay between the two and clock-rate drift.
- Writes are compare-and-swap on the Lease's resourceVersion: of two replicas writing at once one gets a 409.
- A leader that is stopped (TERM) releases the lease (holder "", duration 1 s) after kopf has stopped, so that a
  standby takes over at its next attempt instead of after a whole leaseDuration (controller-runtime's
  ReleaseOnCancel).
- The holder identity is the pod name (`POD_NAME`, from the downward API in the chart); outside a pod the host
  name and a random suffix, so that two processes on one host never share an identity.
"""

from __future__ import annotations

import dataclasses
import http.server
import logging
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

import urllib3
from kubernetes.client.exceptions import ApiException

from . import metrics
from .constants import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S
from .k8s import Kube

log = logging.getLogger(__name__)

# client-go's JitterFactor: a standby waits retryPeriod × (1 + up to 1.2) between attempts, so that standbys do
# not poll in step. renewDeadline must exceed retryPeriod × this factor (client-go refuses the config otherwise).
JITTER_FACTOR = 1.2

# The exit status of a process that lost the lease (cli.py returns it; the control-plane tests read it). The
# kubelet restarts the container on any non-zero status, and it comes back as a standby.
EXIT_LEASE_LOST = 3

# Where a pod finds its own namespace when POD_NAMESPACE is not set.
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class NotLeading(RuntimeError):
    """A write was refused: this process does not surely hold the lease now."""


@dataclass(frozen=True)
class Timing:
    """client-go's three durations, in seconds; the flag names are what errors name."""

    lease_duration: float = LEASE_DURATION_S
    renew_deadline: float = RENEW_DEADLINE_S
    retry_period: float = RETRY_PERIOD_S

    def __post_init__(self) -> None:
        problems = []
        if self.lease_duration < 1 or self.lease_duration != int(self.lease_duration):
            problems.append(
                f"--leader-elect-lease-duration must be a whole number of seconds, at least 1 (the Lease stores "
                f"whole seconds), not {self.lease_duration:g}s"
            )
        if self.renew_deadline <= 0 or self.retry_period <= 0:
            problems.append("--leader-elect-renew-deadline and --leader-elect-retry-period must be positive")
        elif self.lease_duration <= self.renew_deadline:
            problems.append(
                f"--leader-elect-lease-duration ({self.lease_duration:g}s) must be longer than "
                f"--leader-elect-renew-deadline ({self.renew_deadline:g}s): a leader must stop acting before a "
                f"standby may take over"
            )
        elif self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            problems.append(
                f"--leader-elect-renew-deadline ({self.renew_deadline:g}s) must be longer than "
                f"{JITTER_FACTOR:g} × --leader-elect-retry-period ({self.retry_period:g}s)"
            )
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class Record:
    """A Lease's spec, and the resourceVersion it was read at (or written as)."""

    holder: str  # "" when released
    lease_duration_s: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str = ""

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> Record:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )

    def spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }

    def same_spec(self, other: Record) -> bool:
        return self.spec() == other.spec()


@dataclass(frozen=True)
class Wait:
    """Another replica holds the lease; by this process's clock it may expire in `seconds`."""

    holder: str
    seconds: float


@dataclass(frozen=True)
class Write:
    """Write this record: create the Lease (`create`), else update it at `record.resource_version`."""

    record: Record
    create: bool = False


@dataclass(frozen=True)
class StepDown:
    """This process led and must stop acting now."""

    reason: str


Action = Wait | Write | StepDown


def micro_time(wall: datetime) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return wall.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Election:
    """The state machine. `now` is always this process's monotonic clock (seconds); `wall` only goes into the
    Lease's acquireTime/renewTime, for people and `kubectl`, and decides nothing."""

    def __init__(self, identity: str, timing: Timing) -> None:
        if not identity:
            raise ValueError("the leader election identity is empty")
        self.identity = identity
        self.timing = timing
        self.observed: Record | None = None  # the Lease as last read or written
        self.observed_at = 0.0  # when its spec was first seen as it is (meaningful while observed is set)
        self.absent_since: float | None = None  # when the Lease, seen before, was first found deleted
        # The start of the last write that made or kept this process the holder; None while not leading.
        self.renewed_at: float | None = None

    def leads(self, now: float) -> bool:
        """True while this process may act: it holds the lease and renewed it less than renewDeadline ago.
        Reads one attribute, so any thread may ask without a lock."""
        renewed = self.renewed_at
        return renewed is not None and 0.0 <= now - renewed < self.timing.renew_deadline

    def expired(self, now: float) -> StepDown | None:
        """A StepDown when this process led but its renew deadline has passed (it may not even read first)."""
        renewed = self.renewed_at
        if renewed is None or self.leads(now):
            return None
        return StepDown(
            f"the lease was not renewed within the renew deadline ({self.timing.renew_deadline:g}s): "
            f"last renewed {now - renewed:.1f}s ago"
        )

    def decide(self, now: float, wall: datetime, lease: Record | None) -> Action:
        """What to do, given the Lease as just read (None: there is none)."""
        expired = self.expired(now)
        if expired is not None:
            return expired
        if lease is None:
            return self._absent(now, wall)
        self.absent_since = None
        if self.observed is None or not lease.same_spec(self.observed):
            self.observed_at = now
        self.observed = lease
        stamp = micro_time(wall)
        ours = int(self.timing.lease_duration)
        if lease.holder == self.identity:
            # Renewing; or, after a restart of this same pod, taking back what it held: the same holder, so the
            # acquire time and the transition count stay.
            return Write(dataclasses.replace(lease, renew_time=stamp, lease_duration_s=ours))
        if self.renewed_at is not None:
            return StepDown(f"the lease is held by {lease.holder or 'no one'} now")
        if lease.holder and now < self.observed_at + lease.lease_duration_s:
            return Wait(lease.holder, self.observed_at + lease.lease_duration_s - now)
        # Released (no holder), or not renewed for a whole leaseDuration by this process's clock: take it.
        return Write(Record(self.identity, ours, stamp, stamp, lease.transitions + 1, lease.resource_version))

    def _absent(self, now: float, wall: datetime) -> Action:
        if self.renewed_at is not None:
            return StepDown("the lease was deleted")
        last = self.observed
        if last is not None and last.holder and last.holder != self.identity:
            # Deleted while another replica held it: that leader may act until its next renewal attempt shows
            # it the deletion, so wait out its lease duration as if it had stopped renewing.
            if self.absent_since is None:
                self.absent_since = now
            if now < self.absent_since + last.lease_duration_s:
                return Wait(last.holder, self.absent_since + last.lease_duration_s - now)
        stamp = micro_time(wall)
        return Write(Record(self.identity, int(self.timing.lease_duration), stamp, stamp, 0), create=True)

    def written(self, started: float, record: Record | None) -> None:
        """The outcome of a Write whose request started at `started`: the Lease as the API server returned it,
        or None when it was refused (409: another replica wrote first; 404: deleted) or failed."""
        if record is None:
            return
        self.observed, self.observed_at, self.absent_since = record, started, None
        self.renewed_at = started if record.holder == self.identity else None

    def release(self, now: float, wall: datetime) -> Write | None:
        """Stops leading at once, and returns the write that hands the lease over (None when not leading)."""
        leading, self.renewed_at = self.leads(now), None
        if not leading or self.observed is None:
            return None
        stamp = micro_time(wall)
        return Write(Record("", 1, stamp, stamp, self.observed.transitions, self.observed.resource_version))


@dataclass(frozen=True)
class Settings:
    """What `ftjob operator --leader-elect` was given."""

    namespace: str
    name: str
    identity: str
    timing: Timing


def default_identity() -> str:
    """The pod name (POD_NAME, set from the downward API by the chart); outside a pod, host name and a random
    suffix, so two operators started by hand on one host never take each other for the holder."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str | None:
    """The operator pod's namespace (POD_NAMESPACE, or the service account's namespace file); None outside a pod."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


# What a request to the API server can fail with besides an HTTP status: refused or cut connections, timeouts.
_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)


class Elector:
    """Runs an `Election` against the API server for this process."""

    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        exit: Callable[[int], Any] = os._exit,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.election = Election(settings.identity, settings.timing)
        self.clock, self.wall, self._exit = clock, wall, exit
        self._lock = threading.Lock()  # one attempt at a time (the renewer's, a release)
        self._fresh = False  # the last write succeeded: the next renewal starts from it, without a read
        self._released = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._holder = ""  # the holder last seen while standing by (logged when it changes)

    # -- standing by ------------------------------------------------------------------------------------------
    def acquire(self, health_port: int = 0) -> None:
        """Blocks until this process leads, then renews the lease from a thread. Meanwhile it answers /healthz
        on `health_port` (so the standby pod is Ready, and counts for its PodDisruptionBudget) and sends one
        read of the Lease per attempt: it watches nothing and writes nothing else."""
        s, t = self.settings, self.settings.timing
        log.info("leader election: %s waits for Lease %s/%s", s.identity, s.namespace, s.name)
        server = _serve_health(health_port) if health_port else None
        try:
            while not self._attempt():
                self._stop.wait(t.retry_period * (1 + random.random() * JITTER_FACTOR))
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()  # kopf serves /healthz on the same port from now on
        log.info("leader election: %s leads (Lease %s/%s)", s.identity, s.namespace, s.name)
        metrics.LEADER.set(1)
        self._renewer = threading.Thread(target=self._renew, name="lease-renewer", daemon=True)
        self._renewer.start()

    # -- leading ----------------------------------------------------------------------------------------------
    def _renew(self) -> None:
        t = self.settings.timing
        while True:
            renewed = self.election.renewed_at
            left = t.renew_deadline - (self.clock() - renewed) if renewed is not None else 0.0
            # Every retryPeriod; sooner when the deadline comes first, so a lost lease is noticed at the deadline.
            if self._stop.wait(max(0.0, min(t.retry_period, left))):
                return
            self._attempt()
            if not self._released and not self.election.leads(self.clock()):
                self._lost(f"could not renew the lease within the renew deadline ({t.renew_deadline:g}s)")

    def guard(self) -> None:
        """Called by `k8s.Kube` before every write of the job loops: this process may write only while it
        surely holds the lease. Once it does not, the process exits (a release on the way out refuses instead)."""
        if self.election.leads(self.clock()):
            return
        if self._released:
            raise NotLeading("the lease was released: the operator is stopping")
        self._lost("a write was due after the lease's renew deadline had passed")

    def release(self) -> None:
        """After kopf has stopped: hand the lease over at once (holder "", duration 1 s)."""
        self._stop.set()
        with self._lock:
            self._released = True
            write = self.election.release(self.clock(), self.wall())
            metrics.LEADER.set(0)
            if write is None:
                return
            try:
                self.kube.update_lease(self._body(write), timeout=self.settings.timing.renew_deadline)
                log.info("leader election: released Lease %s/%s", self.settings.namespace, self.settings.name)
            except (ApiException, *_TRANSPORT_ERRORS) as e:  # it expires by itself after leaseDuration
                log.warning("leader election: could not release the lease: %s", e)

    def _lost(self, reason: str) -> NoReturn:
        log.error(
            "leader election: %s lost the lease (%s); exiting to restart as a standby", self.settings.identity, reason
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        self._exit(EXIT_LEASE_LOST)  # os._exit: no thread of this process gets to write after this line
        raise SystemExit(EXIT_LEASE_LOST)  # only reached when a test passes an `exit` that returns

    # -- one attempt: client-go's tryAcquireOrRenew -------------------------------------------------------------
    def _attempt(self) -> bool:
        """Reads the Lease (unless renewing right after a successful write), decides, writes. True if leading."""
        with self._lock:
            if self._released:
                return False
            now = self.clock()
            election = self.election
            expired = election.expired(now)
            if expired is not None:  # woken past its deadline (stopped, hung): no request at all, not even a read
                self._lost(expired.reason)
            try:
                if self._fresh and election.leads(now):
                    lease = election.observed
                else:
                    found = self.kube.get_lease(self.settings.namespace, self.settings.name, timeout=self._timeout(now))
                    lease = Record.of(found) if found is not None else None
                action = election.decide(now, self.wall(), lease)
                if isinstance(action, StepDown):
                    self._lost(action.reason)
                if isinstance(action, Wait):
                    if action.holder != self._holder:
                        log.info("leader election: %s holds the lease; standing by", action.holder)
                        self._holder = action.holder
                    return False
                body = self._body(action)
                timeout = self._timeout(now)
                answer = (
                    self.kube.create_lease(body, timeout=timeout)
                    if action.create
                    else self.kube.update_lease(body, timeout=timeout)
                )
            except ApiException as e:
                self._fresh = False
                self._failed(e)
                return election.leads(self.clock())
            except _TRANSPORT_ERRORS as e:
                self._fresh = False
                log.warning("leader election: the API server did not answer: %s", e)
                return election.leads(self.clock())
            election.written(now, Record.of(answer) if answer is not None else None)
            self._fresh = answer is not None
            return election.leads(self.clock())

    def _timeout(self, now: float) -> float:
        """A request of a leader must come back by its deadline; a standby's, within renewDeadline."""
        t = self.settings.timing
        renewed = self.election.renewed_at
        if renewed is None:
            return t.renew_deadline
        return max(0.05, min(t.renew_deadline, renewed + t.renew_deadline - now))

    def _failed(self, e: ApiException) -> None:
        s = self.settings
        if e.status == 403:
            log.error(
                "leader election: forbidden to get/create/update Lease %s/%s (coordination.k8s.io): grant the "
                "operator's service account those verbs on leases in %s (the chart's Role %s-leader-election), "
                "or run without --leader-elect",
                s.namespace,
                s.name,
                s.namespace,
                s.name,
            )
        elif e.status == 404:
            log.error(
                "leader election: namespace %s does not exist: set --leader-elect-resource-namespace (or "
                "POD_NAMESPACE) to the operator's namespace",
                s.namespace,
            )
        else:
            log.warning("leader election: Lease %s/%s: %s %s", s.namespace, s.name, e.status, e.reason)

    def _body(self, write: Write) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.settings.name, "namespace": self.settings.namespace}
        if not write.create:
            meta["resourceVersion"] = write.record.resource_version  # compare-and-swap: 409 if it moved on
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": write.record.spec()}


def _serve_health(port: int) -> http.server.ThreadingHTTPServer:
    """/healthz for a standby (kopf serves it once this process leads)."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?")[0] == "/healthz"
            body = b'{"standby": true}' if ok else b""
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # probes every few seconds: not worth a log line
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Health)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    return server
