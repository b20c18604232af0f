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
    assert spec["runPolicy"] == {
        "backoffLimit": 3,
        "cleanPodPolicy": "Running",
        "suspend": False,
        "nodeLossSeconds": 60,
        "terminationGracePeriodSeconds": 120,
        "drainRestartLimit": 10,
    }
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


# --- issue 23: every number has a maximum the code downstream handles ------------------------------------------


def _integer_nodes(node: dict, path: str, out: list) -> list:
    if node.get("type") in ("integer", "number"):
        out.append((path, node))
    for k, sub in (node.get("properties") or {}).items():
        _integer_nodes(sub, f"{path}.{k}", out)
    for k in ("items", "additionalProperties"):
        if isinstance(node.get(k), dict):
            _integer_nodes(node[k], f"{path}[]" if k == "items" else f"{path}.*", out)
    return out


def test_every_number_of_the_spec_has_a_minimum_and_a_maximum() -> None:
    from finetune_operator.api.schema import SPEC

    nodes = _integer_nodes(SPEC, "spec", [])
    assert len(nodes) > 20
    unbounded = [p for p, n in nodes if "maximum" not in n or "minimum" not in n]
    assert unbounded == []


TOO_BIG = [
    ("spec.runPolicy.activeDeadlineSeconds", 2**31),
    ("spec.runPolicy.ttlSecondsAfterFinished", 2**31),
    ("spec.training.seed", 2**32),
    ("spec.training.maxSteps", 2**31),
    ("spec.training.gradientAccumulationSteps", 2**31),
    ("spec.training.checkpointEverySteps", 2**31),
    ("spec.training.logEverySteps", 2**31),
    ("spec.training.evalEverySteps", 2**31),
    ("spec.task.dataset.trainSamples", 2**31),
    ("spec.task.dataset.evalSamples", 2**31),
]


@pytest.mark.parametrize(("field", "value"), TOO_BIG, ids=[f for f, _ in TOO_BIG])
def test_a_number_past_its_maximum_is_refused_and_the_maximum_itself_accepted(field: str, value: int) -> None:
    with pytest.raises(InvalidSpec) as exc:
        validate(make_job().classification().set(field, value).build())
    assert [e.field for e in exc.value.errors] == [field]
    assert f"must be at most {value - 1}" in str(exc.value)
    validate(make_job().classification().set(field, value - 1).build())


def test_toleration_seconds_are_bounded_both_ways() -> None:
    def tol(seconds: int) -> dict:
        return (
            make_job()
            .classification()
            .set("spec.hardware.tolerations", [{"key": "k", "effect": "NoExecute", "tolerationSeconds": seconds}])
            .build()
        )

    validate(tol(0))
    validate(tol(2**31 - 1))
    for bad in (-1, 2**31):
        with pytest.raises(InvalidSpec, match=r"spec.hardware.tolerations\[0\].tolerationSeconds"):
            validate(tol(bad))


def test_the_seed_maximum_is_what_numpy_accepts() -> None:
    """transformers.set_seed seeds numpy, which refuses 2^32: every rank would die there (issue 23)."""
    import numpy as np

    from finetune_operator.api.schema import MAX_SEED

    np.random.seed(MAX_SEED)
    with pytest.raises(ValueError):
        np.random.seed(MAX_SEED + 1)


def test_reconcile_passes_survive_the_largest_deadline_and_ttl() -> None:
    """The datetime arithmetic of the deadline and TTL phases with the maxima: no OverflowError in a pass."""
    from datetime import datetime, timedelta

    from finetune_operator.reconcile import Observed, iso, reconcile

    now = datetime(2026, 12, 3, 12, 0, 0)
    limit = 2**31 - 1
    running = validate(make_job("j", "ns").classification().run_policy(activeDeadlineSeconds=limit).build())
    running["metadata"]["uid"] = "u"
    running["status"] = {"phase": "Running", "startTime": iso(now - timedelta(seconds=5))}
    plan = reconcile(running, Observed([], {}, now))
    assert plan.status["phase"] != "Failed" and plan.requeue_after is not None
    finished = validate(make_job("j", "ns").classification().run_policy(ttlSecondsAfterFinished=limit).build())
    finished["metadata"]["uid"] = "u"
    finished["status"] = {"phase": "Succeeded", "completionTime": iso(now)}
    plan = reconcile(finished, Observed([], {}, now))
    assert not plan.delete_job and plan.requeue_after == pytest.approx(limit)


# --- issue 23: what the runtime would refuse is refused at admission ------------------------------------------


