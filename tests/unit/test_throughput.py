"""status.throughput (finetune_operator/throughput.py): rank 0's figures folded from its progress lines, model FLOPs by
the estimate's one formula, MFU against the profile's peak for the precision in use and the devices the job holds,
and the THROUGHPUT column. Nothing is made up: what the lines do not give stays absent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ftjobs import make_job

from finetune_operator import crd, profiles, progress, throughput
from finetune_operator.admission import validate
from finetune_operator.builders import resolve
from finetune_operator.builders.env import thread_env
from finetune_operator.estimate import Calibration, estimate, load_prices, shipped_records
from finetune_operator.estimate.flops import ModelShape, counts, flops_per_sample
from finetune_operator.estimate.workload import hub_models

BERT_JA = "cl-tohoku/bert-base-japanese-whole-word-masking"
SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "samples"


def load_sample(name: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((SAMPLES / f"{name}.yaml").read_text())
    return job


def context(job: dict[str, Any]) -> throughput.Context:
    valid = validate(job)
    return throughput.Context.of(valid, resolve(valid))


def model_line(shape: ModelShape, **fields: Any) -> dict[str, Any]:
    """A runtime train line for a full fine-tune of `shape` (its numbers as the estimate's config gives them)."""
    c = counts(shape)
    model = {
        "layers": c.layers,
        "attentionWidth": c.attention_width,
        "trainableMatmulParams": c.trainable_matmul,
        "frozenMatmulParams": c.frozen_matmul,
    }
    return {"event": "train", "model": model, **fields}


def bert() -> ModelShape:
    return ModelShape.from_config(hub_models()[BERT_JA]["config"])


def test_trn1_two_cores_bf16_mfu_is_the_estimates_for_the_same_figure() -> None:
    """The seed's 149.1 samples/s on two NeuronCore-v2 in bf16: status MFU = samples/s × FLOPs per sample over two
    cores' bf16 peak (the profile's 95 TFLOP/s each), the same number `ftjob estimate` prints for that run."""
    job = load_sample("trn1-bert-ja-2core-bf16")
    ctx = context(job)
    peak = profiles.get("trn1").throughput.devices["NeuronCore-v2"].peak_flops("bf16")  # type: ignore[union-attr]
    assert (ctx.device, ctx.devices, ctx.peaks["bf16"], ctx.precision) == ("NeuronCore-v2", 2.0, peak, "bf16")
    t = throughput.of(ctx, model_line(bert(), samplesPerSecond=149.1, paddedTokensPerSample=128.0))
    assert t is not None
    flops = flops_per_sample(bert(), 128)
    assert t["flopsPerSample"] == pytest.approx(flops, rel=1e-6)
    assert t["peakFlopsPerSecond"] == 2 * peak
    assert t["mfu"] == pytest.approx(149.1 * flops / (2 * peak), rel=1e-3)
    # `ftjob estimate` on the same job predicts 149.1 samples/s there (its calibration holds the run) and so the
    # same MFU.
    est = estimate(validate(job), Calibration(shipped_records()), load_prices(None), others=False)
    pred = est.rows[0].prediction
    assert pred is not None and pred.samples_per_second == pytest.approx(149.1, rel=0.1)
    assert t["mfu"] == pytest.approx(pred.mfu * 149.1 / pred.samples_per_second, rel=1e-3)
    assert t["summary"] == f"149 samples/s, MFU {100 * t['mfu']:.2g}%"


def test_xeon_devices_are_the_cores_the_ranks_compute_on() -> None:
    """On CPUs a rank computes on its threads' cores: MFU counts ranks × OMP_NUM_THREADS of them."""
    job = load_sample("xeon-distilbert-squad")
    ctx = context(job)
    valid = validate(job)
    layout = resolve(valid)
    threads = float(thread_env(layout)["OMP_NUM_THREADS"])
    assert ctx.devices == layout.world_size * threads
    assert ctx.device is not None and "core" in ctx.device


def test_lora_frozen_weights_count_four_flops_per_token() -> None:
    line = {
        "event": "train",
        "samplesPerSecond": 10.0,
        "paddedTokensPerSample": 100.0,
        "model": {"layers": 2, "attentionWidth": 64, "trainableMatmulParams": 1000, "frozenMatmulParams": 50000},
    }
    t = throughput.of(throughput.Context("GPU", 1, {"bf16": 1e12}, "bf16"), line)
    assert t is not None
    assert t["flopsPerSample"] == 100 * (6 * 1000 + 4 * 50000 + 12 * 2 * 64 * 100)


def test_precision_is_the_runtimes_when_it_says_so() -> None:
    ctx = throughput.Context("GPU", 2, {"fp32": 10e12, "bf16": 100e12}, "fp32")
    line = {"event": "train", "samplesPerSecond": 100.0, "flopsPerSample": 1e9}
    assert throughput.of(ctx, line) == {
        "samplesPerSecond": 100.0,
        "flopsPerSample": 1e9,
        "precision": "fp32",
        "device": "GPU",
        "devices": 2,
        "peakFlopsPerSecond": 20e12,
        "mfu": 0.005,
        "summary": "100 samples/s, MFU 0.5%",
    }
    t = throughput.of(ctx, {**line, "precision": "bf16"})
    assert t is not None and (t["precision"], t["mfu"]) == ("bf16", 0.0005)


def test_a_command_jobs_samples_per_second_alone_stays_alone() -> None:
    """A spec.command script printing samplesPerSecond only: no tokens, FLOPs, precision or MFU are made up."""
    job = make_job("byo").command("python", "train.py").build()
    ctx = context(job)
    assert ctx.precision is None and ctx.device is not None
    t = throughput.of(ctx, {"event": "train", "step": 3, "samplesPerSecond": 12.5})
    assert t == {"samplesPerSecond": 12.5, "device": ctx.device, "devices": ctx.devices, "summary": "12.5 samples/s"}
    # Its lines may say more: FLOPs and precision make an MFU.
    t = throughput.of(ctx, {"event": "train", "samplesPerSecond": 12.5, "flopsPerSample": 2e9, "precision": "fp32"})
    assert t is not None and t["mfu"] == pytest.approx(12.5 * 2e9 / (ctx.devices * ctx.peaks["fp32"]), rel=1e-3)  # type: ignore[operator]


def test_no_public_peak_no_mfu() -> None:
    """g5's A10G has no public bf16 peak (profile data): FLOPs yes, MFU no."""
    job = make_job("a10").profile("nvidia").instance("g5.xlarge").classification().training(precision="bf16").build()
    ctx = context(job)
    assert ctx.device == "A10G" and ctx.peaks["bf16"] is None
    t = throughput.of(ctx, model_line(bert(), samplesPerSecond=200.0, paddedTokensPerSample=128.0))
    assert t is not None and t["flopsPerSample"] > 0 and "mfu" not in t and "peakFlopsPerSecond" not in t
    assert t["summary"] == "200 samples/s"


def test_nothing_measured_nothing_reported() -> None:
    ctx = throughput.Context("GPU", 1, {"fp32": 1e12}, "fp32")
    assert throughput.of(ctx, None) is None
    assert throughput.of(ctx, {"event": "eval", "step": 3, "metrics": {"accuracy": 0.5}}) is None
    # a precompile trial's steps are not training
    assert throughput.of(ctx, {"event": "precompile", "samplesPerSecond": 3.0}) is None


def test_garbage_from_a_log_is_dropped_not_written_to_the_status() -> None:
    """The lines come from a log (a user's script may print anything): the status schema's types must hold."""
    ctx = throughput.Context("GPU", 1, {"fp32": 1e12, "bf16": 1e12}, "fp32")
    line = {
        "event": "train",
        "samplesPerSecond": "fast",
        "tokensPerSecond": -5,
        "paddedTokensPerSecond": True,
        "paddedTokensPerSample": 64,
        "precision": "fp8",
        "model": {"layers": "2", "attentionWidth": 64, "trainableMatmulParams": 1, "frozenMatmulParams": 0},
        "flopsPerSample": float("nan"),
    }
    assert throughput.of(ctx, line) is None  # no rate at all
    t = throughput.of(ctx, {**line, "samplesPerSecond": 4.0})
    assert t is not None and "model" not in t and "flopsPerSample" not in t and "mfu" not in t
    assert t["precision"] == "fp32" and "tokensPerSecond" not in t and "paddedTokensPerSecond" not in t


def test_progress_keeps_the_throughput_inputs_across_eval_lines() -> None:
    """The model's numbers and the rates stay in status.progress (folded) while eval and checkpoint lines, which
    carry none, come in between; a newer train line replaces them."""
    first = model_line(bert(), step=10, samplesPerSecond=50.0, tokensPerSecond=4000.0, paddedTokensPerSample=90.0)
    state = progress.fold([first, {"event": "eval", "step": 10, "metrics": {"accuracy": 0.7}}])
    assert state is not None
    assert state["model"] == first["model"] and state["tokensPerSecond"] == 4000.0
    ctx = throughput.Context("GPU", 1, {"fp32": 67e12}, "fp32")
    t = throughput.of(ctx, state)
    assert t is not None and t["tokensPerSecond"] == 4000.0 and t["mfu"] > 0
    later = progress.fold([{"event": "train", "step": 20, "samplesPerSecond": 60.0, "tokensPerSecond": 4100.0}], state)
    assert later is not None and later["samplesPerSecond"] == 60.0 and later["model"] == first["model"]


@pytest.mark.parametrize(
    ("figures", "text"),
    [
        ({"samplesPerSecond": 149.1, "mfu": 0.312}, "149 samples/s, MFU 31%"),
        ({"samplesPerSecond": 1234.0, "mfu": 0.4}, "1,234 samples/s, MFU 40%"),
        ({"samplesPerSecond": 35.2, "mfu": 0.0054}, "35.2 samples/s, MFU 0.54%"),
        ({"samplesPerSecond": 3.14159}, "3.14 samples/s"),
        ({"tokensPerSecond": 5000.0}, "5,000 tokens/s"),
    ],
)
def test_the_column_text(figures: dict[str, float], text: str) -> None:
    assert throughput.summarize(figures) == text


def test_the_column_reads_the_summary() -> None:
    (version,) = crd.crd()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Throughput"] == {"name": "Throughput", "type": "string", "jsonPath": ".status.throughput.summary"}
