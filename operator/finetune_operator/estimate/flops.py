"""Model FLOPs per training sample, from a Hugging Face config: the usual 6·N per token plus the attention term.

Per token, a matmul weight costs 2 FLOPs forward (a multiply and an add) and 4 backward (the gradient of its
input and of the weight itself): 6·N for the N matmul weights of the layers (plus the LM head of a decoder, which
computes logits for every token). The attention scores Q·Kᵀ and their weighted sum with V have no weights: per
token and layer 2·S·H each forward (S positions, H = heads × head dim), so 4·S·H, and three times that with
backward: 12·L·H·S per token. A sample of S tokens: S·(6·N + 12·L·H·S). Embedding lookups, norms, softmax, biases
and the classification or QA head are left out (under 1% of the total for the models here). These are model
FLOPs, what MFU counts: activation recomputation would add hardware FLOPs, not model FLOPs.

LoRA (frozen base weights, trained adapters): backward still computes every activation gradient through the
frozen weights (2 FLOPs per weight per token: the layers below need it), but no weight gradient for them. So the
base costs 4·N per token instead of 6·N; the adapters train fully, 6·N_lora, where an adapter of rank r on a
linear layer of in × out has r·(in + out) weights. Attention is unchanged (its backward has no weights to skip).

One formula, two sources of its numbers (`Counts`): `ftjob estimate` derives them from a config.json
(`ModelShape.counts`); a running job's rank 0 reports them as it counted them on the model it loaded (the runtime's
progress lines, docs/architecture.md), and the operator computes status.throughput's FLOPs with the same
`flops_per_token` (throughput.py). The runtime counts every `nn.Linear` weight, so its N also holds the heads this
model leaves out (BERT's pooler and classifier: under 1% for BERT-base, about 6% for the tiny test model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BERT_LIKE = ("bert", "roberta", "xlm-roberta", "electra", "camembert")
DISTILBERT = ("distilbert",)
GATED_DECODERS = ("llama", "qwen2", "qwen3", "mistral")
MODEL_TYPES = BERT_LIKE + DISTILBERT + GATED_DECODERS

# peft's default LoRA targets when task.lora.targetModules is not set (peft's
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for these model types).
DEFAULT_LORA_TARGETS = {
    **{t: ("query", "value") for t in BERT_LIKE},
    "distilbert": ("q_lin", "v_lin"),
    **{t: ("q_proj", "v_proj") for t in GATED_DECODERS},
}


def _int(cfg: dict[str, Any], *keys: str) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    raise ValueError(f"model config has no positive integer {' or '.join(keys)}")


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int  # learned position embeddings (0 for rotary decoders)
    type_vocab: int
    decoder: bool  # causal LM: the LM head runs on every token
    tied_embeddings: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        """From a config.json's dict. Raises ValueError naming the missing key or the unsupported model_type."""
        mt = str(cfg.get("model_type") or "")
        if mt in DISTILBERT:
            h = _int(cfg, "dim")
            heads = _int(cfg, "n_heads")
            return cls(
                mt,
                h,
                _int(cfg, "n_layers"),
                heads,
                heads,
                h // heads,
                _int(cfg, "hidden_dim"),
                _int(cfg, "vocab_size"),
                int(cfg.get("max_position_embeddings") or 512),
                0,
                False,
                True,
            )
        if mt in BERT_LIKE:
            h = _int(cfg, "hidden_size")
            heads = _int(cfg, "num_attention_heads")
            return cls(
                mt,
                h,
                _int(cfg, "num_hidden_layers"),
                heads,
                heads,
                h // heads,
                _int(cfg, "intermediate_size"),
                _int(cfg, "vocab_size"),
                int(cfg.get("max_position_embeddings") or 512),
                int(cfg.get("type_vocab_size") or 0),
                False,
                True,
            )
        if mt in GATED_DECODERS:
            h = _int(cfg, "hidden_size")
            heads = _int(cfg, "num_attention_heads")
            kv = int(cfg.get("num_key_value_heads") or heads)
            head_dim = int(cfg.get("head_dim") or h // heads)
            return cls(
                mt,
                h,
                _int(cfg, "num_hidden_layers"),
                heads,
                kv,
                head_dim,
                _int(cfg, "intermediate_size"),
                _int(cfg, "vocab_size"),
                0,
                0,
                True,
                bool(cfg.get("tie_word_embeddings", False)),
            )
        raise ValueError(
            f"model_type {mt!r} is not one the FLOPs model knows ({', '.join(MODEL_TYPES)}); pass the config.json "
            "of a model of one of these types"
        )

    def linears(self) -> list[tuple[str, int, int]]:
        """(module name, in, out) of every matmul weight of one layer, by the names LoRA targets use."""
        h, f, a, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        if self.model_type in DISTILBERT:
            return [
                ("q_lin", h, h),
                ("k_lin", h, h),
                ("v_lin", h, h),
                ("out_lin", h, h),
                ("lin1", h, f),
                ("lin2", f, h),
            ]
        if self.model_type in BERT_LIKE:
            # attention.output.dense, intermediate.dense and output.dense are all named "dense"
            return [("query", h, h), ("key", h, h), ("value", h, h), ("dense", h, h), ("dense", h, f), ("dense", f, h)]
        return [
            ("q_proj", h, a),
            ("k_proj", h, kv),
            ("v_proj", h, kv),
            ("o_proj", a, h),
            ("gate_proj", h, f),
            ("up_proj", h, f),
            ("down_proj", f, h),
        ]

    @property
    def layer_params(self) -> int:
        """The matmul weights of all layers."""
        return self.layers * sum(i * o for _, i, o in self.linears())

    @property
    def matmul_params(self) -> int:
        """N: the layers' matmul weights, plus the LM head of a decoder (it multiplies every token)."""
        return self.layer_params + (self.hidden * self.vocab if self.decoder else 0)

    @property
    def total_params(self) -> int:
        """Every weight a full fine-tune trains (and all-reduces): layers, embeddings, an untied LM head.
        Biases and norms are left out; a tied LM head is the embedding matrix, counted once."""
        emb = self.hidden * (self.vocab + self.max_positions + self.type_vocab)
        head = self.hidden * self.vocab if self.decoder and not self.tied_embeddings else 0
        return self.layer_params + emb + head

    def lora_params(self, r: int, targets: list[str] | tuple[str, ...] | None) -> int:
        """Adapter weights: r·(in + out) for every targeted linear of every layer."""
        names = tuple(targets) if targets else DEFAULT_LORA_TARGETS[self.model_type]
        known = {n for n, _, _ in self.linears()}
        unknown = sorted(set(names) - known)
        if unknown:
            raise ValueError(
                f"LoRA target modules {unknown} are not linear layers of a {self.model_type} model; "
                f"known: {sorted(known)}"
            )
        return self.layers * sum(r * (i + o) for n, i, o in self.linears() if n in names)

    @property
    def attention_width(self) -> int:
        """H in 12·L·H·S: the query heads times the head dim (equal to hidden for these models)."""
        return self.heads * self.head_dim


@dataclass(frozen=True)
class Counts:
    """What the FLOPs formula needs of a model: its matmul weights, trained and frozen, and its attention shape."""

    layers: int  # L
    attention_width: int  # H: query heads × head dim
    trainable_matmul: int  # matmul weights whose gradient is computed (6 FLOPs per weight per token)
    frozen_matmul: int  # frozen matmul weights (4: forward, and the input gradient the layers below need)


def flops_per_token(c: Counts, tokens: float) -> float:
    """Model FLOPs per token of a sample of `tokens` tokens, forward and backward (the module docstring)."""
    return 6.0 * c.trainable_matmul + 4.0 * c.frozen_matmul + 12.0 * c.layers * c.attention_width * tokens


@dataclass(frozen=True)
class Lora:
    r: int
    targets: tuple[str, ...] | None  # None: peft's default for the model type


def counts(shape: ModelShape, lora: Lora | None = None) -> Counts:
    """The formula's numbers from a config: every matmul weight trained, or (LoRA) frozen beside the adapters."""
    n = shape.matmul_params
    if lora is None:
        return Counts(shape.layers, shape.attention_width, n, 0)
    return Counts(shape.layers, shape.attention_width, shape.lora_params(lora.r, lora.targets), n)


def flops_per_sample(shape: ModelShape, tokens: float, lora: Lora | None = None) -> float:
    """Model FLOPs of one training sample of `tokens` tokens (forward + backward)."""
    return flops_per_token(counts(shape, lora), tokens) * tokens


def trained_params(shape: ModelShape, lora: Lora | None = None) -> int:
    """Weights whose gradients data parallelism all-reduces every optimizer step."""
    return shape.total_params if lora is None else shape.lora_params(lora.r, lora.targets)
