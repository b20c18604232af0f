"""The only module that talks to the Kubernetes API. One written policy for absence and conflict:

| call               | 404 (absent)                     | 409 (exists / conflict)                                 |
|--------------------|----------------------------------|---------------------------------------------------------|
| create child       | namespace gone: error            | read back: ours (same controller uid): fine (1), else error |
| create child       | 400/422 (refused as invalid): `Refused`, which ends the job Failed/InvalidSpec (refusal.py) |
| delete pod         | already gone: fine               | uid precondition failed: another pod's name now: left   |
| delete job         | already gone: fine               | uid precondition failed: a new job of that name: left   |
| delete Workload    | already gone: fine               | uid precondition failed: another Workload now: left     |
| relabel child      | gone: fine                       | - (422: its uid test failed, another object now: left)  |
| patch status       | job deleted meanwhile: ignored   | -                                                       |
| read pod log       | pod gone / not started: None     | -                                                       |
| get ResourceFlavor | absent: None (the job waits)     | -                                                       |
| get Workload (3)   | none yet: None (the job makes it) | -                                                      |
| Kueue's discovery  | group not served: no Workloads   | -                                                       |
| get PriorityClass  | absent: None (the job waits)     | -                                                       |
| patch Workload status | gone: ignored                 | Kueue wrote it meanwhile: ignored (2)                   |
| post event         | errors are logged, never raised  | a repeat: count + 1 on the existing Event (aggregation) |
| list jobs (CLI)    | namespace none: empty list       | -                                                       |
| get Lease          | none yet: None (leader.py creates it) | -                                                  |
| create Lease       | namespace gone: error            | another replica created it first: None (it reads it next) |
| update Lease       | deleted meanwhile: None          | another replica wrote it first (stale resourceVersion): None |

(1) and its identity labels put back if someone edited them (`relabel`): that is why the watches lost it.
(2) the watch event of Kueue's write brings the next pass, which sees the Workload as it is now.
(3) only where Workloads are not watched: Kueue's CRDs were installed after the operator started (handlers.py).

Every delete and every label repair names the uid of the object it means (a delete's `preconditions.uid`, a JSON
patch's `test` of `/metadata/uid`): a name alone could by then be another object's. Workloads are watched
(handlers.py) wherever Kueue was installed when the operator started; only without that watch is a queued job's
Workload read here, every pass.

With leader election (leader.py), every write but the Lease's own goes through `guard` first: a process that no
longer surely holds the lease sends nothing (the guard exits it). Reads are never guarded.

A create refused with 403 NamespaceTerminating is skipped (logged, not raised): the namespace is being
deleted, the job with it, and retrying cannot succeed.

One `Kube` serves every job loop of an operator (handlers.py): one connection pool, so a pass reuses open TLS
connections instead of making its own. Requests go through the client's generic `param_serialize`/`call_api`
(its configuration, authentication and connection pool) with plain JSON in and out: the generated API classes
(`CoreV1Api` and the models it names) cost memory and seconds of CPU to load, and parsing answers into their model
classes was most of the CPU a create cost on the operator's side (benchmarks/README.md, "Numbers behind the code's
comments").
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from .constants import (
    GROUP,
    KIND,
    KUEUE_GROUP,
    KUEUE_RESOURCE_FLAVORS,
    KUEUE_VERSION,
    KUEUE_WORKLOADS,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    PLURAL,
    VERSION,
)
from .reconcile import Relabel
from .refusal import REFUSED_STATUSES, Refused

log = logging.getLogger(__name__)


class ForeignObject(RuntimeError):
    """A child's deterministic name is taken by an object this job does not control."""


def _server_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        return str(e.body or e.reason)


def _namespace_terminating(e: ApiException) -> bool:
    try:
        causes = (json.loads(e.body or "{}").get("details") or {}).get("causes") or []
    except (ValueError, AttributeError):
        return False
    return any(c.get("reason") == "NamespaceTerminating" for c in causes)


# Connections the shared client keeps open: the job loops' worker threads plus the bounded create pool
# (controller.CREATE_CONCURRENCY), with room to spare. The client's own default is 5 per CPU.
POOL_CONNECTIONS = 32


