"""The chart as a dependency of a parent chart (an umbrella chart): Helm hands every subchart the parent's
`global` values, so the values schema must take them; the subchart's own values come from the parent's key
named after it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from chartlib import CHART, find, load_all, one

CHART_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
PARENT_VALUES = {
    "global": {"imageRegistry": "registry.example", "imagePullSecrets": [{"name": "pull"}]},
    "finetune-operator": {"replicaCount": 2, "watchNamespaces": ["ml-team"]},
}


def parent_chart(root: Path) -> Path:
    """A parent chart that depends on this one through file:// (the path relative to the parent, as Helm wants)."""
    parent = root / "platform"
    parent.mkdir()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (parent / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [
                    {
                        "name": chart["name"],
                        "version": chart["version"],
                        "repository": f"file://{os.path.relpath(CHART, parent)}",
                    }
                ],
            }
        )
    )
    (parent / "values.yaml").write_text(yaml.safe_dump(PARENT_VALUES))
    # The parent's own object, reading the global value it shares.
    (parent / "templates").mkdir()
    (parent / "templates" / "settings.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: platform-settings\n"
        "data:\n  registry: {{ .Values.global.imageRegistry | quote }}\n"
    )
    return parent


def helm_run(helm: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=180, env=env)


def test_chart_works_as_a_subchart_with_global_values(helm: str, tmp_path: Path) -> None:
    parent = parent_chart(tmp_path)
    home = tmp_path / "helm"
    built = helm_run(helm, "dependency", "build", str(parent), home=home)
    assert built.returncode == 0, built.stdout + built.stderr
    assert [p.name for p in (parent / "charts").iterdir()] == [f"finetune-operator-{CHART_VERSION}.tgz"]

    lint = helm_run(helm, "lint", "--strict", str(parent), home=home)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = helm_run(helm, "template", "platform", str(parent), "--namespace", "ops", home=home)
    assert rendered.returncode == 0, rendered.stderr
    objs = load_all(rendered.stdout)
    # The subchart's own values reached it: two elected replicas, watching ml-team.
    deployment = one(objs, "Deployment", "platform-finetune-operator", "ops")
    assert deployment["spec"]["replicas"] == 2
    assert "--namespace=ml-team" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert find(objs, "Role", "platform-finetune-operator", "ml-team")
    assert one(objs, "CustomResourceDefinition", "finetunejobs.finetune.dev")
    assert one(objs, "ConfigMap", "platform-settings")["data"] == {"registry": "registry.example"}

    # Its schema still refuses a typo under its own key.
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"finetune-operator": {"replicaCont": 2}}))
    refused = helm_run(helm, "template", "platform", str(parent), "-f", str(bad), home=home)
    assert refused.returncode != 0 and "replicaCont" in refused.stderr, refused.stderr
