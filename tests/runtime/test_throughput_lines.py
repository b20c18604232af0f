"""A real 2-rank torchrun training prints its throughput on rank 0's progress lines: tokens padded and not, the mean
padded length of a sample, the precision, and the model's numbers as counted on the loaded model. The operator's
FLOPs from those numbers (finetune_operator.throughput, the formula of estimate/flops.py) are compared with
`ftjob estimate`'s for the same tiny model's config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DEMO_CONFIG, ROOT, job_config, run_runtime, runtime_env

from finetune_operator import throughput
from finetune_operator.estimate.flops import ModelShape, flops_per_sample

pytestmark = pytest.mark.slow

MAX_LENGTH = 128


def test_two_rank_training_prints_tokens_and_model_numbers_and_the_flops_match_the_estimate(tmp_path: Path) -> None:
    cfg = job_config(DEMO_CONFIG).training(maxSteps=12, logEverySteps=3).write(tmp_path / "config.json")
    run = run_runtime(["launch"], runtime_env(tmp_path, cfg), tmp_path)
    assert run.rc == 0, run.out[-4000:]
    train = run.events("train")
    timed = [r for r in train if "samplesPerSecond" in r]
    assert len(timed) >= 3, train  # steps 3, 6, 9, 12 (the first line, step 1, has no interval before it)
    for r in timed:
        sps, tps, padded = r["samplesPerSecond"], r["tokensPerSecond"], r["paddedTokensPerSecond"]
        # Dynamic padding (each batch to its longest row): real tokens below padded ones, a sample at most
        # maxLength long.
        assert 0 < tps <= padded <= sps * MAX_LENGTH, r
        assert 1 < r["paddedTokensPerSample"] <= MAX_LENGTH
        assert r["precision"] == "fp32"
    assert all("meanSamplesPerSecond" in r for r in timed[1:]), timed

    config = json.loads((ROOT / "examples" / "models" / "tiny-bert-ja" / "config.json").read_text())
    shape = ModelShape.from_config(config)
    numbers = timed[-1]["model"]
    hidden, labels = shape.hidden, 2
    assert numbers["layers"] == shape.layers and numbers["attentionWidth"] == shape.attention_width
    # Every linear layer's weight, counted on the model: the encoder layers' (what the estimate counts) plus the
    # pooler and the classifier, the heads the estimate leaves out (under 1% of BERT-base; 6% of this tiny one).
    assert numbers["trainableMatmulParams"] == shape.matmul_params + hidden * hidden + hidden * labels
    assert numbers["frozenMatmulParams"] == 0  # a full fine-tune

    import torch
    from transformers import AutoModelForSequenceClassification

    saved = AutoModelForSequenceClassification.from_pretrained(str(run.output_dir / "model"))
    assert numbers["trainableParams"] == sum(p.numel() for p in saved.parameters())
    assert isinstance(saved.classifier, torch.nn.Linear)

    # The operator's status.throughput from the same lines, on the job's hardware as `ftjob run` gives it.
    ctx = throughput.Context("x86-64 vCPU", 2.0, {"fp32": 48e9, "bf16": 48e9}, "fp32")
    status = throughput.of(ctx, timed[-1])
    assert status is not None
    tokens = timed[-1]["paddedTokensPerSample"]
    estimate = flops_per_sample(shape, tokens)
    heads = 6 * tokens * (hidden * hidden + hidden * labels)  # the heads' 6 FLOPs per weight per token
    assert status["flopsPerSample"] == pytest.approx(estimate + heads, rel=1e-5)
    assert status["flopsPerSample"] / estimate < 1.06
    assert status["mfu"] == pytest.approx(timed[-1]["samplesPerSecond"] * status["flopsPerSample"] / 96e9, rel=1e-3)
