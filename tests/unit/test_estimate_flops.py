"""estimate/flops.py: model FLOPs per training sample (6·N·tokens plus attention; LoRA's frozen weights) and the
model shapes it reads from config.json files and the hub-model table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_operator.estimate.flops import Lora, ModelShape, flops_per_sample, trained_params
from finetune_operator.estimate.workload import hub_models, model_shape

ROOT = Path(__file__).resolve().parents[2]


def hub(name: str) -> ModelShape:
    return ModelShape.from_config(hub_models()[name]["config"])


def test_bert_base_matches_the_gpu_benchmarks_flops_per_sample() -> None:
    """The H200 results were computed with the same formula (benchmarks/gpu_bert_ja.py): 67,041,755,136 at 128."""
    bert = hub("cl-tohoku/bert-base-japanese-whole-word-masking")
    assert bert.matmul_params == 12 * (4 * 768**2 + 2 * 768 * 3072) == 84_934_656
    for name in ("gpu-bert-ja-bf16.json", "gpu-bert-ja-fp32.json", "gpu-bert-ja-bf16-compile.json"):
        result = json.loads((ROOT / "benchmarks" / "results" / "2026-12-04-gpu" / name).read_text())
        assert flops_per_sample(bert, 128) == result["flopsPerSample"]


def test_attention_term_is_12_L_H_S_per_token() -> None:
    bert = hub("cl-tohoku/bert-base-japanese-whole-word-masking")
    for s in (64, 128, 384):
        assert flops_per_sample(bert, s) == s * (6 * bert.matmul_params + 12 * 12 * 768 * s)


def test_distilbert_at_squad_length() -> None:
    d = hub("distilbert-base-uncased")
    assert (d.layers, d.hidden, d.intermediate) == (6, 768, 3072)
    assert d.matmul_params == 6 * (4 * 768**2 + 2 * 768 * 3072)
    assert flops_per_sample(d, 384) == 384 * (6 * d.matmul_params + 12 * 6 * 768 * 384)
    # total weights: layers + word, position embeddings (66.3 M; DistilBERT QA reports 66,364,418 with biases)
    assert d.total_params == d.matmul_params + 768 * (30522 + 512)


def test_decoder_counts_the_lm_head_on_every_token_and_gqa_projections() -> None:
    q = hub("Qwen/Qwen2.5-0.5B-Instruct")
    h, f, kv = 896, 4864, 2 * 64
    layer = h * h + 2 * h * kv + h * h + 3 * h * f  # q, k, v (2 KV heads of 64), o; gate, up, down
    assert q.matmul_params == 24 * layer + h * 151936
    # tied embeddings: the head is the embedding matrix, counted once among the trained weights
    assert q.total_params == 24 * layer + h * 151936
    assert 490e6 < q.total_params < 500e6  # Qwen2.5-0.5B: 494 M weights


def test_lora_backward_skips_frozen_weight_gradients() -> None:
    q = hub("Qwen/Qwen2.5-0.5B-Instruct")
    lora = Lora(16, ("q_proj", "k_proj", "v_proj", "o_proj"))
    adapters = 24 * 16 * ((896 + 896) + (896 + 128) + (896 + 128) + (896 + 896))
    assert q.lora_params(16, lora.targets) == adapters == trained_params(q, lora)
    s = 1024
    attention = 12 * 24 * 896 * s
    assert flops_per_sample(q, s, lora) == s * (4 * q.matmul_params + 6 * adapters + attention)
    # fewer FLOPs than a full fine-tune by 2 FLOPs per frozen weight per token, plus the adapters' own 6
    assert flops_per_sample(q, s) - flops_per_sample(q, s, lora) == s * (2 * q.matmul_params - 6 * adapters)


def test_lora_default_targets_are_peft_defaults() -> None:
    q = hub("Qwen/Qwen2.5-0.5B-Instruct")
    assert q.lora_params(8, None) == 24 * 8 * ((896 + 896) + (896 + 128))  # q_proj, v_proj


def test_lora_target_that_is_not_a_linear_layer_is_named() -> None:
    with pytest.raises(ValueError, match=r"\['qkv'\].*known"):
        hub("Qwen/Qwen2.5-0.5B-Instruct").lora_params(8, ["qkv"])


def test_local_model_directory_config_is_read() -> None:
    shape, where = model_shape("examples/models/tiny-llama", cwd=ROOT)
    assert where == "examples/models/tiny-llama/config.json"
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.vocab) == (2, 64, 4, 2, 600)
    assert shape.decoder and shape.tied_embeddings


def test_unknown_model_type_and_unknown_model_name_the_fix() -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2' is not one"):
        ModelShape.from_config({"model_type": "gpt2", "n_embd": 768})
    with pytest.raises(ValueError, match="no positive integer hidden_size"):
        ModelShape.from_config({"model_type": "bert"})
    with pytest.raises(ValueError, match="--model-config"):
        model_shape("someone/unknown-model", cwd=ROOT)


def test_hub_model_table_has_a_source_for_every_entry() -> None:
    for name, entry in hub_models().items():
        assert entry["source"].startswith("https://huggingface.co/"), name
        ModelShape.from_config(entry["config"])
