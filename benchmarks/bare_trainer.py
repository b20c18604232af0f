"""The baseline for runtime_overhead.py: a plain Hugging Face Trainer script, as a user would write it.

    python benchmarks/bare_trainer.py CONFIG.json OUTPUT_DIR

It reads the same job config the runtime reads (model, data, labelMap, hyperparameters) but uses none of the
runtime's code: datasets + AutoTokenizer + AutoModelForSequenceClassification + Trainer, eval every epoch and a
checkpoint every `checkpointEverySteps`. On each Trainer log with a loss it prints `BENCH-STEP <step>`, the
line runtime_overhead.py times (the runtime's own progress lines fire on the same Trainer logs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class StepLines(TrainerCallback):
    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            print(f"BENCH-STEP {state.global_step}", flush=True)


def main(config_path: str, out_dir: str) -> int:
    import datasets  # type: ignore[import-untyped,unused-ignore]

    cfg = json.loads(Path(config_path).read_text(encoding="utf-8"))
    task, t = cfg["task"], cfg["training"]
    ds, labels = task["dataset"], task["labels"]
    folder = Path(ds["path"])
    raw = datasets.load_dataset(
        "json",
        data_files={
            "train": str(folder / f"{ds['trainSplit']}.jsonl"),
            "validation": str(folder / f"{ds['evalSplit']}.jsonl"),
        },
    )
    label_map = {str(k): v for k, v in ds["labelMap"].items()}
    tokenizer = AutoTokenizer.from_pretrained(task["model"])

    def prepare(batch: dict[str, list[Any]]) -> Any:
        out = tokenizer(batch[ds["textColumn"]], truncation=True, max_length=task["maxLength"])
        out["labels"] = [label_map.get(str(v), -1) for v in batch[ds["labelColumn"]]]
        return out

    data = raw.map(prepare, batched=True, remove_columns=raw["train"].column_names)
    data = data.filter(lambda b: [x >= 0 for x in b["labels"]], batched=True)
    config = AutoConfig.from_pretrained(
        task["model"],
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
    )
    model = AutoModelForSequenceClassification.from_config(config)
    args = TrainingArguments(
        output_dir=out_dir,
        num_train_epochs=t["epochs"],
        learning_rate=t["learningRate"],
        per_device_train_batch_size=t["batchSizePerDevice"],
        per_device_eval_batch_size=t["batchSizePerDevice"],
        weight_decay=t["weightDecay"],
        warmup_steps=t["warmupRatio"],
        seed=t["seed"],
        data_seed=t["seed"],
        logging_steps=t["logEverySteps"],
        logging_first_step=True,
        eval_strategy="epoch",
        save_strategy="steps",
        save_steps=t["checkpointEverySteps"],
        save_total_limit=3,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )

    def metrics(p: Any) -> dict[str, float]:
        return {"accuracy": float((np.asarray(p.predictions).argmax(-1) == np.asarray(p.label_ids)).mean())}

    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        processing_class=tokenizer,
        compute_metrics=metrics,
        callbacks=[StepLines()],
    )
    trainer.train()
    trainer.save_model(str(Path(out_dir) / "model"))
    print("BENCH-DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
