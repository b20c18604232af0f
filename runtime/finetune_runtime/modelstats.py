"""What rank 0 reports about the model it trains and the tokens it computes on (progress lines, docs/architecture.md).

The model's numbers are those of the FLOPs formula, 6·N per token for trained matmul weights, 4·N for frozen ones
and 12·L·H·S for attention: the operator computes FLOPs and MFU from them with the formula `ftjob estimate` uses
(operator/finetune_operator/estimate/flops.py, its one home: the operator does not depend on this package). They are
counted on the model as loaded (LoRA adapters, frozen base and all), not read from a table.

Imports torch lazily: imported by callbacks.py, which train.py imports after pointing the caches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _positive(cfg: Any, name: str) -> int | None:
    v = getattr(cfg, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def model_numbers(model: Any) -> dict[str, int] | None:
    """{layers, attentionWidth, trainableMatmulParams, frozenMatmulParams, trainableParams}, or None where the
    model's config does not say its layers and heads (then no FLOPs are reported rather than guessed).

    Matmul weights are the linear layers' own weights (a module holding a `weight` parameter of its own with
    in_features × out_features: torch's Linear and the kernels that replace it, not peft's wrapper around one),
    each counted once per module: a tied LM head multiplies every token like any other, though its matrix is the
    embedding's. Trained or frozen as the weight's requires_grad says. trainableParams is every trained weight
    once (shared ones once): what data parallelism all-reduces."""
    cfg = getattr(model, "config", None)
    # transformers' configs map these names onto each model's own (DistilBERT's n_layers, dim, n_heads)
    layers, hidden, heads = (_positive(cfg, n) for n in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
    if layers is None or hidden is None or heads is None:
        return None
    head_dim = _positive(cfg, "head_dim") or hidden // heads
    trainable = frozen = 0
    for module in model.modules():
        weight = module._parameters.get("weight")
        rows, cols = getattr(module, "out_features", None), getattr(module, "in_features", None)
        if weight is None or not isinstance(rows, int) or not isinstance(cols, int):
            continue
        if weight.requires_grad:
            trainable += rows * cols
        else:
            frozen += rows * cols
    return {
        "layers": layers,
        "attentionWidth": heads * head_dim,
        "trainableMatmulParams": trainable,
        "frozenMatmulParams": frozen,
        "trainableParams": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def precision_of(model: Any, bf16_autocast: bool) -> str:
    """The precision the steps compute in: bf16 under autocast or with bf16 weights (the backend's cast), else fp32."""
    import torch

    if bf16_autocast:
        return "bf16"
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    return "bf16" if dtype == torch.bfloat16 else "fp32"


@dataclass
class Tally:
    sequences: int = 0
    padded: int = 0  # tokens computed on, padding included (input_ids' shape)
    real: int = 0  # non-padding tokens (the attention mask's ones)


@dataclass
class TokenCounter:
    """Counts the training batches' samples and tokens from the model's inputs (a forward pre-hook; eval forwards,
    in eval mode, are not counted). The padded count comes from shapes alone; the attention mask is summed on the
    CPU, and on CUDA into a device tensor read at each progress line (no synchronisation per step). On other
    devices (XLA: Neuron) the mask is not summed, since an extra op would change the compiled step graph: the
    non-padding count is then unknown (`real_known` False) and left out of the lines."""

    interval: Tally = field(default_factory=Tally)
    total: Tally = field(default_factory=Tally)
    real_known: bool = True
    _pending: Any = None  # CUDA: the masks' sums since the last take(), a device tensor
    _handle: Any = None

    def attach(self, model: Any) -> None:
        import torch

        # Under torch.compile the hook runs eagerly (a break before the compiled forward), so counting never
        # enters the graph.
        hook = torch.compiler.disable(self._hook)  # type: ignore[no-untyped-call,unused-ignore]
        self._handle = model.register_forward_pre_hook(hook, with_kwargs=True)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or getattr(ids, "ndim", 0) < 2:
            return
        batch, length = int(ids.shape[0]), int(ids.shape[-1])
        self.interval.sequences += batch
        self.interval.padded += batch * length
        mask = kwargs.get("attention_mask")
        if mask is None:  # no mask: the model attends to every token, all of them real
            self.interval.real += batch * length
        elif mask.is_cpu:
            self.interval.real += int(mask.sum())
        elif mask.is_cuda:  # summed on the device; read once per take, not per step
            s = mask.sum()
            self._pending = s if self._pending is None else self._pending + s
        else:
            self.real_known = False

    def take(self) -> Tally:
        """The counts since the last take (added to the run's total)."""
        if self._pending is not None:
            self.interval.real += int(self._pending.item())
            self._pending = None
        got, self.interval = self.interval, Tally()
        self.total.sequences += got.sequences
        self.total.padded += got.padded
        self.total.real += got.real
        return got
