"""text-classification: a sequence-classification head on an encoder; accuracy and F1; the saved model runs
through transformers' text-classification pipeline for the predictions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoModelForSequenceClassification, Trainer

from finetune_runtime import data
from finetune_runtime.config import DatasetConfig, TaskConfig
from finetune_runtime.tasks.base import MODEL_DIR, load_auto_model, save_full_model
from finetune_runtime.tokenization import load_tokenizer

DEFAULT_SAMPLES = {
    "ja": [
        "この商品はとても使いやすく、買って本当に良かったです。",
        "一週間で壊れてしまいました。最悪です。二度と買いません。",
        "値段の割に品質が良く、家族にも好評で満足しています。",
    ],
    "en": [
        "Works perfectly and arrived early, I love it.",
        "Broke after two days. A complete waste of money.",
        "Good quality for the price, I would buy it again.",
    ],
}


def detect_language(texts: list[str]) -> str:
    joined = "".join(texts[:20])
    cjk = sum(1 for c in joined if "\u3040" <= c <= "\u30ff" or "\u4e00" <= c <= "\u9fff")
    return "ja" if cjk > len(joined) * 0.2 else "en"


def map_label(value: Any, label_map: dict[str, int] | None, names: list[str] | None) -> int | None:
    """Label id for a raw label value, or None when the row must be dropped.

    With a labelMap, its string keys decide (unlisted values, e.g. 3 stars, are dropped). Without one, ints
    are ids already and strings are looked up in `labels` (the label names)."""
    if value is None:
        return None
    if label_map is not None:
        key = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        return label_map.get(key)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if names and value in names:
            return names.index(value)
        if value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def label_names(task: TaskConfig) -> list[str]:
    """Names for the model's id2label: `labels` if given, else derived from the labelMap ids."""
    if task.labels:
        return list(task.labels)
    lm = task.dataset.label_map
    if lm:
        return [f"LABEL_{i}" for i in range(max(lm.values()) + 1)]
    raise ValueError("text-classification needs task.labels or task.dataset.labelMap to know the label set")


def select_classification(dsplit: Any, ds: DatasetConfig, names: list[str]) -> Any:
    """Keep text (+pair) and an integer `labels` column; drop rows whose label does not map."""
    for col in (ds.text_column, ds.label_column, ds.text_pair_column):
        if col and col not in dsplit.column_names:
            raise KeyError(f"column {col!r} not in dataset (has {dsplit.column_names})")

    def _map(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {"labels": [map_label(v, ds.label_map, names) for v in batch[ds.label_column]]}

    out = dsplit.map(_map, batched=True)
    out = out.filter(lambda b: [x is not None and 0 <= x < len(names) for x in b["labels"]], batched=True)
    keep = [c for c in (ds.text_column, ds.text_pair_column, "labels") if c]
    return out.remove_columns([c for c in out.column_names if c not in keep])


def classification_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy and F1 (binary F1 of label 1 for two labels, macro F1 otherwise)."""
    preds = np.asarray(logits).argmax(-1)
    labels = np.asarray(labels)
    n_labels = int(max(np.asarray(logits).shape[-1], 2))
    f1s = []
    for c in range(n_labels):
        tp = int(((preds == c) & (labels == c)).sum())
        fp = int(((preds == c) & (labels != c)).sum())
        fn = int(((preds != c) & (labels == c)).sum())
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    f1 = f1s[1] if n_labels == 2 else float(np.mean(f1s))
    return {"accuracy": float((preds == labels).mean()) if len(labels) else 0.0, "f1": float(f1)}


class TextClassification:
    name = "text-classification"
    task_options = ("labels",)
    dataset_options = ("textColumn", "textPairColumn", "labelColumn", "labelMap")
    find_unused_parameters = False  # a classification head uses every parameter
    outputs = (MODEL_DIR,)
    metrics = ("accuracy", "f1")

    def cache_inputs(self, task: TaskConfig) -> dict[str, Any]:
        return {"labels": task.labels}

    def build_dataset(self, raw: Any, task: TaskConfig, tokenizer: Any, seed: int, pad_to_max: bool) -> Any:
        import datasets  # type: ignore[import-untyped,unused-ignore]

        ds = task.dataset
        names = label_names(task)
        train, ev = data.train_eval_splits(raw, ds, seed)
        train = data.sample(select_classification(train, ds, names), ds.train_samples, seed)
        ev = data.sample(select_classification(ev, ds, names), ds.eval_samples, seed)

        def tok(batch: dict[str, list[Any]]) -> Any:
            pair = batch[ds.text_pair_column] if ds.text_pair_column else None
            return tokenizer(
                batch[ds.text_column],
                pair,
                truncation=True,
                max_length=task.max_length,
                padding="max_length" if pad_to_max else False,
            )

        text_cols = [c for c in (ds.text_column, ds.text_pair_column) if c]
        return datasets.DatasetDict(
            {
                "train": train.map(tok, batched=True, remove_columns=text_cols),
                "validation": ev.map(tok, batched=True, remove_columns=text_cols),
                # the texts are kept for the language guess of the default inference samples
                "validation_text": ev.remove_columns([c for c in ev.column_names if c != ds.text_column]),
            }
        )

    def build_model(self, task: TaskConfig, tokenizer: Any, weights_from: Path | None) -> Any:
        names = label_names(task)
        return load_auto_model(
            AutoModelForSequenceClassification,
            task,
            tokenizer,
            weights_from,
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
        )

    def trainer(self, task: TaskConfig, dsets: Any, tokenizer: Any, common: dict[str, Any]) -> Any:
        return Trainer(
            compute_metrics=lambda p: classification_metrics(np.asarray(p.predictions), np.asarray(p.label_ids)),
            **common,
        )

    def save(self, trainer: Any, tokenizer: Any, output_dir: Path, task: TaskConfig) -> None:
        save_full_model(trainer, tokenizer, output_dir / MODEL_DIR)

    def predictions(self, output_dir: Path, task: TaskConfig, dsets: Any) -> dict[str, Any]:
        model_dir = output_dir / MODEL_DIR
        from transformers import pipeline

        lang = detect_language(list(dsets["validation_text"][task.dataset.text_column]))
        samples = task.inference_samples or DEFAULT_SAMPLES[lang]
        clf = pipeline(
            "text-classification",
            model=str(model_dir),  # type: ignore[call-overload,unused-ignore]
            tokenizer=load_tokenizer(str(model_dir)),
            device="cpu",
        )
        results = clf(samples)
        return {
            "method": "pipeline:text-classification",
            "predictions": [
                {"text": s, "label": r["label"], "score": round(float(r["score"]), 6)}
                for s, r in zip(samples, results, strict=True)
            ],
        }


PLUGIN = TextClassification()
