"""The CRD copies in the chart and in manifests/ are exactly what `ftjob crd` prints, and the admission policy's
what `ftjob admission-policy` prints (`make generate`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from chartlib import CHART, MANIFESTS, load_all

COPIES = [CHART / "crd" / "finetunejobs.yaml", MANIFESTS / "crd" / "finetunejobs.yaml"]
POLICY_COPIES = [CHART / "admission" / "finetunejobs-policy.yaml", MANIFESTS / "crd" / "finetunejobs-policy.yaml"]


def _ftjob(command: str) -> str:
    # The console script installed next to this interpreter by `make setup`.
    ftjob = Path(sys.executable).with_name("ftjob")
    out = subprocess.run([str(ftjob), command], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def generated() -> str:
    return _ftjob("crd")


@pytest.mark.parametrize("copy", POLICY_COPIES, ids=lambda p: str(p.relative_to(CHART.parents[1])))
def test_admission_policy_copy_matches_ftjob_admission_policy(copy: Path) -> None:
    assert copy.exists(), f"{copy} is missing: run `make generate`"
    assert copy.read_text() == _ftjob("admission-policy"), f"{copy} drifted: run `make generate`"


@pytest.mark.parametrize("copy", COPIES, ids=lambda p: str(p.relative_to(CHART.parents[1])))
def test_crd_copy_matches_ftjob_crd(generated: str, copy: Path) -> None:
    assert copy.exists(), f"{copy} is missing: run `make generate`"
    assert copy.read_text() == generated, f"{copy} drifted from `ftjob crd`: run `make generate`"


def test_generated_crd_is_the_finetunejob_crd(generated: str) -> None:
    (crd,) = load_all(generated)
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "finetunejobs.finetune.dev"
    assert crd["spec"]["names"]["shortNames"] == ["ftj"]  # docs/eks.md and NOTES use `kubectl get ftj`
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert "status" in version["subresources"]  # the RBAC grants finetunejobs/status
