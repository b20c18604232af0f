"""The chart's Grafana dashboards (charts/finetune-operator/dashboards/*.json) and their queries, for the tests
that check them: tests/chart/test_dashboard.py (every query names only metrics and labels the operator exports)
and tests/controlplane/test_dashboard_queries.py (a real Prometheus evaluates every query)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "charts" / "finetune-operator" / "dashboards"
# Grafana's variable syntaxes: $name, ${name}, ${name:format}, [[name]].
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


@dataclass(frozen=True)
class Query:
    where: str  # "panel 'Progress' target A", "variable namespace"
    expr: str  # PromQL; for a query variable, the selector of its label_values(selector, label)
    label: str | None = None  # the label a query variable lists; None for a panel target


def dashboards() -> dict[str, dict[str, Any]]:
    """Every shipped dashboard by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def queries(dashboard: dict[str, Any]) -> Iterator[Query]:
    """Every panel target (nested rows included) and every query variable (`label_values(selector, label)`)."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels") or [])

    for p in panels(dashboard["panels"]):
        for t in p.get("targets") or []:
            yield Query(f"panel {p['title']!r} target {t['refId']}", t["expr"])
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
        if m is None:
            raise ValueError(f"variable {var['name']}: expected label_values(selector, label), got {q!r}")
        yield Query(f"variable {var['name']}", m.group(1), m.group(2))


def variables(expr: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(expr)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """The expression with every Grafana variable replaced, as Grafana sends it to Prometheus; a variable without
    a value raises KeyError naming it (nothing is left for Prometheus to reject or, worse, accept)."""
    return _VARIABLE.sub(lambda m: values[next(g for g in m.groups() if g)], expr)
