"""The data `ftjob estimate` stands on: the profiles' peaks (validated by the profile loader), the price table and
the calibration records, checked against the files they were taken from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator import profiles
from finetune_operator.api.schema import PRECISIONS
from finetune_operator.estimate.calibration import parse_record, shipped_records
from finetune_operator.estimate.predict import parse_prices, shipped_prices
from finetune_operator.profiles import _throughput

ROOT = Path(__file__).resolve().parents[2]


def test_every_profile_has_a_peak_or_a_reason_for_every_device_and_precision() -> None:
    for p in profiles.load_all().values():
        tp = p.throughput
        assert tp is not None, p.name
        for itype in p.instance_types:
            assert tp.device_for(itype) is not None, (p.name, itype)
        for dev in tp.devices.values():
            for prec in PRECISIONS:
                peak = dev.peaks[prec]
                # a number comes with the public page it is read from; a missing one says why
                assert ("https://" in peak.source) or ("no public" in peak.source), (p.name, dev.name, prec)


def test_peaks_are_the_published_figures_divided_as_stated() -> None:
    trn1 = profiles.get("trn1").throughput
    assert trn1 is not None
    nc2 = trn1.devices["NeuronCore-v2"]
    assert (nc2.peaks["bf16"].tflops, nc2.peaks["fp32"].tflops) == (190 / 2, 47.5 / 2)
    nvidia = profiles.get("nvidia").throughput
    assert nvidia is not None
    assert nvidia.device_for("p5en.48xlarge").name == "H200"  # type: ignore[union-attr]
    assert nvidia.devices["H200"].peaks["bf16"].tflops == 1979 / 2
    xeon = profiles.get("xeon-amx").throughput
    assert xeon is not None
    assert xeon.device_for("r7iz.metal-16xl").peaks["bf16"].tflops == pytest.approx(1024 * 3.9e9 / 1e12)  # type: ignore[union-attr]
    assert nvidia.devices["A10G"].peak_flops("bf16") is None


def block(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "unit": "GPU",
        "defaultDevice": "X",
        "devices": {"X": {p: {"peakTflops": 1.0, "source": "https://example.invalid/x"} for p in PRECISIONS}},
    }
    raw.update(over)
    return raw


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (block(unit=""), r"throughput\.unit"),
        (block(devices={}), r"throughput\.devices: at least one"),
        (block(devices={"X": {"bf16": {"peakTflops": 1.0, "source": "s"}}}), r"devices\.X\.fp32: give peakTflops"),
        (
            block(devices={"X": {p: {"peakTflops": -1, "source": "s"} for p in PRECISIONS}}),
            r"peakTflops: a positive number, or null",
        ),
        (
            block(devices={"X": {p: {"peakTflops": 1.0, "source": " "} for p in PRECISIONS}}),
            r"source: say where the number comes from",
        ),
        (block(defaultDevice="Y"), r"defaultDevice: 'Y' is not one of devices"),
        (block(instanceDevices={"no.such": "X"}), r"instanceDevices\.no\.such: not an instance type"),
        (block(instanceDevices={"a.large": "Y"}), r"instanceDevices\.a\.large: 'Y' is not one of devices"),
        (block(defaultDevice=None), r"no defaultDevice and no instanceDevices entry for \['a.large'\]"),
    ],
)
def test_profile_loader_refuses_a_bad_throughput_block_naming_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _throughput("test", raw, {"a.large"})


def test_price_table_has_date_region_source_and_prices_every_profile_instance_type() -> None:
    prices = shipped_prices()
    assert prices.date and prices.region == "us-east-1" and "https://" in prices.source
    for p in profiles.load_all().values():
        for itype in p.instance_types:
            assert itype in prices.rows, f"{itype} ({p.name}) has no row (a null row says why there is no price)"
            usd, note = prices.rows[itype]
            assert usd is not None or note, itype
    # the seed's instance types have a price
    for itype in ("trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "p5.48xlarge", "p5en.48xlarge"):
        assert prices.rows[itype][0]


def test_price_table_without_a_date_is_refused() -> None:
    with pytest.raises(ValueError, match="date is required"):
        parse_prices({"region": "us-east-1", "source": "x", "usdPerHour": {}}, "p.yaml")


def test_h200_records_are_the_benchmark_results() -> None:
    """calibration.yaml's H200 records copy benchmarks/results/2026-12-04-gpu: they must not drift apart."""
    records = {r.id: r for r in shipped_records()}
    seen = 0
    for name, precision, compiled in (
        ("gpu-bert-ja-bf16.json", "bf16", False),
        ("gpu-bert-ja-bf16-compile.json", "bf16", True),
        ("gpu-bert-ja-fp32.json", "fp32", False),
    ):
        doc = json.loads((ROOT / "benchmarks" / "results" / "2026-12-04-gpu" / name).read_text())
        for result in doc["results"]:
            rid = f"h200-bert-base-{precision}{'-compile' if compiled else ''}-b{result['batchSize']}"
            r = records[rid]
            w = r.workload
            assert (w.precision, w.compile, w.batch_per_device) == (precision, compiled, result["batchSize"])
            assert r.samples_per_second == result["samplesPerSecond"]
            assert w.tokens_per_sample == doc["seqLen"]
            assert (w.shape.layers, w.shape.hidden, w.shape.heads, w.shape.intermediate, w.shape.vocab) == (
                doc["model"]["layers"],
                doc["model"]["hidden"],
                doc["model"]["heads"],
                doc["model"]["ffn"],
                doc["model"]["vocab"],
            )
            seen += 1
    assert seen == 13


