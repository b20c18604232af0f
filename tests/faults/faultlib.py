"""What the fault suite injects and checks: a loopback TCP proxy between the operator and the API server (delay,
cut connections), the operator as a process that can be SIGKILLed, the invariants every scenario ends with
(no duplicate or orphaned child, status converged), and the records docs/reliability.md is written from."""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from operator_support import API, Kubelet, free_port, status, two_rank_job
from reliability import Ledger, Verdict

from finetune_operator import constants as c
from finetune_operator.admission import validate
from finetune_operator.builders import SshKeys, desired

LONG = os.environ.get("FTJOB_FAULTS") == "long"  # `make test-faults`: the long variants
SEED = int(os.environ.get("FTJOB_FAULT_SEED") or time.time_ns() % 1_000_000)


# -- a loopback proxy that delays or cuts the operator's API traffic ------------------------------------------
class DelayProxy:
    """Forwards 127.0.0.1:<port> to the API server's port, byte for byte (TLS passes through: the serving
    certificate is for 127.0.0.1, so clients cannot tell). `delay` seconds are added before each chunk sent
    towards the API server (each request, and each TLS record of it); `cut()` closes every open connection,
    as an API server restart or a load balancer does to watch streams."""

    def __init__(self, upstream_port: int, delay: float = 0.0) -> None:
        self.upstream, self.delay = upstream_port, delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                down.close()
                continue
            up.settimeout(None)
            with self._lock:
                self._conns += [down, up]
            threading.Thread(target=self._pump, args=(down, up), daemon=True).start()

    def _pump(self, down: socket.socket, up: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([down, up], [], [], 1.0)
                if self._closed:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is down and self.delay:
                        time.sleep(self.delay)
                    (up if s is down else down).sendall(data)
        except OSError:
            return
        finally:
            for s in (down, up):
                s.close()

    def cut(self) -> int:
        """Close every open connection; returns how many were open."""
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        return len(conns) // 2

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self.cut()

    def kubeconfig(self, admin: Path, out: Path) -> Path:
        """The admin kubeconfig with its server moved to this proxy."""
        cfg = yaml.safe_load(admin.read_text())
        for cl in cfg["clusters"]:
            cl["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        out.write_text(yaml.safe_dump(cfg))
        return out


def server_port(kubeconfig: Path) -> int:
    cfg = yaml.safe_load(kubeconfig.read_text())
    return int(cfg["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])


# -- the operator as a process -------------------------------------------------------------------------------
class OperatorProcess:
    """`ftjob operator` as the image runs it; `kill()` is SIGKILL (no clean-up of any kind)."""

    def __init__(self, kubeconfig: Path, log: Path, extra: list[str] | None = None) -> None:
        self.health, self.metrics = free_port(), free_port()
        self.log_path = log
        self._log = log.open("ab")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        ftjob = str(Path(sys.executable).with_name("ftjob"))
        self.process = subprocess.Popen(
            [ftjob, "operator", "--metrics-port", str(self.metrics), "--health-port", str(self.health), *(extra or [])],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"operator exited with {self.process.returncode}; log {self.log_path}:\n"
                f"{self.log_path.read_text()[-4000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def reconciles(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("finetune_operator_reconciles_total ")
        )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self._log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


# -- invariants ---------------------------------------------------------------------------------------------------
def jobs(kube_api: client.ApiClient, ns: str) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(kube_api).list_namespaced_custom_object(*API, ns, "finetunejobs")["items"]
    return {j["metadata"]["name"]: j for j in items}


def children(kube_api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    """Every object in the namespace that carries the operator's managed-by label, as plain dicts."""
    core = client.CoreV1Api(kube_api)
    sel = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
    out: list[dict[str, Any]] = []
    for kind, lister in (
        ("Pod", core.list_namespaced_pod),
        ("Service", core.list_namespaced_service),
        ("ConfigMap", core.list_namespaced_config_map),
        ("Secret", core.list_namespaced_secret),
    ):
        for obj in lister(ns, label_selector=sel).items:
            d = kube_api.sanitize_for_serialization(obj)
            d["kind"] = kind
            out.append(d)
    return out


def expected_children(job: dict[str, Any]) -> set[str]:
    """ "Kind/name" of every child the job should have in its current attempt (builders.desired)."""
    keys = SshKeys("k", "p", "hk", "hp")
    want = desired(validate(job), attempt=int((job.get("status") or {}).get("restartCount") or 0), ssh_keys=keys)
    return {f"{o['kind']}/{o['metadata']['name']}" for o in want.all()}


def violations(kube_api: client.ApiClient, ns: str) -> list[str]:
    """Broken invariants of a converged namespace: every child controlled by an existing job's uid (no orphan),
    exactly the children the job's current attempt needs (no duplicate, nothing missing, no pod of an older
    attempt left running), and a status that agrees with the pods the API server holds: no failed pod of the
    current attempt in a job that is not finished (a rank failure leads to a group restart or to Failed), and
    status.ranks.ready counting the ranks that run. A status alone proves nothing right after an operator
    restart: it is what the previous process last saw."""
    problems: list[str] = []
    by_uid = {j["metadata"]["uid"]: j for j in jobs(kube_api, ns).values()}
    have: dict[str, set[str]] = {uid: set() for uid in by_uid}
    current: dict[str, list[dict[str, Any]]] = {uid: [] for uid in by_uid}  # live pods of the current attempt
    for obj in children(kube_api, ns):
        meta = obj["metadata"]
        ref = f"{obj['kind']}/{meta['name']}"
        ctrl = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
        if len(ctrl) != 1 or ctrl[0]["uid"] not in by_uid:
            problems.append(f"orphan: {ref} (controller {ctrl})")
            continue
        if meta.get("deletionTimestamp"):
            continue
        job = by_uid[ctrl[0]["uid"]]
        attempt = str((job.get("status") or {}).get("restartCount") or 0)
        if obj["kind"] == "Pod" and meta["labels"].get(c.LABEL_ATTEMPT) != attempt:
            problems.append(f"stale: {ref} of attempt {meta['labels'].get(c.LABEL_ATTEMPT)} lives in attempt {attempt}")
        elif obj["kind"] == "Pod":
            current[ctrl[0]["uid"]].append(obj)
        if ref in have[ctrl[0]["uid"]]:
            problems.append(f"duplicate: {ref}")
        have[ctrl[0]["uid"]].add(ref)
    for uid, job in by_uid.items():
        name, st = job["metadata"]["name"], job.get("status") or {}
        if st.get("phase") in ("Succeeded", "Failed"):
            continue
        want = expected_children(job)
        if have[uid] != want:
            problems.append(f"{name}: children {sorted(have[uid])} != expected {sorted(want)}")
        if not st.get("phase") or not st.get("startTime"):
            problems.append(f"{name}: status not converged: {json.dumps(st)[:300]}")
        phases = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") or "Pending" for p in current[uid]}
        failed = sorted(n for n, phase in phases.items() if phase == "Failed")
        if failed:
            problems.append(
                f"{name}: {failed} of attempt {st.get('restartCount') or 0} failed, status still {st.get('phase')}"
            )
        ranks = [p for p in current[uid] if p["metadata"]["labels"].get(c.LABEL_ROLE) in (c.ROLE_RANK, c.ROLE_WORKER)]
        up = sum(phases[p["metadata"]["name"]] in ("Running", "Succeeded") for p in ranks)
        if (st.get("ranks") or {}).get("ready") != up:
            problems.append(f"{name}: status.ranks {st.get('ranks')} but {up} rank pod(s) up")
    return problems


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.3) -> Any:
    """Poll with a deadline; on timeout the last value (e.g. the violations list) is in the error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


# -- docs/reliability.md (its `faults` section) -------------------------------------------------------------------
@dataclass
class Record(Verdict):
    """One row of the fault record. The test that ran the scenario makes it (`record`), counts its trials and adds
    notes; the outcome is pytest's own report of that test (reliability.Verdict), which tests/faults/conftest.py
    passes on through LEDGER."""

    scenario: str  # the test that ran it
    injection: str
    trials: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return self.passed and not self.failures

    @property
    def outcome(self) -> str:
        if self.failures:
            return f"FAILED {len(self.failures)}/{self.trials}: {self.failures[0]}"
        if self.result == "failed":
            return f"FAILED: {self.reason}"
        if self.result == "skipped":
            return f"skipped: {self.reason}"
        if self.result == "passed":
            return "; ".join(["held", *self.notes])
        return "no pytest report"


LEDGER: Ledger[Record] = Ledger()
RECORDS = LEDGER.records


def record(scenario: str, injection: str) -> Record:
    return LEDGER.add(Record(scenario, injection))


def rng(scenario: str) -> random.Random:
    """One random stream per scenario from the run's seed (FTJOB_FAULT_SEED reproduces a run)."""
    return random.Random(f"{SEED}:{scenario}")


# -- one job's whole life, driven as a kubelet would ------------------------------------------------------------
def lifecycle(
    kubectl: Any,
    kube_api: client.ApiClient,
    kubelet: Kubelet,
    ns: str,
    name: str,
    timeout: float = 90,
    during: Callable[[], None] = lambda: None,
) -> None:
    """Create a 2-rank job; pods Running -> Running phase; rank 1 fails -> one group restart with new pods;
    Running again; both ranks Succeeded -> Succeeded. `during()` runs between the steps (a fault to inject)."""
    from operator_support import job_yaml

    def st() -> dict[str, Any]:
        return status(kube_api, ns, name)

    def run_all() -> None:
        for p in kubelet.live_pods(name):
            kubelet.set_status(p.metadata.name, "Running")

    kubectl("apply", "-n", ns, "-f", "-", input=job_yaml(two_rank_job(name, backoffLimit=3)))
    during()
    wait_until(lambda: len(kubelet.live_pods(name)) == 2, timeout, f"{name}: 2 pods")
    run_all()
    during()
    wait_until(lambda: st().get("phase") == "Running", timeout, f"{name}: Running")
    kubelet.set_status(f"{name}-rank-1", "Failed", exit_code=1, message="injected")
    during()
    wait_until(
        lambda: (
            st().get("restartCount") == 1
            and len(kubelet.live_pods(name)) == 2
            and all(p.metadata.labels[c.LABEL_ATTEMPT] == "1" for p in kubelet.live_pods(name))
        ),
        timeout,
        f"{name}: a group restart with attempt 1's pods",
    )
    run_all()
    wait_until(lambda: st().get("phase") == "Running", timeout, f"{name}: Running after the restart")
    during()
    for p in kubelet.live_pods(name):
        kubelet.set_status(p.metadata.name, "Succeeded", exit_code=0, reason="Completed")
    wait_until(lambda: st().get("phase") == "Succeeded", timeout, f"{name}: Succeeded")
    final = st()
    assert final["restartCount"] == 1, final
    assert [f["rank"] for f in final.get("failures", [])] == [1], final.get("failures")
