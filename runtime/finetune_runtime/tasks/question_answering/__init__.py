"""question-answering: extractive QA (SQuAD-style spans) on an encoder; SQuAD's exact match and F1 (0-100), with
feature preparation and post-processing in squad.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoModelForQuestionAnswering, Trainer

from finetune_runtime import data
from finetune_runtime.config import TaskConfig
from finetune_runtime.tasks.base import MODEL_DIR, load_auto_model, save_full_model
from finetune_runtime.tasks.question_answering import squad
from finetune_runtime.tokenization import load_tokenizer


class QATrainer(Trainer):
    """Trainer whose evaluate() turns start/end logits into answers and scores them (EM/F1)."""

    def __init__(self, *a: Any, eval_examples: Any, context_column: str, answers_column: str, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.eval_examples = eval_examples
        self.context_column = context_column
        self.answers_column = answers_column

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        features: Any = eval_dataset if eval_dataset is not None else self.eval_dataset
        loader = self.get_eval_dataloader(features)
        start = time.monotonic()
        out = self.evaluation_loop(
            loader,
            description="Evaluation",
            prediction_loss_only=False,
            ignore_keys=ignore_keys,
            metric_key_prefix=metric_key_prefix,
        )
        predictions: Any = out.predictions
        start_logits, end_logits = predictions[0], predictions[1]
        preds = squad.postprocess_predictions(
            self.eval_examples, features, start_logits, end_logits, self.context_column
        )
        refs: dict[str, Sequence[str]] = {ex["id"]: list(ex[self.answers_column]["text"]) for ex in self.eval_examples}
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in squad.squad_metrics(preds, refs).items()}
        metrics[f"{metric_key_prefix}_runtime"] = round(time.monotonic() - start, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


def predict_qa(model_dir: Path, samples: list[dict[str, Any]], max_length: int, doc_stride: int) -> dict[str, Any]:
    """transformers' question-answering pipeline where it exists (4.x); transformers 5 dropped that pipeline,
    so there the saved model runs through the same feature/post-processing code as evaluation."""
    from transformers.pipelines import SUPPORTED_TASKS

    tokenizer = load_tokenizer(str(model_dir))
    if "question-answering" in SUPPORTED_TASKS:
        from transformers import pipeline

        qa: Any = pipeline(
            "question-answering",  # type: ignore[call-overload,unused-ignore]
            model=str(model_dir),
            tokenizer=tokenizer,
            device="cpu",
        )
        out = []
        for s in samples:
            r = qa(question=s["question"], context=s["context"], max_seq_len=max_length, doc_stride=doc_stride)
            out.append({**s, "answer": r["answer"], "score": round(float(r["score"]), 6)})
        return {"method": "pipeline:question-answering", "predictions": out}
    import torch

    model = AutoModelForQuestionAnswering.from_pretrained(str(model_dir)).eval()
    examples = [{"id": str(i), **s} for i, s in enumerate(samples)]
    batch = {k: [e[k] for e in examples] for k in ("id", "question", "context")}
    feats = squad.prepare_eval_features(batch, tokenizer, max_length, doc_stride, "question", "context")
    names = [n for n in tokenizer.model_input_names if n in feats]
    with torch.no_grad():
        res = model(**{n: torch.tensor(feats[n]) for n in names})
    features = [
        {"example_id": feats["example_id"][i], "offset_mapping": feats["offset_mapping"][i]}
        for i in range(len(feats["input_ids"]))
    ]
    answers = squad.postprocess_predictions(
        examples, features, res.start_logits.numpy(), res.end_logits.numpy(), "context"
    )
    return {
        "method": "runtime-postprocessing (transformers has no question-answering pipeline)",
        "predictions": [{**s, "answer": answers[str(i)]} for i, s in enumerate(samples)],
    }


class QuestionAnswering:
    name = "question-answering"
    task_options = ("docStride", "inferenceQuestions")
    dataset_options = ("questionColumn", "contextColumn", "answersColumn")
    find_unused_parameters = True  # QA heads leave BERT's pooler unused, which DDP must know
    outputs = (MODEL_DIR,)
    metrics = ("f1", "exact_match")

    def cache_inputs(self, task: TaskConfig) -> dict[str, Any]:
        return {"doc_stride": task.doc_stride}

    def build_dataset(self, raw: Any, task: TaskConfig, tokenizer: Any, seed: int, pad_to_max: bool) -> Any:
        import datasets  # type: ignore[import-untyped,unused-ignore]

        ds = task.dataset
        train, ev = data.train_eval_splits(raw, ds, seed)
        train = data.sample(train, ds.train_samples, seed)
        ev = data.sample(ev, ds.eval_samples, seed)
        if "id" not in ev.column_names:
            ev = ev.add_column("id", [str(i) for i in range(len(ev))])
        cols = (ds.question_column, ds.context_column)
        train_f = train.map(
            lambda b: squad.prepare_train_features(
                b, tokenizer, task.max_length, task.doc_stride, *cols, ds.answers_column
            ),
            batched=True,
            remove_columns=train.column_names,
        )
        eval_f = ev.map(
            lambda b: squad.prepare_eval_features(b, tokenizer, task.max_length, task.doc_stride, *cols),
            batched=True,
            remove_columns=ev.column_names,
        )
        keep = ["id", ds.question_column, ds.context_column, ds.answers_column]
        return datasets.DatasetDict(
            {
                "train": train_f,
                "validation": eval_f,
                "validation_examples": ev.remove_columns([c for c in ev.column_names if c not in keep]),
            }
        )

    def build_model(self, task: TaskConfig, tokenizer: Any, weights_from: Path | None) -> Any:
        return load_auto_model(AutoModelForQuestionAnswering, task, tokenizer, weights_from)

    def trainer(self, task: TaskConfig, dsets: Any, tokenizer: Any, common: dict[str, Any]) -> Any:
        return QATrainer(
            eval_examples=dsets["validation_examples"],
            context_column=task.dataset.context_column,
            answers_column=task.dataset.answers_column,
            **common,
        )

    def save(self, trainer: Any, tokenizer: Any, output_dir: Path, task: TaskConfig) -> None:
        save_full_model(trainer, tokenizer, output_dir / MODEL_DIR)

    def predictions(self, output_dir: Path, task: TaskConfig, dsets: Any) -> dict[str, Any]:
        model_dir = output_dir / MODEL_DIR
        ds, vex = task.dataset, dsets["validation_examples"]
        samples: list[Any] = list(task.inference_questions or []) or [
            {
                "question": ex[ds.question_column],
                "context": ex[ds.context_column],
                "gold": list(ex[ds.answers_column]["text"]),
            }
            for ex in vex.select(range(min(3, len(vex))))
        ]
        return predict_qa(model_dir, samples, task.max_length, task.doc_stride)


PLUGIN = QuestionAnswering()