def test_cpu_records_carry_the_example_models_config() -> None:
    """Records of local models keep the config inline (the package has no examples/): it must be the file's."""
    raw = yaml.safe_load((ROOT / "operator" / "finetune_operator" / "estimate" / "calibration.yaml").read_text())
    inline = [r for r in raw if r.get("modelConfig")]
    assert inline, "the CPU demo records"
    for r in inline:
        assert r["modelConfig"] == json.loads((ROOT / r["model"] / "config.json").read_text()), r["id"]


def test_seed_figures_are_in_the_records() -> None:
    records = {r.id: r for r in shipped_records()}
    assert [records[f"trn1-bert-ja-{c}"].samples_per_second for c in ("1core-fp32", "2core-fp32", "1core-bf16")] == [
        68.4,
        115.9,
        98.4,
    ]
    assert records["trn1-bert-ja-2core-bf16"].samples_per_second == 149.1
    spr1, spr4 = records["spr-distilbert-squad-1node"], records["spr-distilbert-squad-4nodes"]
    assert (spr1.epoch_seconds, spr4.epoch_seconds) == (26 * 60, 7.5 * 60)
    assert spr1.samples_per_second * 26 * 60 == pytest.approx(88524)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"profile": "tpu"}, "profile 'tpu' is not one of"),
        ({"instanceType": "trn1.4xlarge"}, "instanceType 'trn1.4xlarge' is not an instance type of trn1"),
        ({"precision": "fp16"}, "precision must be one of"),
        ({"samplesPerSecond": None}, "give samplesPerSecond, or samplesPerEpoch and epochSeconds"),
        ({"samplesPerSecond": 0}, "samplesPerSecond must be positive"),
        ({"batchSizePerDevice": "8"}, "batchSizePerDevice must be an integer"),
        ({"source": None}, "source is required"),
        ({"model": "someone/unknown"}, "--model-config"),
    ],
)
def test_bad_record_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    good = {
        "id": "r1",
        "source": "measured",
        "profile": "trn1",
        "instanceType": "trn1.2xlarge",
        "precision": "bf16",
        "model": "cl-tohoku/bert-base-japanese-whole-word-masking",
        "maxLength": 128,
        "batchSizePerDevice": 8,
        "samplesPerSecond": 98.4,
    }
    parse_record(good, "f.yaml record 0")
    with pytest.raises(ValueError, match=message):
        parse_record({**good, **change}, "f.yaml record 0")


def test_cpu_record_needs_the_cores_each_rank_computes_on() -> None:
    raw = {
        "id": "c",
        "source": "measured",
        "profile": "cpu",
        "precision": "fp32",
        "model": "cl-tohoku/bert-base-japanese-whole-word-masking",
        "maxLength": 128,
        "batchSizePerDevice": 8,
        "samplesPerSecond": 10,
    }
    with pytest.raises(ValueError, match="devicesPerRank is required on cpu"):
        parse_record(raw, "f.yaml record 0")
    assert parse_record({**raw, "devicesPerRank": 4}, "x").workload.devices_per_rank == 4