@pytest.mark.parametrize("url", ["s3:///x", "s3://", "s3://bucket name/x", "s3://b\n", "s3://b?x/y"])
def test_an_s3_url_without_a_bucket_boto3_accepts_is_refused(url: str) -> None:
    with pytest.raises(InvalidSpec) as exc:
        validate(make_job().classification().set("spec.output", {"url": url}).build())
    assert [e.field for e in exc.value.errors] == ["spec.output.url"]
    assert "s3://<bucket>/<prefix>" in str(exc.value)
    cache = make_job().profile("trn1").classification().cache(url=url).build()
    with pytest.raises(InvalidSpec, match=r"spec.compileCache.url"):
        validate(cache)


@pytest.mark.parametrize("url", ["s3://b", "s3://b/", "s3://my.bucket_1/a/b c/ü"])
def test_s3_urls_the_runtime_takes_are_accepted(url: str) -> None:
    validate(make_job().classification().set("spec.output", {"url": url}).build())


def test_the_runtime_s3_parser_and_the_schema_agree_on_the_bucket() -> None:
    from finetune_operator.api import formats
    from finetune_runtime.s3sync import S3Url

    for url in ("s3:///x", "s3://", "s3://b", "s3://b/p/q"):
        try:
            S3Url.parse(url)
            runtime_ok = True
        except ValueError:
            runtime_ok = False
        assert formats.matches(formats.S3_URL, url) == runtime_ok, url


def test_text_classification_needs_labels_or_a_label_map() -> None:
    job = make_job().classification().build()
    del job["spec"]["task"]["labels"]
    validate(job)  # the labelMap gives the ids
    del job["spec"]["task"]["dataset"]["labelMap"]
    with pytest.raises(InvalidSpec) as exc:
        validate(job)
    assert [e.field for e in exc.value.errors] == ["spec.task.labels"]
    job["spec"]["task"]["labels"] = []
    with pytest.raises(InvalidSpec, match=r"spec.task.labels"):
        validate(job)


def test_question_answering_stride_must_leave_room_for_the_question() -> None:
    """The tokenizer refuses a stride >= the window, but only after the dataset was loaded: admission refuses
    docStride of half maxLength or more. The defaults themselves pass (docStride 32, maxLength 128)."""
    validate(make_job().qa().build())
    with pytest.raises(InvalidSpec) as exc:
        validate(make_job().qa().set("spec.task.docStride", 64).build())
    assert [e.field for e in exc.value.errors] == ["spec.task.docStride"]
    with pytest.raises(InvalidSpec, match=r"spec.task.docStride"):
        validate(make_job().qa().set("spec.task.docStride", 128).set("spec.task.maxLength", 256).build())
    validate(make_job().qa().set("spec.task.docStride", 128).set("spec.task.maxLength", 384).build())


def test_node_loss_must_end_before_a_toleration_of_the_lost_node_taints() -> None:
    """A toleration of the unreachable/not-ready taints that ends first evicts the pods before the operator replaces
    them; any other toleration, or one without seconds (tolerated for ever), is no obstacle."""

    def job(seconds: int | None, key: str = "node.kubernetes.io/unreachable") -> dict[str, object]:
        tol = {"key": key, "operator": "Exists", "effect": "NoExecute"}
        if seconds is not None:
            tol["tolerationSeconds"] = seconds
        return (
            make_job()
            .classification()
            .set("spec.runPolicy.nodeLossSeconds", 60)
            .set("spec.hardware.tolerations", [tol])
            .build()
        )

    validate(job(61))
    validate(job(None))
    validate(job(10, key="example.com/other"))
    for seconds, key in ((60, "node.kubernetes.io/unreachable"), (0, "node.kubernetes.io/not-ready")):
        with pytest.raises(InvalidSpec) as exc:
            validate(job(seconds, key))
        assert [e.field for e in exc.value.errors] == ["spec.runPolicy.nodeLossSeconds"]


@pytest.mark.parametrize("source", ["name", "path"])
def test_an_empty_dataset_source_is_refused(source: str) -> None:
    """The runtime takes an empty name or path for no source at all."""
    job = make_job().classification().build()
    job["spec"]["task"]["dataset"].pop("path")
    job["spec"]["task"]["dataset"][source] = ""
    with pytest.raises(InvalidSpec, match=f"spec.task.dataset.{source}: must have at least 1"):
        validate(job)


# --- issue 23: patterns mean what RE2 means, render reads what the API server reads ---------------------------


