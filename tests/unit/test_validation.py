"""Admission rules as `ftjob render` applies them: every bad spec is rejected naming its field."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from ftjobs import BAD_SPECS, SAMPLES, BadSpec, bad_job, make_job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finetune_operator.admission import validate
from finetune_operator.api.schema import PROFILES
from finetune_operator.api.validation import InvalidSpec


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_bad_spec_rejected_naming_field(case: BadSpec) -> None:
    with pytest.raises(InvalidSpec) as exc:
        validate(bad_job(case))
    fields = [e.field for e in exc.value.errors]
    assert case.field in fields, f"{case.id}: expected an error on {case.field}, got {exc.value}"


def test_at_least_a_dozen_kinds_of_bad_spec() -> None:
    assert len({c.field for c in BAD_SPECS}) >= 12


def test_render_cli_exits_nonzero_with_field_and_fix(tmp_path) -> None:
    job = bad_job(next(c for c in BAD_SPECS if c.id == "trn1-unplaceable-devices"))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    r = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "render", "-f", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 1
    assert "spec.hardware.procsPerNode" in r.stderr
    assert "set spec.hardware.procsPerNode to 1, 2, 8, 16 or 32" in r.stderr
    assert r.stdout == ""


def test_unknown_field_suggests_the_right_one() -> None:
    job = make_job().classification().set("spec.hardware.procPerNode", 2).build()
    with pytest.raises(InvalidSpec, match="did you mean procsPerNode"):
        validate(job)


def test_enum_typo_suggests_value() -> None:
    job = make_job().classification().profile("xeon_amx").build()
    with pytest.raises(InvalidSpec, match="did you mean xeon-amx"):
        validate(job)


def test_every_error_reported_at_once() -> None:
    job = make_job().classification().training(precision="fp8", learningRate=-1).build()
    with pytest.raises(InvalidSpec) as exc:
        validate(job)
    assert {"spec.training.precision", "spec.training.learningRate"} <= {e.field for e in exc.value.errors}


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_samples_are_valid(sample) -> None:
    validate(yaml.safe_load(sample.read_text()))


def test_defaults_applied_like_the_api_server() -> None:
    job = validate(make_job().classification().build())
    spec = job["spec"]
    assert spec["hardware"]["nodes"] == 1
    assert spec["task"]["maxLength"] == 128
    assert spec["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "Running", "suspend": False}
    assert spec["task"]["dataset"]["trainSplit"] == "train"
    assert "training" not in spec  # object defaults only apply when the parent object is given
    assert "launcher" not in spec  # derived from the profile, never defaulted into the stored object


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    profile=st.sampled_from(PROFILES),
    nodes=st.integers(min_value=-2, max_value=40),
    procs=st.one_of(st.none(), st.integers(min_value=-1, max_value=300)),
    precision=st.sampled_from(["fp32", "bf16", "fp16"]),
)
def test_validation_is_total_and_consistent_with_render(profile, nodes, procs, precision) -> None:
    """Any spec either validates and renders, or raises InvalidSpec naming a spec field: never a crash."""
    from finetune_operator.builders import desired
    from finetune_operator.sshkeys import generate_keys

    b = make_job().profile(profile).nodes(nodes).classification().training(precision=precision)
    if procs is not None:
        b.procs(procs)
    try:
        job = validate(b.build())
    except InvalidSpec as e:
        assert all(err.field.startswith(("spec.", "metadata.")) for err in e.errors)
        return
    children = desired(job, ssh_keys=generate_keys("job"))
    assert len(children.pods) >= children.layout.nodes
    assert children.layout.procs_per_node >= 1


@pytest.mark.parametrize(
    "files",
    [
        {},  # the Hub's ja JSONL files, as the samples name them
        {"train": "data/ja/train.jsonl.gz"},
        {"train": "hf://datasets/o/n@main/data/train-*.parquet", "test": "hf://datasets/o/n@main/data/test-*.parquet"},
        {"train": "/data/train.csv", "validation.small": "/data/validation.csv"},
    ],
)
def test_data_files_accepted(files: dict[str, str]) -> None:
    job = validate(make_job().classification().data_files(**files).build())
    ds = job["spec"]["task"]["dataset"]
    assert "path" not in ds and ds["dataFiles"] and ds["trainSplit"] == "train"


def test_data_files_with_explicit_format_need_no_extension() -> None:
    validate(make_job().classification().data_files("csv", train="s3://bucket/reviews/train").build())


def test_render_rejects_bad_data_files_naming_the_field(tmp_path) -> None:
    job = make_job().classification().data_files(validation="v.jsonl").build()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    r = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "render", "-f", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 1 and r.stdout == ""
    assert "spec.task.dataset.dataFiles: spec.task.dataset.dataFiles must have an entry for the train split" in r.stderr


def test_readme_example_job_is_valid_and_reads_data_files() -> None:
    """The README's FineTuneJob is what users copy first: it must pass admission and name a source that loads."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    jobs = [
        d
        for block in re.findall(r"^```yaml\n(.*?)^```$", readme, re.M | re.S)
        for d in yaml.safe_load_all(block)
        if isinstance(d, dict) and d.get("kind") == "FineTuneJob"
    ]
    assert jobs, "README.md has no FineTuneJob example"
    for job in jobs:
        ds = validate(job)["spec"]["task"]["dataset"]
        assert ds["dataFiles"]["train"].startswith("hf://datasets/mteb/amazon_reviews_multi/ja/")


