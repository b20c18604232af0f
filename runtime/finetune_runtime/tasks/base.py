"""The task plugin interface: what train.py's shared pipeline asks of a task.

A task is one module (or package) `finetune_runtime/tasks/<type with '_' for '-'>` that defines `PLUGIN`, an object
with this Protocol's members. The pipeline (train.py) never branches on the task type: it loads the raw dataset,
asks the plugin for the tokenised splits, the model, the Trainer and its extras, then the predictions; what the
task writes (`outputs`) and which metrics it reports (`metrics`) are the plugin's too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from finetune_runtime.config import TaskConfig

log = logging.getLogger("finetune_runtime")

# spec.task keys every task reads (the pipeline's); a plugin's `task_options` add its own. The operator's schema
# must offer exactly the union (tests/unit/test_task_schema_drift.py).
COMMON_TASK_OPTIONS = ("type", "model", "tokenizer", "dataset", "maxLength", "inferenceSamples")
# spec.task.dataset keys data.py reads for every task (loading, splits, sampling).
COMMON_DATASET_OPTIONS = (
    "name",
    "config",
    "dataFiles",
    "format",
    "path",
    "trainSplit",
    "evalSplit",
    "trainSamples",
    "evalSamples",
)


class TaskPlugin(Protocol):
    """One fine-tuning task. Everything task-specific lives behind these members."""

    # spec.task.type this plugin serves
    name: str
    # spec.task / spec.task.dataset keys this task reads beyond the common ones (the drift test's source)
    task_options: tuple[str, ...]
    dataset_options: tuple[str, ...]
    # DDP must search for parameters without gradients (e.g. BERT's pooler under a QA head)
    find_unused_parameters: bool
    # What `save` writes into the output directory (beside metrics.json and predictions.json, which the pipeline
    # writes): uploaded to an S3 location at the end.
    outputs: tuple[str, ...]
    # The eval metrics it reports (keys of metrics.json's "eval" without the eval_ prefix), most telling first:
    # the progress lines name the first as summaryMetric, which the operator's one-line summary shows.
    metrics: tuple[str, ...]

    def cache_inputs(self, task: TaskConfig) -> dict[str, Any]:
        """Task options that change the tokenised dataset (part of its cache key)."""

    def build_dataset(self, raw: Any, task: TaskConfig, tokenizer: Any, seed: int, pad_to_max: bool) -> Any:
        """A DatasetDict with `train` and `validation` (model inputs) plus any extra splits the plugin reads
        back in `trainer` and `predictions` (kept in the same cache entry)."""

    def build_model(self, task: TaskConfig, tokenizer: Any, weights_from: Path | None) -> Any:
        """The model to train: from task.model, or from a finished checkpoint (`weights_from`)."""

    def trainer(self, task: TaskConfig, dsets: Any, tokenizer: Any, common: dict[str, Any]) -> Any:
        """A transformers Trainer (or subclass) built from `common` (model, args, datasets, callbacks, ...)."""

    def save(self, trainer: Any, tokenizer: Any, output_dir: Path, task: TaskConfig) -> None:
        """Write the final model (and tokenizer) into output_dir, as `outputs` names; rank 0 only."""

    def predictions(self, output_dir: Path, task: TaskConfig, dsets: Any) -> dict[str, Any]:
        """predictions.json: {"method": ..., "predictions": [...]} from the model `save` wrote."""


MODEL_DIR = "model"  # the final model (and tokenizer) every task saves, under the output directory


def has_weights(model_dir: Path) -> bool:
    """The directory holds a transformers model's weights (the file names are transformers' own)."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    names = (SAFE_WEIGHTS_NAME, WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME)
    return any((model_dir / n).exists() for n in names)


def load_auto_model(auto_cls: Any, task: TaskConfig, tokenizer: Any, weights_from: Path | None, **kwargs: Any) -> Any:
    """`auto_cls` from a checkpoint, from task.model, or from a config-only directory (random weights: the
    tiny models under examples/ ship a config and a tokenizer only)."""
    from transformers import AutoConfig

    local = Path(task.model)
    if weights_from is not None:
        model = auto_cls.from_pretrained(str(weights_from), **kwargs)
    elif local.is_dir() and (local / "config.json").exists() and not has_weights(local):
        log.info("%s has a config but no weights: initialising the model from its config (random weights)", task.model)
        model = auto_cls.from_config(AutoConfig.from_pretrained(task.model, **kwargs))
    else:
        model = auto_cls.from_pretrained(task.model, **kwargs)
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        log.info("resizing token embeddings to the tokenizer's %d entries", len(tokenizer))
        model.resize_token_embeddings(len(tokenizer))
    return model


def save_full_model(trainer: Any, tokenizer: Any, model_dir: Path) -> None:
    trainer.save_model(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
