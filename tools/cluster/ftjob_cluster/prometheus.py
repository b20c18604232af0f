"""Prometheus for the local cluster: built from its Go module by bins (tools/cluster/prometheus), on loopback,
scraping targets given by a scrape configuration derived from the chart's ServiceMonitor.

A prometheus-operator turns each endpoint of a ServiceMonitor into a scrape job that discovers the selected
Service's endpoints through the API server. `discovered_scrape_configs` makes that job: Kubernetes service
discovery (role `endpoints`, the monitor's namespaces) with prometheus-operator's relabelling (keep the Services
whose labels match the selector and the port the endpoint names; set `namespace`, `service`, `pod`, `container`,
`job`, `endpoint`; drop finished pods). The e2e tier scrapes the in-cluster operator pods with it. The
control-plane tier runs the operator as a host process with no pod IPs to discover (and an Endpoints object may
not hold a loopback address), so `scrape_configs_from_service_monitor` makes the equivalent job with a static
target: the same job name, metrics path, scheme, interval, timeout and `honor_labels`, the Service's port that the
endpoint names, and the target labels prometheus-operator's relabelling sets (`namespace`, `service`, `endpoint`,
`job`).

`Prometheus(directory, config).start()` runs `prometheus` on a free loopback port with its TSDB in `directory`,
ready when /-/ready answers; `query`, `label_values` and `targets` read its HTTP API. docs/cluster.md
"Prometheus".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftjob_cluster import bins
from ftjob_cluster.localcluster import _die_with_parent, _tail, _terminate_group, free_port


class PrometheusError(RuntimeError):
    pass


def _selects(monitor: Mapping[str, Any], service: Mapping[str, Any]) -> bool:
    spec, meta = monitor["spec"], service["metadata"]
    ns_selector = spec.get("namespaceSelector") or {}
    namespaces = ns_selector.get("matchNames") or [monitor["metadata"].get("namespace")]
    if not ns_selector.get("any") and meta.get("namespace") not in namespaces:
        return False
    if (spec["selector"] or {}).get("matchExpressions"):
        raise PrometheusError("matchExpressions in a ServiceMonitor selector are not supported here")
    labels = meta.get("labels") or {}
    return all(labels.get(k) == v for k, v in (spec["selector"].get("matchLabels") or {}).items())


def scrape_configs_from_service_monitor(
    monitor: Mapping[str, Any], services: list[Mapping[str, Any]], host: str = "127.0.0.1"
) -> list[dict[str, Any]]:
    """One scrape job per ServiceMonitor endpoint, its target the named port of every Service the monitor selects,
    reached at `host` (where the process behind the Service listens here)."""
    selected = [s for s in services if _selects(monitor, s)]
    if not selected:
        raise PrometheusError(f"ServiceMonitor {monitor['metadata']['name']} selects none of the Services given")
    ns, name = monitor["metadata"].get("namespace", "default"), monitor["metadata"]["name"]
    out = []
    for index, endpoint in enumerate(monitor["spec"]["endpoints"]):
        static = []
        for svc in selected:
            ports = {p.get("name"): p for p in svc["spec"]["ports"]}
            if endpoint.get("port") not in ports:
                raise PrometheusError(f"Service {svc['metadata']['name']} has no port named {endpoint.get('port')!r}")
            svc_ns, svc_name = svc["metadata"].get("namespace", ns), svc["metadata"]["name"]
            static.append(
                {
                    "targets": [f"{host}:{ports[endpoint['port']]['port']}"],
                    "labels": {"namespace": svc_ns, "service": svc_name, "endpoint": endpoint["port"], "job": svc_name},
                }
            )
        out.append(_scrape_job(ns, name, index, endpoint, static_configs=static))
    return out


def _scrape_job(ns: str, name: str, index: int, endpoint: Mapping[str, Any], **targets: Any) -> dict[str, Any]:
    """The scrape job prometheus-operator names and configures for endpoint `index` of ServiceMonitor ns/name (path,
    scheme, honour labels, interval, timeout), with `targets` (static or discovered) added."""
    job: dict[str, Any] = {
        "job_name": f"serviceMonitor/{ns}/{name}/{index}",
        "metrics_path": endpoint.get("path", "/metrics"),
        "scheme": endpoint.get("scheme", "http"),
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        **targets,
    }
    if "interval" in endpoint:
        job["scrape_interval"] = endpoint["interval"]
    if "scrapeTimeout" in endpoint:
        job["scrape_timeout"] = endpoint["scrapeTimeout"]
    return job


def _meta_label(name: str) -> str:
    """A Kubernetes label name as service discovery names it in meta labels (every other character an `_`)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def discovered_scrape_configs(monitor: Mapping[str, Any], kubeconfig: Path) -> list[dict[str, Any]]:
    """One scrape job per ServiceMonitor endpoint, as prometheus-operator generates it for service discovery role
    `endpoints`: the Endpoints of the monitor's namespaces, read from the API server with `kubeconfig`'s server,
    CA and credentials, kept where the Service's labels match the selector and the port is the one named, with the
    target labels prometheus-operator sets. (Its sharding step is left out: one Prometheus, one shard.)"""
    spec = monitor["spec"]
    ns, name = monitor["metadata"].get("namespace", "default"), monitor["metadata"]["name"]
    if (spec.get("selector") or {}).get("matchExpressions"):
        raise PrometheusError("matchExpressions in a ServiceMonitor selector are not supported here")
    ns_selector = spec.get("namespaceSelector") or {}
    sd: dict[str, Any] = {"role": "endpoints", "kubeconfig_file": str(kubeconfig)}
    if not ns_selector.get("any"):
        sd["namespaces"] = {"names": list(ns_selector.get("matchNames") or [ns])}
    out = []
    for index, endpoint in enumerate(spec["endpoints"]):
        if "port" not in endpoint:
            raise PrometheusError(f"ServiceMonitor {name} endpoint {index}: only a named `port` is supported here")
        relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
        for key, value in sorted((spec["selector"].get("matchLabels") or {}).items()):
            label = _meta_label(key)
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": [
                        f"__meta_kubernetes_service_label_{label}",
                        f"__meta_kubernetes_service_labelpresent_{label}",
                    ],
                    "regex": f"({re.escape(value)});true",
                }
            )
        relabel += [
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": endpoint["port"]},
            *(
                {
                    "source_labels": [
                        "__meta_kubernetes_endpoint_address_target_kind",
                        "__meta_kubernetes_endpoint_address_target_name",
                    ],
                    "separator": ";",
                    "regex": f"{kind};(.*)",
                    "replacement": "${1}",
                    "target_label": kind.lower(),
                }
                for kind in ("Node", "Pod")
            ),
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ]
        out.append(_scrape_job(ns, name, index, endpoint, kubernetes_sd_configs=[sd], relabel_configs=relabel))
    return out