def test_python_dollar_differs_from_re2_and_re2_search_means_re2() -> None:
    import re

    from finetune_operator.api.formats import re2_search

    assert re.search("^a$", "a\n") is not None  # Python: `$` also before a trailing newline
    assert not re2_search("^a$", "a\n")  # RE2 (CEL matches(), OpenAPI pattern): the end of the text only
    assert re2_search("^a$", "a") and re2_search("a", "xax")  # unanchored search, as the API server does
    assert not re2_search("^[$]$", "$\n") and re2_search("^[$]$", "$")  # `$` in a class is a character
    with pytest.raises(ValueError):
        re2_search(r"^\s$", " ")  # classes that mean something else in Python are not used


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("spec.image", "registry/x:1\n"),
        ("spec.image", "registry/x:1\u00a0"),
        ("spec.image", "a\vb"),
        ("spec.serviceAccountName", "trainer\n"),
        ("spec.hardware.schedulerName", "sched\n"),
        ("spec.runPolicy.queueName", "q\n"),
        ("spec.output.claimName", "results\n"),
        ("metadata.name", "job\n"),
    ],
)
def test_a_trailing_newline_or_unicode_space_is_refused_as_the_api_server_does(field: str, value: str) -> None:
    with pytest.raises(InvalidSpec) as exc:
        validate(make_job().classification().set(field, value).build())
    assert field in [e.field for e in exc.value.errors]


def test_cross_field_patterns_use_re2_semantics() -> None:
    files = make_job().classification().data_files(train="t.jsonl", **{"validation\n": "v.jsonl"}).build()
    with pytest.raises(InvalidSpec, match=r"spec.task.dataset.dataFiles"):
        validate(files)
    fmt = make_job().classification().data_files(train="t.jsonl\n").build()
    with pytest.raises(InvalidSpec, match=r"spec.task.dataset.format"):
        validate(fmt)
    field = [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']\n"}}}]
    with pytest.raises(InvalidSpec, match=r"spec.env"):
        validate(make_job().classification().set("spec.env", field).build())


def _render(tmp_path, job_text: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.yaml"
    path.write_text(job_text)
    return subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", "render", "-f", str(path), *args],
        capture_output=True,
        text=True,
    )


def test_a_quantity_with_a_trailing_newline_is_refused_without_a_traceback(tmp_path) -> None:
    """parse_quantity matched with Python's `$` and then failed its own assertion: a traceback from render."""
    job = make_job().classification().set("spec.hardware.resources", {"requests": {"cpu": "1\n"}}).build()
    r = _render(tmp_path, yaml.safe_dump(job))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "spec.hardware.resources.requests" in r.stderr


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("where", ["spec.training.epochs", "spec.hardware.affinity.weight", "status.x"])
def test_non_finite_numbers_are_refused_anywhere(tmp_path, value: str, where: str) -> None:
    """NaN passed every bound check (NaN > max is false); JSON has no NaN, so kubectl and the server refuse it."""
    job = make_job().classification().set(where, 0.5).build()
    text = yaml.safe_dump(job).replace("0.5", value)
    r = _render(tmp_path, text)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{where}: " in r.stderr and "JSON" in r.stderr


def test_nulls_are_dropped_as_the_api_server_drops_them() -> None:
    job = make_job().classification().set("spec.hardware.nodes", None).set("spec.runPolicy", None).build()
    job["spec"]["hardware"]["nodeSelector"] = {"a": None}
    out = validate(job)
    assert out["spec"]["hardware"]["nodes"] == 1 and out["spec"]["hardware"]["nodeSelector"] == {}
    assert out["spec"]["runPolicy"]["backoffLimit"] == 3
    with pytest.raises(InvalidSpec, match=r"spec.hardware.tolerations\[0\]"):
        validate(make_job().classification().set("spec.hardware.tolerations", [None]).build())
    unknown = make_job().classification().set("spec.envFrom", [{"configMapRef": {"name": "c"}, "k": None}]).build()
    with pytest.raises(InvalidSpec, match=r"spec.envFrom\[0\].k: unknown field"):
        validate(unknown)


@pytest.mark.parametrize("value", [2.0, 1.0])
def test_a_whole_float_in_an_integer_field_is_refused(value: float) -> None:
    """The server takes 2.0 for an integer unless a CEL rule reads it; the CRD adds a rule on every integer so
    that it refuses it everywhere, as render does."""
    from finetune_operator.crd import WHOLE_NUMBER, crd

    with pytest.raises(InvalidSpec, match=r"spec.hardware.nodes: must be of type integer"):
        validate(make_job().classification().set("spec.hardware.nodes", value).build())
    hw = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["hardware"]
    assert WHOLE_NUMBER in hw["properties"]["nodes"]["x-kubernetes-validations"]


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ({"labels": {"app": 1}}, "metadata.labels"),
        ({"labels": {"bad key": "v"}}, "metadata.labels"),
        ({"labels": {"app": "bad value"}}, "metadata.labels.app"),
        ({"annotations": {"note": 1}}, "metadata.annotations"),
        ({"annotations": {"bad key": "v"}}, "metadata.annotations"),
        ({"annotations": {"big": "v" * 262144}}, "metadata.annotations"),
        ({"namespace": "Bad_NS"}, "metadata.namespace"),
        ({"namespace": 5}, "metadata.namespace"),
        ({"finalizers": ["bad finalizer"]}, "metadata.finalizers[0]"),
        ({"creationTimestamp": "yesterday"}, "metadata.creationTimestamp"),
        ({"generation": 1.5}, "metadata.generation"),
        ({"unknownField": "x"}, "metadata.unknownField"),
        ({"labels": {"kueue.x-k8s.io/queue-name": "team-a"}}, "metadata.labels"),
    ],
)
def test_metadata_is_checked_as_the_api_server_checks_it(meta: dict, field: str) -> None:
    job = make_job().classification().build()
    job["metadata"].update(meta)
    with pytest.raises(InvalidSpec) as exc:
        validate(job)
    assert field in [e.field for e in exc.value.errors], exc.value


