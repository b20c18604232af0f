"""Leader election (operator/finetune_operator/leader.py): the pure state machine on a fake clock, and the runner
against an in-memory Lease store with the API server's compare-and-swap (no API server in this tier;
tests/controlplane/test_failover.py runs two real operators against a real one)."""

from __future__ import annotations

import copy
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from finetune_operator import cli
from finetune_operator.k8s import Kube
from finetune_operator.leader import (
    EXIT_LEASE_LOST,
    Election,
    Elector,
    Record,
    Settings,
    StepDown,
    Timing,
    Wait,
    Write,
    default_identity,
)

T = Timing(lease_duration=15, renew_deadline=10, retry_period=2)
WALL = datetime(2026, 12, 5, 10, 0, 0, tzinfo=UTC)


def held_by(holder: str, rv: str = "1", renew: str = "2026-12-05T09:59:59.000000Z", transitions: int = 0) -> Record:
    return Record(holder, 15, "2026-12-05T09:00:00.000000Z", renew, transitions, rv)


def lead(e: Election, at: float = 0.0) -> Record:
    """Makes `e` the holder at `at` (its create accepted), and returns the Lease as the API server stored it."""
    action = e.decide(at, WALL, None)
    assert isinstance(action, Write) and action.create
    stored = Record(**{**action.record.__dict__, "resource_version": "10"})
    e.written(at, stored)
    return stored


# -- the state machine -------------------------------------------------------------------------------------------
def test_acquires_a_lease_that_does_not_exist_by_creating_it_as_the_holder() -> None:
    e = Election("pod-a", T)
    action = e.decide(0.0, WALL, None)
    assert action == Write(Record("pod-a", 15, "2026-12-05T10:00:00.000000Z", "2026-12-05T10:00:00.000000Z", 0), True)
    assert not e.leads(0.0), "a decision is not a lease: only the accepted write makes it"
    e.written(0.0, Record(**{**action.record.__dict__, "resource_version": "7"}))
    assert e.leads(0.0) and e.leads(9.99)


def test_acquires_a_released_lease_at_once_counting_a_transition() -> None:
    e = Election("pod-b", T)
    released = Record("", 1, "t", "t", 4, "33")
    action = e.decide(100.0, WALL, released)
    assert isinstance(action, Write) and not action.create
    assert action.record.holder == "pod-b" and action.record.transitions == 5
    assert action.record.resource_version == "33", "the update must be compare-and-swap on what was read"
    assert action.record.lease_duration_s == 15


def test_waits_out_a_held_lease_by_its_own_clock_then_takes_it_over() -> None:
    e = Election("pod-b", T)
    lease = held_by("pod-a")
    assert e.decide(50.0, WALL, lease) == Wait("pod-a", 15.0), "first seen now: a whole leaseDuration from now"
    assert e.decide(64.9, WALL, lease) == Wait("pod-a", pytest.approx(0.1))
    action = e.decide(65.0, WALL, lease)
    assert isinstance(action, Write)
    assert action.record.holder == "pod-b" and action.record.transitions == 1
    assert action.record.acquire_time == action.record.renew_time == "2026-12-05T10:00:00.000000Z"


def test_a_renewed_lease_restarts_the_standbys_count() -> None:
    e = Election("pod-b", T)
    assert isinstance(e.decide(0.0, WALL, held_by("pod-a", rv="1", renew="r1")), Wait)
    # Renewed at 10: its spec changed, so the standby counts 15 s from when it saw that.
    assert e.decide(14.0, WALL, held_by("pod-a", rv="2", renew="r2")) == Wait("pod-a", 15.0)
    assert isinstance(e.decide(28.9, WALL, held_by("pod-a", rv="2", renew="r2")), Wait)
    assert isinstance(e.decide(29.0, WALL, held_by("pod-a", rv="2", renew="r2")), Write)


def test_the_holders_lease_duration_counts_not_the_standbys() -> None:
    e = Election("pod-b", T)
    long = Record("pod-a", 60, "t", "t", 0, "1")
    e.decide(0.0, WALL, long)
    assert isinstance(e.decide(59.0, WALL, long), Wait)
    assert isinstance(e.decide(60.0, WALL, long), Write)


def test_the_leader_renews_keeping_its_acquire_time_and_transitions() -> None:
    e = Election("pod-a", T)
    stored = Record("pod-a", 15, "2026-12-05T09:00:00.000000Z", "old", 3, "10")
    e.written(0.0, stored)
    action = e.decide(2.0, WALL + timedelta(seconds=2), stored)
    assert action == Write(
        Record("pod-a", 15, "2026-12-05T09:00:00.000000Z", "2026-12-05T10:00:02.000000Z", 3, "10"), False
    )


