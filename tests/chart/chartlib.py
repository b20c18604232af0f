"""Helpers for the chart tier: pinned binaries, a values builder, a renderer that returns parsed objects.

Binaries come from `tools/cluster/bin/ftjob-tool` (pinned versions, fetched on first use), never from PATH,
so a developer's own helm cannot change what the tests check.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yaml12 import load_all_documents

from ftjob_cluster import bins

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "finetune-operator"
MANIFESTS = REPO / "manifests"
FTJOB_TOOL = REPO / "tools" / "cluster" / "bin" / "ftjob-tool"
# The release name and namespace the kustomize manifests mirror (manifests/kustomization.yaml).
RELEASE = "finetune-operator"
NAMESPACE = "finetune-operator"

Manifest = dict[str, Any]


def pinned_binary(name: str) -> str:
    """Path of a pinned tool; ftjob-tool prints it on stdout (progress goes to stderr)."""
    out = subprocess.run([str(FTJOB_TOOL), name], check=True, capture_output=True, text=True, timeout=900)
    return out.stdout.strip().splitlines()[-1]


def pinned_k8s_version() -> str:
    """The Kubernetes release the repository pins (tools/cluster builds the control plane at it)."""
    return str(bins.K8S_VERSION)


def load_all(text: str) -> list[Manifest]:
    return load_all_documents(text)


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep merge, as Helm merges a values file over values.yaml (maps merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Values:
    """Fluent builder for chart values, so tests say what they change instead of pasting YAML."""

    data: dict[str, Any] = field(default_factory=dict)

    def set(self, override: dict[str, Any]) -> Values:
        return Values(merge(self.data, override))

    def namespaced(self, *namespaces: str) -> Values:
        return self.set({"watchNamespaces": list(namespaces)})

    def cache_pvc(self, **fields: Any) -> Values:
        return self.set({"cachePVC": {"create": True, **fields}})

    def service_monitor(self, **fields: Any) -> Values:
        return self.set({"metrics": {"serviceMonitor": {"enabled": True, **fields}}})

    def grafana_dashboard(self, **fields: Any) -> Values:
        return self.set({"grafanaDashboard": {"enabled": True, **fields}})

    def network_policy(self, **fields: Any) -> Values:
        return self.set({"networkPolicy": {"enabled": True, **fields}})


@dataclass(frozen=True)
class HelmResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def objects(self) -> list[Manifest]:
        assert self.returncode == 0, self.stderr
        return load_all(self.stdout)


class Renderer:
    """Runs `helm template` on the chart with a values file written from a Values builder."""

    def __init__(self, helm: str, tmp: Path) -> None:
        self.helm = helm
        self.tmp = tmp
        self.count = 0

    def run(self, values: Values | None = None, namespace: str = NAMESPACE, extra: Iterable[str] = ()) -> HelmResult:
        self.count += 1
        vfile = self.tmp / f"values-{self.count}.yaml"
        vfile.write_text(json.dumps((values or Values()).data))  # JSON is YAML; no quoting surprises
        cmd = [self.helm, "template", RELEASE, str(CHART), "--namespace", namespace, "-f", str(vfile), *extra]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return HelmResult(out.returncode, out.stdout, out.stderr)

    def __call__(self, values: Values | None = None, namespace: str = NAMESPACE) -> list[Manifest]:
        return self.run(values, namespace).objects


def find(objs: list[Manifest], kind: str, name: str | None = None, namespace: str | None = None) -> list[Manifest]:
    return [
        o
        for o in objs
        if o["kind"] == kind
        and (name is None or o["metadata"]["name"] == name)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]


def one(objs: list[Manifest], kind: str, name: str | None = None, namespace: str | None = None) -> Manifest:
    found = find(objs, kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {name or ''} in {namespace or 'any namespace'}, got {found}"
    return found[0]


def identities(objs: list[Manifest]) -> list[tuple[str, str, str]]:
    return sorted((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs)