def test_metadata_the_api_server_takes_is_accepted() -> None:
    job = make_job().classification().build()
    job["metadata"].update(
        labels={"app": "x", "empty": "", "none": None},
        annotations={"Upper/Key": "any text\n"},
        finalizers=["example.com/done"],
        generation=1.0,
        creationTimestamp="2026-01-02T03:04:05.5+01:00",
        uid="u",
    )
    validate(job)


def test_the_kueue_queue_label_is_refused_naming_the_queue_name_field() -> None:
    job = make_job().classification().build()
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    with pytest.raises(InvalidSpec) as exc:
        validate(job)
    assert "spec.runPolicy.queueName" in str(exc.value)


def test_render_refuses_a_namespace_other_than_its_own(tmp_path) -> None:
    job = make_job("j", "team-a").classification().build()
    assert _render(tmp_path, yaml.safe_dump(job), "-n", "team-a").returncode == 0
    r = _render(tmp_path, yaml.safe_dump(job), "-n", "team-b")
    assert r.returncode == 1 and "metadata.namespace" in r.stderr and r.stdout == ""


def test_render_reads_unquoted_number_keys_as_kubectl_does(tmp_path) -> None:
    job = make_job().classification().build()
    text = yaml.safe_dump(job).replace("'1': 0", "1: 0").replace("'2': 0", "2: 0")
    assert "1: 0" in text
    assert _render(tmp_path, text).returncode == 0
    r = _render(tmp_path, text.replace("1: 0", "1.5: 0"))
    assert r.returncode != 0 and "Traceback" not in r.stderr and "quote it" in r.stderr


# --- issue 23: device visibility, envFrom prefixes, device limits ------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", ["NVIDIA_VISIBLE_DEVICES", "NEURON_RT_VISIBLE_CORES", "CUDA_VISIBLE_DEVICES"])
def test_device_visibility_variables_are_reserved_on_every_profile(profile: str, name: str) -> None:
    job = make_job().profile(profile).classification().set("spec.env", [{"name": name, "value": "all"}]).build()
    with pytest.raises(InvalidSpec, match="device-visibility") as exc:
        validate(job)
    assert [e.field for e in exc.value.errors] == ["spec.env"]


@pytest.mark.parametrize("prefix", ["FTJOB_", "FTJOB_X", "F", "NVIDIA_", "CUDA_", "NEURON_RT_", "OMP_", "HOM"])
def test_an_env_from_prefix_that_could_make_a_reserved_name_is_refused(prefix: str) -> None:
    env_from = [{"configMapRef": {"name": "c"}, "prefix": prefix}]
    with pytest.raises(InvalidSpec) as exc:
        validate(make_job().classification().set("spec.envFrom", env_from).build())
    assert [e.field for e in exc.value.errors] == ["spec.envFrom"]


@pytest.mark.parametrize("prefix", ["APP_", "S_", "MY_FTJOB_"])
def test_other_env_from_prefixes_are_accepted(prefix: str) -> None:
    env_from = [{"secretRef": {"name": "s"}, "prefix": prefix}]
    validate(make_job().classification().set("spec.envFrom", env_from).build())