def test_renewal_moves_the_deadline_and_a_failed_one_does_not() -> None:
    e = Election("pod-a", T)
    stored = lead(e, at=0.0)
    e.written(2.0, Record(**{**stored.__dict__, "renew_time": "r", "resource_version": "11"}))
    assert e.leads(11.9)
    e.written(4.0, None)  # refused (409) or failed: no new deadline
    assert e.leads(11.99) and not e.leads(12.0)


def test_steps_down_when_it_cannot_renew_within_the_renew_deadline() -> None:
    e = Election("pod-a", T)
    stored = lead(e, at=0.0)
    for t in (2.0, 4.0, 6.0, 8.0):  # every renewal fails (API server unreachable)
        assert isinstance(e.decide(t, WALL, stored), Write)
        e.written(t, None)
    assert e.leads(9.99)
    action = e.decide(10.0, WALL, stored)
    assert isinstance(action, StepDown) and "renew deadline (10s)" in action.reason
    assert not e.leads(10.0)


def test_the_deadline_ends_leading_before_any_standby_may_take_over() -> None:
    """The invariant the timings exist for: a standby that saw the leader's last renewal no earlier than the
    renewal began cannot take over before the leader stopped acting."""
    a, b = Election("pod-a", T), Election("pod-b", T)
    stored = lead(a, at=0.0)
    b.decide(0.0, WALL, stored)  # the standby sees the renewal at once (the earliest it can)
    last_act = max(t / 100 for t in range(0, 3000) if a.leads(t / 100))
    first_take = min(t / 100 for t in range(0, 3000) if isinstance(b.decide(t / 100, WALL, stored), Write))
    assert last_act < T.renew_deadline <= first_take - (T.lease_duration - T.renew_deadline)


def test_never_leads_without_an_accepted_write() -> None:
    e = Election("pod-a", T)
    assert not e.leads(0.0)
    action = e.decide(0.0, WALL, None)
    assert isinstance(action, Write)
    e.written(0.0, None)  # another replica created it first (409)
    assert not e.leads(0.0)
    e.written(1.0, held_by("pod-b"))  # an answer naming another holder
    assert not e.leads(1.0)


def test_a_leader_that_finds_another_holder_steps_down() -> None:
    e = Election("pod-a", T)
    lead(e, at=0.0)
    action = e.decide(1.0, WALL, held_by("pod-b", rv="99"))
    assert action == StepDown("the lease is held by pod-b now")


def test_a_deleted_lease_stops_the_leader_and_the_standby_waits_out_the_old_holders_duration() -> None:
    leader, standby = Election("pod-a", T), Election("pod-b", T)
    stored = lead(leader, at=0.0)
    assert leader.decide(1.0, WALL, None) == StepDown("the lease was deleted")
    standby.decide(0.0, WALL, stored)
    assert standby.decide(3.0, WALL, None) == Wait("pod-a", 15.0), "pod-a may act until its next renewal"
    assert isinstance(standby.decide(17.9, WALL, None), Wait)
    action = standby.decide(18.0, WALL, None)
    assert isinstance(action, Write) and action.create and action.record.holder == "pod-b"


def test_a_wall_clock_jump_changes_no_decision() -> None:
    """Only the monotonic clock decides; the wall clock is only written into renewTime for people to read."""
    standby = Election("pod-b", T)
    lease = held_by("pod-a")
    standby.decide(0.0, WALL, lease)
    for jump in (timedelta(hours=1), timedelta(hours=-1)):
        assert isinstance(standby.decide(5.0, WALL + jump, lease), Wait)
    leader = Election("pod-a", T)
    stored = lead(leader, at=0.0)
    action = leader.decide(2.0, WALL + timedelta(hours=1), stored)
    assert isinstance(action, Write) and action.record.renew_time == "2026-12-05T11:00:00.000000Z"
    assert leader.leads(2.0)


def test_a_monotonic_jump_a_hung_or_stopped_process_sees_ends_its_leading() -> None:
    e = Election("pod-a", T)
    stored = lead(e, at=0.0)
    assert isinstance(e.decide(3600.0, WALL, stored), StepDown)


def test_a_restarted_pod_takes_back_the_lease_it_held() -> None:
    """Same pod name after a container restart: the holder is itself, so it renews at once (client-go does too);
    the old process is gone with its container."""
    e = Election("pod-a", T)
    action = e.decide(0.0, WALL, Record("pod-a", 15, "acq", "r", 2, "5"))
    assert isinstance(action, Write)
    assert action.record.acquire_time == "acq" and action.record.transitions == 2


def test_release_hands_the_lease_over_and_stops_leading_first() -> None:
    e = Election("pod-a", T)
    lead(e, at=0.0)
    action = e.release(1.0, WALL)
    assert not e.leads(1.0)
    assert action is not None and action.record.holder == "" and action.record.lease_duration_s == 1
    assert action.record.resource_version == "10"
    assert Election("pod-b", T).release(0.0, WALL) is None


