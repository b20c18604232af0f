"""The chart README's one command that lets a Helm release adopt the FineTuneJob CRD (a CRD the previous chart
installed from crds/, or one `helm uninstall` kept), read from the README itself so that the tests run what the
README shows: tests/chart (the upgrade and reinstall against a real API server) and tests/e2e/test_upgrade.py. And
`differs`, which tells whether the CRD the API server holds is the one a chart renders."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

CRD_NAME = "finetunejobs.finetune.dev"
CHART_README = Path(__file__).resolve().parents[2] / "charts" / "finetune-operator" / "README.md"
# The README's command that gives an existing CRD the ownership metadata Helm needs to adopt it into a release.
ADOPT = re.compile(r"^kubectl patch crd finetunejobs\.finetune\.dev --type merge -p '(?P<patch>.+)'$", re.M)
# What Helm says when a rendered object exists without the release's ownership metadata.
NOT_ADOPTABLE = "invalid ownership metadata"


def adoption_patch(release: str, namespace: str, readme: Path = CHART_README) -> dict[str, Any]:
    """The patch of the chart README's adoption command, for this release name and namespace (the README's
    command names the default release, finetune-operator in finetune-operator)."""
    found = ADOPT.findall(readme.read_text())
    assert len(found) == 1, f"the chart README must show the adoption command once, found {found}"
    patch: dict[str, Any] = json.loads(found[0])
    annotations = patch["metadata"]["annotations"]
    assert annotations == {
        "meta.helm.sh/release-name": "finetune-operator",
        "meta.helm.sh/release-namespace": "finetune-operator",
    }
    annotations.update({"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace})
    return patch


def adoption_command(release: str, namespace: str) -> list[str]:
    """kubectl's arguments for the README's command, for this release name and namespace."""
    return ["patch", "crd", CRD_NAME, "--type", "merge", "-p", json.dumps(adoption_patch(release, namespace))]


def differs(want: Any, have: Any, path: str = "") -> str | None:
    """Where `have` lacks something of `want`, or None (the API server adds defaults: more is no difference)."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return path or "."
        for key, value in want.items():
            found = differs(value, have[key], f"{path}.{key}") if key in have else f"{path}.{key} (missing)"
            if found:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(have, list) or len(want) != len(have):
            return path
        return next(
            (d for i, (a, b) in enumerate(zip(want, have, strict=True)) if (d := differs(a, b, f"{path}[{i}]"))), None
        )
    return None if want == have else f"{path}: {want!r} != {have!r}"
