"""causal-lm: supervised fine-tuning (SFT) of a decoder language model on instruction or chat data.

Rows are either a `messages` column (a list of {role, content}, rendered with the tokenizer's chat template) or
prompt/response columns (rendered as one user and one assistant turn through the same template; plain
`prompt\\nresponse<eos>` when the tokenizer has none). The loss covers the assistant turns only: every other
token is labelled -100. Metrics: eval loss and perplexity (exp of the eval loss). Predictions: greedy
generations for a few prompts from the saved model. With `task.lora`, only LoRA adapters (peft) train; the
adapter is saved in model/, and with `lora.merge` the merged full model in model-merged/ too.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq, Trainer, TrainerCallback

from finetune_runtime import data
from finetune_runtime.config import ConfigError, DatasetConfig, TaskConfig
from finetune_runtime.tasks.base import MODEL_DIR, has_weights, load_auto_model, save_full_model
from finetune_runtime.tokenization import load_tokenizer

log = logging.getLogger("finetune_runtime")

IGNORE_INDEX = -100  # the label value torch's cross entropy (and so every HF causal LM) skips
GENERATION_TOKENS = 48  # new tokens per sample generation in predictions.json
DEFAULT_PROMPTS = 3  # eval prompts used for the predictions when task.inferenceSamples is not set
BASE_MODEL_DIR = "base-model"  # beside model/: the base weights an adapter needs when task.model had none
MERGED_DIR = "model-merged"


@dataclass(frozen=True)
class LoraOptions:
    """task.lora (camelCase keys in the spec); defaults repeat the operator's schema."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] | None = None  # None: peft's default for the model type (Llama: q_proj, v_proj)
    merge: bool = False

    @classmethod
    def from_task(cls, task: TaskConfig) -> LoraOptions | None:
        d = task.raw.get("lora")
        if d is None:
            return None
        if not isinstance(d, dict):
            raise ConfigError("task.lora must be an object, e.g. {r: 8, alpha: 16, targetModules: [q_proj, v_proj]}")
        unknown = set(d) - {"r", "alpha", "dropout", "targetModules", "merge"}
        if unknown:
            raise ConfigError(
                f"task.lora has unknown keys {sorted(unknown)}; known: r, alpha, dropout, targetModules, merge"
            )
        opts = cls(
            r=int(d.get("r", 8)),
            alpha=int(d.get("alpha", 16)),
            dropout=float(d.get("dropout", 0.05)),
            target_modules=[str(m) for m in d["targetModules"]] if d.get("targetModules") else None,
            merge=bool(d.get("merge", False)),
        )
        if opts.r < 1:
            raise ConfigError(f"task.lora.r must be at least 1, got {opts.r}")
        if not 0.0 <= opts.dropout < 1.0:
            raise ConfigError(f"task.lora.dropout must be in [0, 1), got {opts.dropout}")
        return opts


@dataclass(frozen=True)
class Columns:
    messages: str
    prompt: str
    response: str

    @classmethod
    def of(cls, ds: DatasetConfig) -> Columns:
        return cls(
            messages=str(ds.raw.get("messagesColumn") or "messages"),
            prompt=str(ds.raw.get("promptColumn") or "prompt"),
            response=str(ds.raw.get("responseColumn") or "response"),
        )


def to_messages(row: dict[str, Any], cols: Columns) -> list[dict[str, str]]:
    if cols.messages in row and row[cols.messages] is not None:
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in row[cols.messages]]
    return [
        {"role": "user", "content": str(row[cols.prompt])},
        {"role": "assistant", "content": str(row[cols.response])},
    ]


def render(messages: list[dict[str, str]], tokenizer: Any) -> tuple[str, list[tuple[int, int]]]:
    """The conversation as text and the character spans of its assistant turns (what the loss covers).

    Each assistant turn's span is what the template adds for it after the generation prompt, so the turn's
    end marker (e.g. <|end|>, the eos) is learnt too and generation knows where to stop."""
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("a training conversation needs at least one assistant turn")
    if getattr(tokenizer, "chat_template", None):
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            through = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
            if not through.startswith(before):
                raise ValueError(
                    "the tokenizer's chat template does not render a conversation as a prefix of "
                    "its continuation; loss masking needs that (use prompt/response columns with "
                    "a template that does)"
                )
            spans.append((len(before), len(through)))
        return str(tokenizer.apply_chat_template(messages, tokenize=False)), spans
    # No template: plain prompt/response text, one exchange.
    if [m["role"] for m in messages] != ["user", "assistant"]:
        raise ValueError(
            "the tokenizer has no chat template: only one user and one assistant turn (prompt/"
            "response) can be rendered; give the tokenizer a chat_template for conversations"
        )
    prompt = messages[0]["content"] + "\n"
    text = prompt + messages[1]["content"] + (tokenizer.eos_token or "")
    return text, [(len(prompt), len(text))]