@pytest.mark.parametrize(
    ("profile", "procs", "limits", "fits"),
    [
        ("nvidia", 1, {"nvidia.com/gpu": 8}, "nvidia.com/gpu: 1"),
        ("nvidia", 4, {"nvidia.com/gpu": "1"}, "nvidia.com/gpu: 4"),
        ("trn1", 32, {"aws.amazon.com/neuron": 8}, "aws.amazon.com/neuron: 16"),
        ("trn1", 1, {"aws.amazon.com/neuron": 1}, "aws.amazon.com/neuroncore: 1"),
        ("trn1", 2, {"aws.amazon.com/neuroncore": 2}, "aws.amazon.com/neuron: 1"),
    ],
)
def test_device_limits_that_disagree_with_the_processes_are_refused_naming_what_fits(
    profile: str, procs: int, limits: dict, fits: str
) -> None:
    job = make_job().profile(profile).procs(procs).classification().set("spec.hardware.resources", {"limits": limits})
    with pytest.raises(InvalidSpec) as exc:
        validate(job.build())
    assert [e.field for e in exc.value.errors] == ["spec.hardware.resources.limits"]
    assert fits in str(exc.value)


@pytest.mark.parametrize(
    ("profile", "procs", "limits"),
    [
        ("nvidia", 2, {"nvidia.com/gpu": 2}),
        ("nvidia", None, {"nvidia.com/gpu": "1"}),
        ("trn1", 32, {"aws.amazon.com/neuron": "16"}),
        ("trn1", 1, {"aws.amazon.com/neuroncore": 1}),
        ("cpu", None, {"nvidia.com/gpu": 1}),  # no device of its own: the request is the user's, and counted
    ],
)
def test_device_limits_that_match_the_processes_are_accepted(profile: str, procs: int | None, limits: dict) -> None:
    job = make_job().profile(profile).classification().set("spec.hardware.resources", {"limits": limits})
    if procs:
        job.procs(procs)
    validate(job.build())


def test_output_path_may_not_reach_into_the_cache_folder() -> None:
    job = make_job().classification().set("spec.output", {"claimName": "shared", "path": ".finetune-cache/x"})
    with pytest.raises(InvalidSpec, match=r"spec.output.path"):
        validate(job.build())


# --- issue 26: the software stack is a profile choice ----------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "stack", "offers"),
    [("trn1", "native", "xla"), ("cpu", "ipex", "upstream"), ("xeon-amx", "xla", "upstream, ipex")],
)
def test_a_stack_the_profile_lacks_is_refused_naming_the_field_and_its_stacks(
    profile: str, stack: str, offers: str
) -> None:
    job = make_job().profile(profile).classification().set("spec.hardware.stack", stack).build()
    with pytest.raises(InvalidSpec) as exc:
        validate(job)
    (error,) = exc.value.errors
    assert error.field == "spec.hardware.stack"
    assert f"{profile} offers {offers}, not {stack!r}" in error.message
    assert "trn2: xla (default), native" in error.message  # every profile's choices, the default marked


@pytest.mark.parametrize(
    ("profile", "stack"),
    [("trn1", "xla"), ("trn2", "xla"), ("trn2", "native"), ("xeon-amx", "upstream"), ("xeon-amx", "ipex")],
)
def test_each_offered_stack_is_accepted_and_kept(profile: str, stack: str) -> None:
    job = validate(make_job().profile(profile).classification().set("spec.hardware.stack", stack).build())
    assert job["spec"]["hardware"]["stack"] == stack


def test_no_stack_means_the_profiles_default_and_nothing_is_written_into_the_spec() -> None:
    job = validate(make_job().profile("xeon-amx").classification().build())
    assert "stack" not in job["spec"]["hardware"]  # the default is the profile's data, not a schema default


def test_the_cache_url_follows_the_stack_not_the_profile() -> None:
    validate(make_job().profile("trn2").classification().cache(url="s3://b/c").build())  # default stack: xla
    validate(make_job().profile("trn2").classification().set("spec.hardware.stack", "xla").cache(url="/c").build())
    with pytest.raises(InvalidSpec) as exc:
        validate(
            make_job().profile("trn2").classification().set("spec.hardware.stack", "native").cache(url="/c").build()
        )
    assert [e.field for e in exc.value.errors] == ["spec.compileCache.url"]
    assert "trn1/xla, trn2/xla" in str(exc.value) and "spec.compileCache.claimName" in str(exc.value)


def test_the_stack_rule_has_a_cel_twin_listing_each_profiles_stacks() -> None:
    from finetune_operator import profiles

    rule = next(r for r in profiles.profile_rules() if r.id == "stack-offered")
    for p in profiles.load_all().values():
        assert f"'{p.name}': [{', '.join(repr(s) for s in p.stacks)}]" in rule.cel
