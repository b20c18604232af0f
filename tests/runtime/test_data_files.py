"""task.dataset.dataFiles, offline: the Japanese samples' source (mteb/amazon_reviews_multi's ja JSONL files)
replaced by our reviews in the same layout (ja/{train,validation}.jsonl with id, text, label = stars - 1,
sorted by label), loaded from the config.json the operator writes for the sample itself."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import HUB_DATASET, ROOT, run_runtime, runtime_env, sample_config, write_hub_layout

from finetune_runtime import data
from finetune_runtime.config import ConfigError, DatasetConfig, JobConfig, TaskConfig
from finetune_runtime.tasks import text_classification

JA_SAMPLES = sorted(p.stem for p in (ROOT / "manifests" / "samples").glob("*bert-ja*.yaml"))
TRAIN_ROWS, ROWS_PER_LABEL = 320, 64  # examples/data/ja-reviews/train.jsonl: 64 reviews per star rating


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hub_layout(tmp_path_factory.mktemp("hub"))


def _task(sample: str, hub: Path, tmp_path: Path) -> TaskConfig:
    cfg = JobConfig.from_dict(sample_config(sample, hub, tmp_path / "config.json").doc)
    assert cfg.task is not None
    return cfg.task


def test_every_japanese_sample_names_the_hub_files() -> None:
    assert len(JA_SAMPLES) >= 3
    for sample in JA_SAMPLES:
        doc = yaml.safe_load((ROOT / "manifests" / "samples" / f"{sample}.yaml").read_text())
        ds = doc["spec"]["task"]["dataset"]
        assert ds["dataFiles"] == {
            "train": f"{HUB_DATASET}ja/train.jsonl",
            "validation": f"{HUB_DATASET}ja/validation.jsonl",
        }, sample
        assert (ds["textColumn"], ds["labelColumn"]) == ("text", "label"), sample
        assert ds["labelMap"] == {"0": 0, "1": 0, "3": 1, "4": 1}, sample


def test_hub_layout_is_sorted_by_label_like_the_hubs(hub: Path) -> None:
    rows = [json.loads(x) for x in (hub / "ja" / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == TRAIN_ROWS and set(rows[0]) == {"id", "text", "label", "label_text"}
    labels = [r["label"] for r in rows]
    assert labels == sorted(labels) and Counter(labels) == {i: ROWS_PER_LABEL for i in range(5)}


@pytest.mark.parametrize("sample", JA_SAMPLES)
def test_sample_recipe_through_data_files(sample: str, hub: Path, tmp_path: Path) -> None:
    """Load, label map and seeded sample exactly as build_classification chains them, from the sample's own
    config: 2 stars (label 2) dropped, and the seeded shuffle gives both classes although the files are sorted."""
    task = _task(sample, hub, tmp_path)
    ds = task.dataset
    assert ds.data_files is not None and ds.name is None and data.data_files_format(ds) == "json"
    raw = data.load_raw(ds, cache_dir=str(tmp_path / "hf"))
    assert sorted(raw) == ["train", "validation"] and len(raw["train"]) == TRAIN_ROWS
    names = text_classification.label_names(task)
    seed = 42
    train, ev = data.train_eval_splits(raw, ds, seed)
    mapped = text_classification.select_classification(train, ds, names)
    three_stars = {t for t, lab in zip(train["text"], train["label"], strict=True) if lab == 2}
    assert len(mapped) == TRAIN_ROWS - ROWS_PER_LABEL and not three_stars & set(mapped["text"])
    assert Counter(mapped["labels"]) == {0: 2 * ROWS_PER_LABEL, 1: 2 * ROWS_PER_LABEL}

    # Fewer rows than a class holds: without the shuffle they would all be negative (the files are sorted).
    n = ROWS_PER_LABEL
    assert set(mapped.select(range(n))["labels"]) == {0}
    picked = data.sample(mapped, n, seed)
    assert len(picked) == n and set(picked["labels"]) == {0, 1}
    assert picked["text"] == data.sample(mapped, n, seed)["text"], "the shuffle is seeded"
    # With the sample's own trainSamples / evalSamples.
    assert set(data.sample(mapped, ds.train_samples, seed)["labels"]) == {0, 1}
    ev_rows = data.sample(text_classification.select_classification(ev, ds, names), ds.eval_samples, seed)
    assert set(ev_rows["labels"]) == {0, 1} and len(ev_rows) <= (ds.eval_samples or len(ev_rows))


def test_format_told_from_names_or_given() -> None:
    def ds(files: dict[str, str], fmt: str | None = None) -> DatasetConfig:
        return DatasetConfig.from_dict({"dataFiles": files, **({"format": fmt} if fmt else {})})

    assert data.data_files_format(ds({"train": "hf://datasets/o/n/ja/train.jsonl.gz"})) == "json"
    assert data.data_files_format(ds({"train": "a/train-*.parquet", "test": "b/t.parquet"})) == "parquet"
    assert data.data_files_format(ds({"train": "s3://b/train.txt"}, "csv")) == "csv"
    for files in ({"train": "t.jsonl", "validation": "v.csv"}, {"train": "t.txt"}):
        with pytest.raises(ConfigError, match=r"task\.dataset\.format"):
            data.data_files_format(ds(files))


def test_compressed_local_files_load(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "train.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write('{"text": "良い", "label": 4}\n{"text": "悪い", "label": 0}\n')
    raw = data.load_raw(
        DatasetConfig.from_dict({"dataFiles": {"train": str(tmp_path / "train.jsonl.gz")}}),
        cache_dir=str(tmp_path / "hf"),
    )
    assert raw["train"]["label"] == [4, 0]


def test_missing_fsspec_protocol_names_the_split(tmp_path: Path) -> None:
    cfg = DatasetConfig.from_dict({"dataFiles": {"train": "nosuchproto://bucket/train.jsonl"}})
    with pytest.raises(ConfigError, match=r"task\.dataset\.dataFiles\.train: nosuchproto://"):
        data.load_raw(cfg, cache_dir=str(tmp_path))
    data._check_protocols({"train": "hf://datasets/mteb/amazon_reviews_multi/ja/train.jsonl"})  # registered


def test_config_needs_exactly_one_source() -> None:
    for bad in ({}, {"name": "squad", "dataFiles": {"train": "t.jsonl"}}, {"path": "p", "dataFiles": {"t": "x"}}):
        with pytest.raises(ConfigError, match=r"task\.dataset needs exactly one"):
            DatasetConfig.from_dict(bad)
    with pytest.raises(ConfigError, match=r"task\.dataset\.format must be one of json, csv, parquet"):
        DatasetConfig.from_dict({"dataFiles": {"train": "t.arrow"}, "format": "arrow"})
    with pytest.raises(ConfigError, match=r"task\.dataset\.dataFiles must map"):
        DatasetConfig.from_dict({"dataFiles": {"train": ["a.jsonl", "b.jsonl"]}})


def test_cache_key_follows_data_files(hub: Path, tmp_path: Path) -> None:
    doc = sample_config(JA_SAMPLES[0], hub, tmp_path / "config.json").doc["task"]
    key = data.cache_key(data.key_inputs(TaskConfig.from_dict(doc), 42))
    assert key.startswith("ja-tiny-bert-ja-128-")
    local = write_hub_layout(tmp_path / "copy") / "ja" / "train.jsonl"
    other = TaskConfig.from_dict({**doc, "dataset": {**doc["dataset"], "dataFiles": {"train": str(local)}}})
    before = data.cache_key(data.key_inputs(other, 42))
    assert before != key
    with local.open("a", encoding="utf-8") as f:
        f.write('{"id": "x", "text": "追加", "label": 4, "label_text": "4"}\n')
    assert data.cache_key(data.key_inputs(other, 42)) != before, "a rewritten local file changes the key"


@pytest.mark.slow
def test_cpu_sample_trains_two_ranks_from_data_files(hub: Path, tmp_path: Path) -> None:
    """manifests/samples/cpu-bert-ja.yaml's config.json, data from the Hub layout, tiny model: 2 ranks, gloo."""
    cfg = (
        sample_config("cpu-bert-ja", hub, tmp_path / "config.json")
        .training(maxSteps=6, logEverySteps=1, batchSizePerDevice=8)
        .write(tmp_path / "config.json")
    )
    run = run_runtime(["launch"], runtime_env(tmp_path, cfg), tmp_path)
    assert run.rc == 0, run.out[-4000:]
    assert "rank 0 of 2 (torchrun)" in run.out
    metrics = json.loads((run.output_dir / "metrics.json").read_text())
    # every 1-2 and 4-5 star review: the sample's trainSamples (4000) is more than our files hold
    assert metrics["trainRows"] == TRAIN_ROWS - ROWS_PER_LABEL
    assert metrics["evalRows"] == 64 and metrics["worldSize"] == 2
    assert run.done["step"] == 6
