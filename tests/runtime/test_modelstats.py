"""modelstats.py on real models (the examples' tiny ones, built from their config.json): the FLOPs formula's numbers
counted on the loaded model, LoRA's frozen base and trained adapters (peft), and the token counter's forward
pre-hook. The estimate's numbers for the same configs are the reference (operator/finetune_operator/estimate)."""

from __future__ import annotations

import json
from typing import Any

import torch
from conftest import EXAMPLES

from finetune_operator.estimate.flops import Lora, ModelShape, counts
from finetune_runtime import modelstats


def config(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((EXAMPLES / "models" / name / "config.json").read_text())
    return out


def build(name: str, auto: str) -> Any:
    import transformers

    cls = getattr(transformers, auto)
    return cls.from_config(transformers.AutoConfig.from_pretrained(str(EXAMPLES / "models" / name)))


def test_distilbert_qa_numbers_are_the_estimates_plus_its_qa_head() -> None:
    """DistilBERT's config names (n_layers, dim, n_heads) reach the count through transformers' attribute map."""
    model = build("tiny-distilbert-en", "AutoModelForQuestionAnswering")
    shape = ModelShape.from_config(config("tiny-distilbert-en"))
    n = modelstats.model_numbers(model)
    assert n is not None
    assert (n["layers"], n["attentionWidth"]) == (shape.layers, shape.attention_width)
    assert n["trainableMatmulParams"] == shape.matmul_params + shape.hidden * 2  # the span head: 2 logits a token
    assert n["frozenMatmulParams"] == 0
    assert n["trainableParams"] == sum(p.numel() for p in model.parameters())


def test_lora_counts_frozen_base_and_trained_adapters_like_the_estimate() -> None:
    """peft wraps each targeted linear layer: its base weight frozen (4 FLOPs per weight per token), the adapters
    lora_A and lora_B trained; the wrapper itself is not counted again."""
    from peft import LoraConfig, get_peft_model

    base = build("tiny-llama", "AutoModelForCausalLM")
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    n = modelstats.model_numbers(model)
    assert n is not None
    expected = counts(ModelShape.from_config(config("tiny-llama")), Lora(4, ("q_proj", "v_proj")))
    assert n["trainableMatmulParams"] == expected.trainable_matmul
    assert n["frozenMatmulParams"] == expected.frozen_matmul  # layers and the LM head (it multiplies every token)
    assert n["trainableParams"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (n["layers"], n["attentionWidth"]) == (expected.layers, expected.attention_width)


def test_a_model_whose_config_lacks_its_shape_reports_no_numbers() -> None:
    assert modelstats.model_numbers(torch.nn.Linear(4, 4)) is None


def test_precision_is_autocasts_or_the_weights() -> None:
    model = torch.nn.Linear(4, 4)
    assert modelstats.precision_of(model, False) == "fp32"
    assert modelstats.precision_of(model, True) == "bf16"
    assert modelstats.precision_of(model.to(torch.bfloat16), False) == "bf16"


def test_token_counter_counts_training_forwards_padded_and_not() -> None:
    model = build("tiny-bert-ja", "AutoModelForSequenceClassification")
    counter = modelstats.TokenCounter()
    counter.attach(model)
    ids = torch.ones((3, 10), dtype=torch.long)
    mask = torch.ones((3, 10), dtype=torch.long)
    mask[0, 6:] = 0  # row 0 padded after 6 tokens
    mask[1, 8:] = 0
    model.train()
    model(input_ids=ids, attention_mask=mask)
    model(input_ids=ids[:1, :4])  # no mask: every token is real
    model.eval()
    model(input_ids=ids, attention_mask=mask)  # evaluation: not counted
    got = counter.take()
    assert (got.sequences, got.padded, got.real) == (4, 34, 6 + 8 + 10 + 4)
    assert counter.take().sequences == 0  # taken: the next interval starts empty
    assert (counter.total.sequences, counter.total.padded) == (4, 34)
    counter.detach()
    model.train()
    model(input_ids=ids, attention_mask=mask)
    assert counter.take().sequences == 0


def test_masks_on_an_xla_like_device_fake_meta_leave_the_real_count_unknown() -> None:
    """Neuron's XLA tensors cannot exist here: torch's meta device stands in as a device other than the CPU and
    CUDA. An extra op there would change the compiled step, so only the padded count (shapes) is kept."""
    device = "meta"
    counter = modelstats.TokenCounter()
    module = torch.nn.Module()
    module.train()
    ids = torch.empty((2, 16), dtype=torch.long, device=device)
    counter._hook(module, (), {"input_ids": ids, "attention_mask": torch.empty((2, 16), device=device)})
    got = counter.take()
    assert (got.sequences, got.padded, counter.real_known) == (2, 32, False)