def prometheus_config(scrape_configs: list[dict[str, Any]], evaluation_interval: str = "15s") -> dict[str, Any]:
    """prometheus.yml (JSON is YAML) with these scrape jobs and no rules, alerting or remote write."""
    return {"global": {"evaluation_interval": evaluation_interval}, "scrape_configs": scrape_configs}


class Prometheus:
    def __init__(self, directory: Path, config: Mapping[str, Any], port: int | None = None) -> None:
        self.directory = directory
        self.config = config
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "prometheus.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise PrometheusError("prometheus not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> Prometheus:
        binary = bins.ensure_binary("prometheus")
        self.directory.mkdir(parents=True, exist_ok=True)
        config_path = self.directory / "prometheus.yml"
        config_path.write_text(json.dumps(self.config, indent=2) + "\n")
        self.port = self.port or free_port()
        cmd = [
            str(binary),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=info",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                cmd,
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"prometheus not ready within {timeout:.0f} s; log {self.log_path}:\n{self.tail()}"
                )
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise PrometheusError(
                f"prometheus exited with {self.process.returncode}; log {self.log_path}:\n{self.tail()}"
            )
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, params: list[tuple[str, str]] | None = None) -> Any:
        """`data` of a GET on the HTTP API (/api/v1/...); raises PrometheusError with Prometheus's error."""
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result: [{"metric": {...}, "value": [t, "v"]}] for a vector (a scalar is one
        result without labels)."""
        data = self.api("query", [("query", expr)])
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's label_values(match, label) lists."""
        return list(self.api(f"label/{label}/values", [("match[]", match)]))

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def tail(self, lines: int = 30) -> str:
        return _tail(self.log_path, lines)

    def stop(self) -> None:
        if self.process is not None:
            _terminate_group(self.process.pid, 15.0, self.process)
            self.process = None

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