def test_the_holder_identity_is_the_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "finetune-operator-7d9c-abcde")
    assert default_identity() == "finetune-operator-7d9c-abcde"
    e = Election(default_identity(), T)
    action = e.decide(0.0, WALL, None)
    assert isinstance(action, Write) and action.record.holder == "finetune-operator-7d9c-abcde"
    monkeypatch.delenv("POD_NAME")
    # Outside a pod: two processes on one host must never share an identity.
    assert default_identity() != default_identity()
    with pytest.raises(ValueError, match="identity is empty"):
        Election("", T)


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        ((10, 10, 2), "--leader-elect-lease-duration (10s) must be longer than --leader-elect-renew-deadline (10s)"),
        ((15, 2.4, 2), "--leader-elect-renew-deadline (2.4s) must be longer than 1.2 × --leader-elect-retry-period"),
        ((15.5, 10, 2), "--leader-elect-lease-duration must be a whole number of seconds"),
        ((15, 0, 2), "must be positive"),
    ],
)
def test_timings_that_could_let_two_leaders_act_are_refused(timing: tuple[float, float, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Timing(*timing)


# -- the runner against an in-memory Lease store -----------------------------------------------------------------
class Leases:
    """The API server's part for Leases: create (409 if it exists), PUT with compare-and-swap on resourceVersion
    (409 if stale), GET (404 if absent). Records every request by caller."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.requests: list[tuple[str, str]] = []
        self.down = False  # the API server unreachable

    def kube(self, who: str) -> Kube:
        store = self

        class FakeKube(Kube):
            def _call(self, method: str, path: str, body: Any = None, *args: Any, **kwargs: Any) -> bytes:
                store.requests.append((who, method))
                if store.down:
                    raise OSError("connection refused")
                return json.dumps(store.handle(method, body)).encode()

        return FakeKube(api=object())  # type: ignore[arg-type]

    def handle(self, method: str, body: Any) -> dict[str, Any]:
        if method == "GET":
            if self.lease is None:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(self.lease)
        if method == "POST" and self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        if method == "PUT":
            if self.lease is None:
                raise ApiException(status=404, reason="Not Found")
            if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict")
        self.version += 1
        self.lease = {**copy.deepcopy(body), "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return copy.deepcopy(self.lease)

    @property
    def holder(self) -> str | None:
        return None if self.lease is None else self.lease["spec"]["holderIdentity"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Exited(Exception):
    pass


def elector(store: Leases, who: str, clock: Clock, exits: list[int]) -> Elector:
    def exit(code: int) -> None:
        exits.append(code)
        raise Exited(code)

    settings = Settings("ops", "finetune-operator", who, T)
    return Elector(store.kube(who), settings, clock=clock, wall=lambda: WALL, exit=exit)


def test_two_replicas_one_leads_the_other_stands_by_reading_only() -> None:
    store, clock, exits = Leases(), Clock(), []
    a, b = elector(store, "pod-a", clock, exits), elector(store, "pod-b", clock, exits)
    assert a._attempt() is True and store.holder == "pod-a"
    for _ in range(5):
        clock.now += 2
        assert a._attempt() is True  # renews
        assert b._attempt() is False  # stands by
    assert store.holder == "pod-a"
    assert {m for who, m in store.requests if who == "pod-b"} == {"GET"}, "a standby only reads the Lease"
    # The leader renews from what it wrote last: a PUT per renewal, no read.
    assert [m for who, m in store.requests if who == "pod-a"] == ["GET", "POST", *["PUT"] * 5]
    assert exits == []


def test_a_stopped_leader_is_replaced_and_on_waking_exits_without_a_request() -> None:
    """SIGSTOP as life does it, on a fake clock: the leader is not scheduled while time passes."""
    store, clock, exits = Leases(), Clock(), []
    a, b = elector(store, "pod-a", clock, exits), elector(store, "pod-b", clock, exits)
    assert a._attempt()
    b._attempt()
    for _ in range(8):  # pod-a is stopped: only the standby runs
        clock.now += 2
        b._attempt()
    assert store.holder == "pod-b" and b.election.leads(clock.now)
    before = len(store.requests)
    with pytest.raises(Exited):
        a.guard()  # pod-a wakes up in the middle of a job loop's write
    assert exits == [EXIT_LEASE_LOST]
    with pytest.raises(Exited):
        a._attempt()  # ... or in its renewer
    assert store.requests[before:] == [], "the old leader sent nothing after waking"


def test_the_guard_lets_writes_through_only_while_the_lease_is_surely_held() -> None:
    store, clock, exits = Leases(), Clock(), []
    a = elector(store, "pod-a", clock, exits)
    a._attempt()
    a.guard()
    store.down = True  # renewals fail from now on
    for _ in range(4):
        clock.now += 2
        a._attempt()
    a.guard()  # 8 s after the last renewal: still within the 10 s deadline
    clock.now += 2
    with pytest.raises(Exited):
        a.guard()
    assert exits == [EXIT_LEASE_LOST]


def test_kube_calls_the_guard_before_every_write_and_never_before_a_read() -> None:
    calls: list[str] = []
    sent: list[str] = []

    class Answer:
        status = 200

        def read(self) -> bytes:
            return b"{}"

    class Wire:
        """Stands in for the generated client's HTTP layer: what reaches it was sent."""

        def param_serialize(self, method: str, **_: Any) -> tuple[str]:
            return (method,)

        def call_api(self, method: str, **_: Any) -> Answer:
            sent.append(method)
            return Answer()

    def guard() -> None:
        calls.append(sent[-1] if sent else "-")
        if len(calls) > 2:
            raise RuntimeError("not leading")

    api = Kube(api=Wire(), guard=guard)  # type: ignore[arg-type]
    api.get_job("ns", "j")
    api.log_tail("ns", "p", "trainer")
    assert calls == [] and sent == ["GET", "GET"]
    api.delete_pod("ns", "p", "uid")
    api.patch_status("ns", "j", {}, {"phase": "Running"})
    assert sent[-2:] == ["DELETE", "PATCH"] and len(calls) == 2
    with pytest.raises(RuntimeError, match="not leading"):
        api.create({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}})
    assert sent[-1] == "PATCH", "a refused write is never sent"
    # The Lease's own requests are not guarded: renewing is what keeps the guard open.
    api.update_lease({"metadata": {"name": "l", "namespace": "ns", "resourceVersion": "1"}}, timeout=1)
    assert sent[-1] == "PUT"


def test_release_hands_over_and_later_writes_are_refused_not_fatal() -> None:
    store, clock, exits = Leases(), Clock(), []
    a, b = elector(store, "pod-a", clock, exits), elector(store, "pod-b", clock, exits)
    a._attempt()
    b._attempt()
    a.release()
    assert store.holder == "" and store.lease is not None and store.lease["spec"]["leaseDurationSeconds"] == 1
    assert REGISTRY.get_sample_value("finetune_operator_leader") == 0
    with pytest.raises(RuntimeError, match="released"):
        a.guard()
    assert exits == []
    clock.now += 2
    assert b._attempt() is True, "a released lease is taken at the next attempt, not after leaseDuration"


def test_conflicting_writes_make_one_leader() -> None:
    """Both find no Lease and create it; the second create meets a 409 and that replica stands by."""
    store, clock, exits = Leases(), Clock(), []
    a, b = elector(store, "pod-a", clock, exits), elector(store, "pod-b", clock, exits)
    a_action = a.election.decide(clock.now, WALL, None)
    b_action = b.election.decide(clock.now, WALL, None)
    assert isinstance(a_action, Write) and isinstance(b_action, Write)
    a.election.written(clock.now, Record.of(store.handle("POST", a._body(a_action))))
    with pytest.raises(ApiException) as conflict:
        store.handle("POST", b._body(b_action))
    assert conflict.value.status == 409
    b.election.written(clock.now, None)
    assert a.election.leads(clock.now) and not b.election.leads(clock.now)
    assert b._attempt() is False


def test_a_forbidden_lease_names_the_missing_grant(caplog: pytest.LogCaptureFixture) -> None:
    store, clock, exits = Leases(), Clock(), []
    a = elector(store, "pod-a", clock, exits)

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    a.kube.get_lease = forbidden  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="finetune_operator.leader"):
        assert a._attempt() is False
    assert "grant the operator's service account those verbs on leases in ops" in caplog.text


# -- the flags -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "seconds"), [("15s", 15.0), ("500ms", 0.5), ("1m", 60.0), ("2", 2.0), ("1.5s", 1.5)])
def test_durations_are_spelled_as_kube_controller_managers(text: str, seconds: float) -> None:
    assert cli.duration(text) == seconds


def test_bad_election_flags_are_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["operator", "--leader-elect-retry-period", "soon"])
    assert "'soon' is not a duration" in capsys.readouterr().err
    rc = cli.main(
        ["operator", "--leader-elect", "--leader-elect-resource-namespace=ops", "--leader-elect-renew-deadline=20s"]
    )
    assert rc == 2
    assert "--leader-elect-lease-duration (15s) must be longer than --leader-elect-renew-deadline (20s)" in (
        capsys.readouterr().err
    )


def test_leader_election_without_a_namespace_says_where_to_give_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr("finetune_operator.leader.SERVICE_ACCOUNT_NAMESPACE", "/nonexistent/namespace")
    assert cli.main(["operator", "--leader-elect"]) == 2
    assert "--leader-elect-resource-namespace" in capsys.readouterr().err