# Repeated Events whose count is remembered (one shared client serves every job: bounded, the least recently
# written out first; a forgotten one counts on from 2 at its next repeat).
EVENT_COUNTS_KEPT = 4096

# Kinds the operator's watches select by label (handlers.py): one met on create whose identity labels were edited
# is invisible to them until they are put back. Secrets are not watched, so their labels are left alone.
RELABELLED_KINDS = ("Pod", "Service", "ConfigMap", "NetworkPolicy", "Workload")


# Where each kind lives: (API prefix, plural). Workloads are Kueue's (constants).
_PATHS = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Event": ("/api/v1", "events"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Workload": (f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}", KUEUE_WORKLOADS),
    "FineTuneJob": (f"/apis/{GROUP}/{VERSION}", PLURAL),
}


def _lease_path(ns: str, name: str | None = None) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases" + (f"/{name}" if name else "")


def _pointer(key: str) -> str:
    """A label key as one JSON pointer segment (RFC 6901: ~ and / escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def _path(kind: str, ns: str, name: str | None = None, sub: str | None = None) -> str:
    if kind not in _PATHS:
        raise ValueError(f"unsupported kind {kind}")
    prefix, plural = _PATHS[kind]
    return "/".join([f"{prefix}/namespaces/{ns}/{plural}", *([name] if name else []), *([sub] if sub else [])])


def load_client_config() -> None:
    """Loads the default client configuration as kopf's login does at its start (in a pod: the service account;
    else the kubeconfig), for what runs before kopf: the leader election."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


def shared_client() -> client.ApiClient:
    """An API client on the default configuration (what kopf's login loaded), with POOL_CONNECTIONS."""
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = POOL_CONNECTIONS
    return client.ApiClient(cfg)