def tokenize_masked(text: str, spans: list[tuple[int, int]], tokenizer: Any, max_length: int) -> dict[str, Any]:
    """input_ids/attention_mask of `text`, with labels = input_ids inside `spans` and -100 elsewhere."""
    enc = tokenizer(text, add_special_tokens=False, truncation=True, max_length=max_length, return_offsets_mapping=True)
    labels = [
        tid if any(s <= start < e for s, e in spans) else IGNORE_INDEX
        for tid, (start, _) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
    ]
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}


def prompt_messages(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation up to its first assistant turn: what a generation continues."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:first]


class PerplexityCallback(TrainerCallback):
    """Adds eval_perplexity = exp(eval_loss) to the metrics dict every later callback (progress lines) and the
    caller of evaluate() see. A callback rather than a Trainer subclass, so any Trainer class can run it."""

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if metrics is not None and "eval_loss" in metrics:
            loss = float(metrics["eval_loss"])
            metrics["eval_perplexity"] = math.exp(loss) if loss < 700 else math.inf


class CausalLM:
    name = "causal-lm"
    task_options = ("lora",)
    dataset_options = ("messagesColumn", "promptColumn", "responseColumn")
    find_unused_parameters = False  # every trainable parameter (full model or the adapters) gets a gradient
    outputs = (MODEL_DIR, MERGED_DIR, BASE_MODEL_DIR)  # the last two only with task.lora (merge; a config-only base)
    metrics = ("perplexity", "loss")

    def cache_inputs(self, task: TaskConfig) -> dict[str, Any]:
        return {"columns": asdict(Columns.of(task.dataset))}

    def build_dataset(self, raw: Any, task: TaskConfig, tokenizer: Any, seed: int, pad_to_max: bool) -> Any:
        import datasets  # type: ignore[import-untyped,unused-ignore]

        cols = Columns.of(task.dataset)
        train, ev = data.train_eval_splits(raw, task.dataset, seed)
        train = data.sample(train, task.dataset.train_samples, seed)
        ev = data.sample(ev, task.dataset.eval_samples, seed)
        for split in (train, ev):
            if cols.messages not in split.column_names and not {cols.prompt, cols.response} <= set(split.column_names):
                raise KeyError(
                    f"causal-lm needs a {cols.messages!r} column or {cols.prompt!r} and "
                    f"{cols.response!r} columns (task.dataset.messagesColumn, promptColumn, "
                    f"responseColumn); the dataset has {split.column_names}"
                )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

        def tok(row: dict[str, Any]) -> dict[str, Any]:
            out = tokenize_masked(*render(to_messages(row, cols), tokenizer), tokenizer, task.max_length)
            if pad_to_max:  # static shapes for XLA
                n = task.max_length - len(out["input_ids"])
                out = {
                    "input_ids": out["input_ids"] + [pad_id] * n,
                    "attention_mask": out["attention_mask"] + [0] * n,
                    "labels": out["labels"] + [IGNORE_INDEX] * n,
                }
            return out

        def trainable(split: Any) -> Any:
            mapped = split.map(tok, remove_columns=split.column_names)
            # A row whose response was truncated away entirely would only add a zero-loss step.
            return mapped.filter(lambda r: any(x != IGNORE_INDEX for x in r["labels"]))

        prompts = [
            {"messages": prompt_messages(to_messages(r, cols))} for r in ev.select(range(min(DEFAULT_PROMPTS, len(ev))))
        ]
        return datasets.DatasetDict(
            {
                "train": trainable(train),
                "validation": trainable(ev),
                "validation_prompts": data.dataset_from_rows(prompts),
            }
        )

    def build_model(self, task: TaskConfig, tokenizer: Any, weights_from: Path | None) -> Any:
        lora = LoraOptions.from_task(task)
        if lora is None:
            return load_auto_model(AutoModelForCausalLM, task, tokenizer, weights_from)
        from peft import LoraConfig, PeftModel, get_peft_model

        base = load_auto_model(AutoModelForCausalLM, task, tokenizer, None)
        if weights_from is not None:  # a finished run's checkpoint holds the adapter only
            return PeftModel.from_pretrained(base, str(weights_from), is_trainable=True)
        config = LoraConfig(
            task_type="CAUSAL_LM",
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
        )
        model = get_peft_model(base, config)
        trainable, total = model.get_nb_trainable_parameters()
        targets: Any = getattr(model.peft_config["default"], "target_modules", None)
        log.info(
            "LoRA r=%d alpha=%d on %s: %d of %d parameters train",
            lora.r,
            lora.alpha,
            sorted(targets or []),
            trainable,
            total,
        )
        return model

    def trainer(self, task: TaskConfig, dsets: Any, tokenizer: Any, common: dict[str, Any]) -> Any:
        collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, padding=True)
        # Perplexity first: the progress callback after it then reports it in the eval lines.
        return Trainer(data_collator=collator, **{**common, "callbacks": [PerplexityCallback(), *common["callbacks"]]})

    def save(self, trainer: Any, tokenizer: Any, output_dir: Path, task: TaskConfig) -> None:
        model_dir = output_dir / MODEL_DIR
        lora = LoraOptions.from_task(task)
        if lora is None:
            save_full_model(trainer, tokenizer, model_dir)
            return
        model = trainer.accelerator.unwrap_model(trainer.model)
        local = Path(task.model)
        if local.is_dir() and not has_weights(local):
            # The base was initialised from its config (random weights): the adapter is useless without
            # exactly those weights, so they are saved beside it (a copy without the LoRA layers: such
            # config-only models are tiny) and the adapter points at them.
            import copy

            base_dir = output_dir / BASE_MODEL_DIR
            copy.deepcopy(model).unload().save_pretrained(str(base_dir))
            tokenizer.save_pretrained(str(base_dir))
            model.peft_config["default"].base_model_name_or_path = str(base_dir)
            log.info("%s has no weights: saved the initialised base model to %s for the adapter", task.model, base_dir)
        model.save_pretrained(str(model_dir))  # adapter_config.json + adapter_model.safetensors
        tokenizer.save_pretrained(str(model_dir))
        if lora.merge:
            # In place: training is over and the predictions load the saved files, not this object.
            merged = model.merge_and_unload()
            merged.save_pretrained(str(output_dir / MERGED_DIR))
            tokenizer.save_pretrained(str(output_dir / MERGED_DIR))

    def predictions(self, output_dir: Path, task: TaskConfig, dsets: Any) -> dict[str, Any]:
        import torch

        model_dir = output_dir / MODEL_DIR
        tokenizer = load_tokenizer(str(model_dir))
        if (model_dir / "adapter_config.json").exists():
            from peft import AutoPeftModelForCausalLM

            model: Any = AutoPeftModelForCausalLM.from_pretrained(str(model_dir))
            method = "peft:base+adapter greedy generation"
        else:
            model = AutoModelForCausalLM.from_pretrained(str(model_dir))
            method = "greedy generation"
        model = model.float().eval()  # CPU inference check: fp32 whatever the training precision was
        if task.inference_samples:
            conversations = [[{"role": "user", "content": str(s)}] for s in task.inference_samples]
        else:
            conversations = [list(r["messages"]) for r in dsets["validation_prompts"]]
        out = []
        for conv in conversations:
            if getattr(tokenizer, "chat_template", None):
                text = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            else:
                text = conv[-1]["content"] + "\n"
            enc = tokenizer(text, add_special_tokens=False, return_tensors="pt")
            # Decoders take no token_type_ids, which some tokenizers (4.x fast tokenizers) still return.
            ids = {k: enc[k] for k in ("input_ids", "attention_mask") if k in enc}
            with torch.no_grad():
                gen = model.generate(
                    **ids,
                    max_new_tokens=GENERATION_TOKENS,
                    do_sample=False,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                )
            new = gen[0][ids["input_ids"].shape[1] :]
            out.append(
                {"prompt": conv[-1]["content"], "generation": tokenizer.decode(new, skip_special_tokens=True).strip()}
            )
        return {"method": method, "predictions": out}


PLUGIN = CausalLM()
