"""Property-based: generated jobs across every spec field (tests/support/specgen.py) through what `ftjob render`
runs, admission then the builders. No crash anywhere; every valid job accepted and rendered; every invalid job
rejected with an error naming its field; jobs with boundary values anywhere either rendered or refused, never a
traceback. tests/controlplane/test_validation_cluster.py runs the same jobs through the real API server, where
render's verdict on every boundary job must be the server's."""

from __future__ import annotations

import contextlib
import copy
import io
import subprocess
import sys
import tempfile
from typing import Any

import pytest
import yaml
from ftjobs import make_job
from hypothesis import HealthCheck, example, given, settings
from specgen import MISTAKES, Mistake, boundary_jobs, invalid_jobs, names_field, valid_jobs

from finetune_operator.admission import validate
from finetune_operator.api.formats import parse_quantity
from finetune_operator.api.validation import InvalidSpec
from finetune_operator.builders import SshKeys, desired
from finetune_operator.cli import main

KEYS = SshKeys("k", "k.pub", "h", "h.pub")
# Modest counts keep each property at a few seconds; CI's hypothesis database remembers failures across runs.
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FAST_RENDER = settings(FAST, max_examples=40)  # each example renders every pod


def render(job: dict[str, Any]) -> tuple[int, str, str]:
    """`ftjob render -f job.yaml`, in-process (a subprocess per example would make the suite slow)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(yaml.safe_dump(job))
        f.flush()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["render", "-f", f.name])
    return rc, out.getvalue(), err.getvalue()


@FAST_RENDER
@given(valid_jobs())
def test_valid_jobs_are_accepted_and_render(job: dict[str, Any]) -> None:
    rc, out, err = render(job)
    assert rc == 0 and not err, f"a valid job was rejected:\n{err}\n{yaml.safe_dump(job)}"
    assert sum(d["kind"] == "Pod" for d in yaml.safe_load_all(out) if d) >= job["spec"]["hardware"].get("nodes", 1)
    children = desired(validate(job), ssh_keys=KEYS)
    for pod in children.pods:
        for ctr in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            assert all(isinstance(e.get("value", ""), str) for e in ctr.get("env", []))
            res = ctr.get("resources", {})
            for k, v in res.get("requests", {}).items():  # what the pod's own validation would refuse
                if k in res.get("limits", {}):
                    assert parse_quantity(v) <= parse_quantity(res["limits"][k]), (k, res)


@FAST
@given(invalid_jobs())
def test_invalid_jobs_are_rejected_naming_the_field(case: tuple[dict[str, Any], Mistake]) -> None:
    job, mistake = case
    with pytest.raises(InvalidSpec) as exc:
        validate(job)
    fields = [e.field for e in exc.value.errors]
    assert names_field(mistake.field, fields), f"{mistake.id}: {mistake.field} not in {fields}"
    rc, out, err = render(job)
    assert rc == 1 and out == "" and mistake.field in err, (mistake.id, err)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.id)
def test_every_mistake_is_caught_on_a_plain_job(mistake: Mistake) -> None:
    """Each mistake and each of its examples on a plain job, so a failure names it directly."""
    for value in mistake.examples:
        job = make_job("plain").classification().build()
        mistake.apply(job, copy.deepcopy(value))
        with pytest.raises(InvalidSpec) as exc:
            validate(job)
        assert names_field(mistake.field, [e.field for e in exc.value.errors]), (mistake.id, value, exc.value)


@pytest.mark.parametrize("value", ["2k", "abc", "1.2.3", "-1", "1e999999", "2E"])
def test_render_never_prints_a_traceback_for_cpu_quantities(tmp_path, value: str) -> None:
    job = make_job().classification().set("spec.hardware.resources", {"requests": {"cpu": value}}).build()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    r = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "render", "-f", str(path)], capture_output=True, text=True
    )
    assert "Traceback" not in r.stderr
    if value == "2k":  # a valid quantity: 2000 CPUs
        assert r.returncode == 0 and "OMP_NUM_THREADS" in r.stdout
    else:
        assert r.returncode == 1
        assert (
            "spec.hardware.resources.requests: spec.hardware.resources.requests values must be non-negative "
            "Kubernetes quantities below 1E"
        ) in r.stderr


@settings(FAST, max_examples=300)  # most boundary jobs are refused before any pod is built: cheap
@given(boundary_jobs())
@example(make_job().classification().set("spec.hardware.resources", {"requests": {"cpu": "1\n"}}).build())
@example(make_job().classification().set("spec.hardware.affinity", {"x": float("nan")}).build())
@example(make_job().classification().set("metadata.namespace", 5).build())
def test_boundary_values_anywhere_are_rendered_or_refused_never_a_crash(job: dict[str, Any]) -> None:
    """Numbers at and beyond int64 and the schema's maxima, NaN and infinities, strings with control characters,
    Unicode and trailing newlines at and beyond their lengths, wrong types, metadata included."""
    rc, out, err = render(job)  # in-process: an exception fails the test with its traceback
    assert rc in (0, 1), err
    assert (rc == 0) == (out != "") and (rc == 0) == (err == ""), (rc, err)
    if rc == 1:
        assert err.startswith("error: FineTuneJob"), err