class Kube:
    def __init__(self, api: client.ApiClient | None = None, guard: Callable[[], None] | None = None):
        self.api = api or client.ApiClient()
        # Called before every write (leader.Elector.guard): raises, or ends the process, when it may not write.
        self.guard = guard
        # Event name -> count last written (see event()), at most EVENT_COUNTS_KEPT; every loop's thread posts.
        self._event_counts: OrderedDict[str, int] = OrderedDict()
        self._event_lock = threading.Lock()

    # -- requests -------------------------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        patch: bool = False,
        content_type: str | None = None,
        timeout: float | None = None,
        guarded: bool = True,
    ) -> bytes:
        """One request; the raw answer. A write passes the guard first unless `guarded` is False (the Lease's own
        requests: renewing is what keeps the guard open). A status outside 2xx raises ApiException, as the generated
        client does."""
        if guarded and self.guard is not None and method != "GET":
            self.guard()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or ("application/merge-patch+json" if patch else "application/json")
        req = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(*req, _request_timeout=timeout)
        data: bytes = resp.read()  # type: ignore[no-untyped-call]
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=data.decode("utf-8", "replace"), data=None)
        return data

    def _json(self, method: str, path: str, body: Any = None, patch: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self._call(method, path, body, patch=patch))
        return out

    # -- children -------------------------------------------------------------------------------------------
    def _read(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        return self._json("GET", _path(kind, ns, name))

    def create(self, obj: dict[str, Any]) -> bool:
        """Create a child; True if created, False if it already existed and is ours."""
        kind, meta = obj["kind"], obj["metadata"]
        try:
            self._call("POST", _path(kind, meta["namespace"]), obj)  # the answer is not read
            return True
        except ApiException as e:
            if e.status == 403 and _namespace_terminating(e):
                log.info("not creating %s %s/%s: the namespace is being deleted", kind, meta["namespace"], meta["name"])
                return False
            if e.status in REFUSED_STATUSES:
                raise Refused(kind, meta["name"], e.status, _server_message(e)) from e
            if e.status != 409:
                raise
        existing = self._read(kind, meta["namespace"], meta["name"])
        want = {r["uid"] for r in meta.get("ownerReferences", []) if r.get("controller")}
        have = {r["uid"] for r in existing["metadata"].get("ownerReferences") or [] if r.get("controller")}
        if want and want & have:
            # Ours. If its identity labels were edited, the label-selected watches lost it (that is why it was
            # created again): put them back, so that it re-enters the watch and the job sees it again.
            labels = existing["metadata"].get("labels") or {}
            identity = {k: meta["labels"][k] for k in (LABEL_MANAGED_BY, LABEL_JOB_NAME) if k in meta.get("labels", {})}
            if kind in RELABELLED_KINDS and any(labels.get(k) != v for k, v in identity.items()):
                log.info("%s %s/%s: restoring its edited labels %s", kind, meta["namespace"], meta["name"], identity)
                self.relabel(
                    meta["namespace"], Relabel(kind, meta["name"], existing["metadata"]["uid"], labels, identity)
                )
            return False
        raise ForeignObject(
            f"{kind} {meta['namespace']}/{meta['name']} exists but is not controlled by this FineTuneJob; "
            f"delete it or rename the job"
        )

    def _delete(self, kind: str, ns: str, name: str, uid: str, **options: Any) -> None:
        """DELETE with `preconditions.uid`: only that object, never another that took its name since."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}, **options}
        try:
            self._call("DELETE", _path(kind, ns, name), body)
        except ApiException as e:
            if e.status == 409:
                log.info("%s %s/%s is no longer uid %s: not deleted; the next pass sees it", kind, ns, name, uid)
            elif e.status != 404:
                raise

    def delete_pod(self, ns: str, name: str, uid: str, grace: int | None = None) -> None:
        """`grace`: the deletion's gracePeriodSeconds (0: a force delete, for a pod on a lost node); None: the pod's
        own terminationGracePeriodSeconds (runPolicy.terminationGracePeriodSeconds), in which its ranks save."""
        options = {} if grace is None else {"gracePeriodSeconds": grace}
        self._delete("Pod", ns, name, uid, **options)

    def relabel(self, ns: str, change: Relabel) -> None:
        """Puts a child's identity labels back (JSON patch): only if it is still the object of that uid (a
        `test` op, which fails with 422 otherwise), adding only the labels that differ."""
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": change.uid}]
        if change.labels:
            ops += [
                {"op": "add", "path": "/metadata/labels/" + _pointer(k), "value": v}
                for k, v in change.want.items()
                if change.labels.get(k) != v
            ]
        else:
            ops.append({"op": "add", "path": "/metadata/labels", "value": dict(change.want)})
        try:
            self._call("PATCH", _path(change.kind, ns, change.name), ops, content_type="application/json-patch+json")
        except ApiException as e:
            if e.status not in (404, 422):
                raise
            log.info(
                "%s %s/%s not relabelled (%s): gone, or another object now", change.kind, ns, change.name, e.status
            )

    def log_tail(self, ns: str, pod: str, container: str, lines: int = 200) -> str | None:
        try:
            return self._call(
                "GET", _path("Pod", ns, pod, "log"), query={"container": container, "tailLines": lines}
            ).decode("utf-8", "replace")
        except ApiException as e:
            if e.status in (400, 404):  # container not started yet, or pod gone
                return None
            raise

    # -- Kueue ------------------------------------------------------------------------------------------------
    def delete_workload(self, ns: str, name: str, uid: str) -> None:
        self._delete("Workload", ns, name, uid)

    def workloads_served(self) -> bool:
        """Whether the API serves Kueue's Workloads now (its discovery document lists them): the operator watches
        them only then (handlers.run_operator)."""
        try:
            doc = self._json("GET", f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}")
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return any(r.get("name") == KUEUE_WORKLOADS for r in doc.get("resources") or [])

    def get_workload(self, ns: str, name: str) -> dict[str, Any] | None:
        """A queued job's Workload, read when the operator does not watch them (Kueue installed after it started)."""
        try:
            return self._json("GET", _path("Workload", ns, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def get_resource_flavor(self, name: str) -> dict[str, Any] | None:
        try:
            # Cluster-scoped: no namespace in the path.
            return self._json("GET", f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/{KUEUE_RESOURCE_FLAVORS}/{name}")
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def get_priority_class(self, name: str) -> dict[str, Any] | None:
        """A PriorityClass (cluster-scoped): its value is the Workload priority of a queued job that names it in
        spec.podTemplate.priorityClassName."""
        try:
            return self._json("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_workload_status(self, ns: str, name: str, patch: dict[str, Any]) -> None:
        """Merge patch carrying the resourceVersion it was computed from (reconcile.Plan.workload_status)."""
        try:
            self._call("PATCH", _path("Workload", ns, name, "status"), patch, patch=True)
        except ApiException as e:
            if e.status not in (404, 409):
                raise
            log.info("Workload %s/%s status not patched (%s); its watch event brings the next pass", ns, name, e.status)

    # -- the job ----------------------------------------------------------------------------------------------
    def get_job(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json("GET", _path("FineTuneJob", ns, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_jobs(self, ns: str | None = None) -> list[dict[str, Any]]:
        """Every FineTuneJob (of namespace `ns`, else of all): `ftjob estimate --calibration-from-cluster` reads
        the runs they measured; the operator never lists them (its watches do)."""
        prefix, plural = _PATHS["FineTuneJob"]
        path = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
        items: list[dict[str, Any]] = self._json("GET", path).get("items") or []
        return [dict(i, kind=KIND) for i in items]

    def patch_status(self, ns: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the status subresource; keys that disappeared are sent as null. Returns the job as the
        API server holds it after the patch (None when nothing was sent or the job is gone)."""
        patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
        patch.update({k: None for k in old if k not in new})
        if not patch:
            return None
        try:
            return self._json("PATCH", _path("FineTuneJob", ns, name, "status"), {"status": patch}, patch=True)
        except ApiException as e:
            if e.status != 404:
                raise
            return None

    def delete_job(self, ns: str, name: str, uid: str) -> None:
        self._delete("FineTuneJob", ns, name, uid, propagationPolicy="Background")

    def event(self, job: dict[str, Any], etype: str, reason: str, message: str) -> None:
        """Post an Event on the job. A repeat (same job, type, reason and message) bumps the existing Event's
        count and lastTimestamp instead of adding one, as kubectl users expect from kubelet/controller events:
        the name is derived from the content, so the repeat meets a 409. The count is kept in memory (RBAC
        grants create and patch on events, not get), so after an operator restart it counts on from 2."""
        meta = job["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = message[:1024]
        key = hashlib.sha256("\0".join([str(meta.get("uid")), etype, reason, message]).encode()).hexdigest()[:16]
        name, ns = f"{meta['name']}.{key}", meta["namespace"]
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                "apiVersion": job["apiVersion"],
                "kind": job["kind"],
                "name": meta["name"],
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "type": etype,
            "reason": reason,
            "message": message,
            "source": {"component": "finetune-operator"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "finetune-operator",
        }
        try:
            try:
                self._call("POST", _path("Event", ns), body)
            except ApiException as e:
                if e.status != 409:
                    raise
                with self._event_lock:
                    count = self._event_counts.get(name, 1) + 1
                self._call("PATCH", _path("Event", ns, name), {"count": count, "lastTimestamp": now}, patch=True)
                self._remember_count(name, count)
        except ApiException as e:  # events are best effort: never fail a reconcile on them
            log.warning("could not post event %s for %s: %s", reason, meta["name"], e.reason)

    # -- the leader election's Lease (leader.py) ----------------------------------------------------------------
    # Sent with guarded=False, never through the guard: renewing is what keeps the guard open. Each has a timeout,
    # so a leader's renewal comes back by its deadline.
    def get_lease(self, ns: str, name: str, timeout: float) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = json.loads(self._call("GET", _lease_path(ns, name), timeout=timeout, guarded=False))
            return out
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_lease(self, lease: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = json.loads(
                self._call("POST", _lease_path(lease["metadata"]["namespace"]), lease, timeout=timeout, guarded=False)
            )
            return out
        except ApiException as e:
            if e.status == 409:
                return None
            raise

    def update_lease(self, lease: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """PUT at the resourceVersion in `lease`'s metadata: compare-and-swap."""
        meta = lease["metadata"]
        try:
            out: dict[str, Any] = json.loads(
                self._call("PUT", _lease_path(meta["namespace"], meta["name"]), lease, timeout=timeout, guarded=False)
            )
            return out
        except ApiException as e:
            if e.status in (404, 409):
                return None
            raise

    def _remember_count(self, name: str, count: int) -> None:
        with self._event_lock:
            self._event_counts[name] = count
            self._event_counts.move_to_end(name)
            while len(self._event_counts) > EVENT_COUNTS_KEPT:
                self._event_counts.popitem(last=False)