def test_reserved_env_is_derived_from_what_the_builders_set() -> None:
    from finetune_operator.builders.reserved_env import reserved_env

    table = reserved_env()
    assert "LD_PRELOAD" in table["xeon-amx"] and "LD_PRELOAD" not in table["cpu"]  # tcmalloc: xeon profile only
    assert "OMP_NUM_THREADS" in table["cpu"] and "MASTER_ADDR" in table["cpu"]
    assert "NEURON_RT_ROOT_COMM_ID" in table["trn1"]
    for profile in ("cpu", "xeon-amx"):
        job = make_job().profile(profile).classification().set("spec.env", [{"name": "LD_PRELOAD", "value": "x"}])
        if profile == "cpu":
            validate(job.build())  # nothing sets LD_PRELOAD on cpu: the user's own is fine
        else:
            with pytest.raises(InvalidSpec, match="may not set variables the operator sets: FTJOB_"):
                validate(job.build())


def test_hf_token_is_reserved_only_with_hf_token_secret_ref() -> None:
    token = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    validate(make_job().classification().set("spec.env", token).build())
    with pytest.raises(InvalidSpec) as exc:
        validate(
            make_job().classification().set("spec.env", token).set("spec.hfTokenSecretRef", {"name": "hf"}).build()
        )
    assert [e.field for e in exc.value.errors] == ["spec.env"]


def test_every_ftjob_variable_is_reserved_even_one_not_set_yet() -> None:
    with pytest.raises(InvalidSpec, match="FTJOB_"):
        validate(make_job().classification().set("spec.env", [{"name": "FTJOB_FUTURE", "value": "1"}]).build())


def test_render_reports_unreadable_input_without_a_traceback(tmp_path) -> None:
    for text, expect in (
        ("a: [", "is not valid YAML"),
        ("metadata: x\nspec: {}\n", "metadata: must be of type object"),
        ("- 1\n- 2\n", "every document must be a FineTuneJob mapping"),
    ):
        path = tmp_path / "job.yaml"
        path.write_text(text)
        r = subprocess.run(
            [sys.executable, "-m", "finetune_operator.cli", "render", "-f", str(path)], capture_output=True, text=True
        )
        assert r.returncode == 1 and "Traceback" not in r.stderr and expect in r.stderr, r.stderr
