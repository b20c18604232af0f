"""The job config (`$FTJOB_CONFIG`): camelCase JSON as in the FineTuneJob CRD, parsed into typed dataclasses.

The operator applies CRD defaults before writing config.json; the defaults here repeat them so that a config
written by hand (tests, `ftjob run`, examples/jobs) behaves the same.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_runtime.task_types import task_types

# The task types are the plugin modules under finetune_runtime/tasks/ (one module per type), found by name: this
# module imports no plugin (the plugins import it).
TASK_TYPES = task_types()
# datasets' packaged builders that task.dataset.dataFiles can name (task.dataset.format).
DATA_FILE_FORMATS = ("json", "csv", "parquet")


class ConfigError(ValueError):
    """The config is missing something the runtime needs; the message names the key."""


@dataclass(frozen=True)
class DatasetConfig:
    name: str | None = None
    config: str | None = None
    path: str | None = None
    # split -> file, URL or glob (hf://datasets/..., local, fsspec); `format` is told from the names when None.
    data_files: dict[str, str] | None = None
    format: str | None = None
    train_split: str = "train"
    eval_split: str | None = "validation"
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    label_map: dict[str, int] | None = None
    train_samples: int | None = None
    eval_samples: int | None = None
    question_column: str = "question"
    context_column: str = "context"
    answers_column: str = "answers"
    # task.dataset as given: task plugins read their own columns from it (e.g. causal-lm's messagesColumn)
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DatasetConfig:
        sources = [k for k in ("name", "dataFiles", "path") if d.get(k)]
        if len(sources) != 1:
            raise ConfigError(
                "task.dataset needs exactly one of 'name' (hub dataset), 'dataFiles' (files per "
                f"split) and 'path' (local file/dir), got {sources or 'none'}"
            )
        data_files = d.get("dataFiles")
        if data_files is not None and not (
            isinstance(data_files, dict) and all(isinstance(v, str) and v for v in data_files.values())
        ):
            raise ConfigError(
                "task.dataset.dataFiles must map split names to a file, URL or glob, e.g. "
                '{"train": "hf://datasets/<owner>/<name>/train.jsonl"}'
            )
        if d.get("format") not in (None, *DATA_FILE_FORMATS):
            raise ConfigError(
                f"task.dataset.format must be one of {', '.join(DATA_FILE_FORMATS)}, got {d.get('format')!r}"
            )
        label_map = d.get("labelMap")
        return cls(
            name=d.get("name"),
            config=d.get("config"),
            path=d.get("path"),
            data_files={str(k): str(v) for k, v in data_files.items()} if data_files else None,
            format=d.get("format"),
            train_split=d.get("trainSplit") or "train",
            eval_split=d.get("evalSplit", "validation"),
            text_column=d.get("textColumn") or "text",
            text_pair_column=d.get("textPairColumn"),
            label_column=d.get("labelColumn") or "label",
            # JSON object keys are strings anyway; normalising here makes `3` and "3" the same key.
            label_map={str(k): int(v) for k, v in label_map.items()} if label_map else None,
            train_samples=_opt_int(d.get("trainSamples")),
            eval_samples=_opt_int(d.get("evalSamples")),
            question_column=d.get("questionColumn") or "question",
            context_column=d.get("contextColumn") or "context",
            answers_column=d.get("answersColumn") or "answers",
            raw=dict(d),
        )


@dataclass(frozen=True)
class TaskConfig:
    type: str
    model: str
    dataset: DatasetConfig
    tokenizer: str | None = None
    max_length: int = 128
    doc_stride: int = 32  # the CRD's default (api/schema.py), for a config written by hand; the operator writes it
    labels: list[str] | None = None
    inference_samples: list[str] | None = None  # text-classification: sentences; causal-lm: prompts
    inference_questions: list[dict[str, str]] | None = None  # question-answering: {question, context}
    # task as given: task plugins parse their own options from it (e.g. causal-lm's lora)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer or self.model

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskConfig:
        ttype = d.get("type")
        if ttype not in TASK_TYPES:
            raise ConfigError(f"task.type must be one of {', '.join(TASK_TYPES)}, got {ttype!r}")
        if not d.get("model"):
            raise ConfigError("task.model is required (hub name or local directory)")
        if "dataset" not in d or not isinstance(d["dataset"], dict):
            raise ConfigError("task.dataset is required")
        samples, questions = _inference(ttype, d)
        return cls(
            type=ttype,
            model=d["model"],
            tokenizer=d.get("tokenizer"),
            max_length=int(d.get("maxLength") or 128),
            doc_stride=int(d.get("docStride") or 32),
            labels=list(d["labels"]) if d.get("labels") else None,
            inference_samples=samples,
            inference_questions=questions,
            dataset=DatasetConfig.from_dict(d["dataset"]),
            raw=dict(d),
        )


def _inference(ttype: str, d: dict[str, Any]) -> tuple[list[str] | None, list[dict[str, str]] | None]:
    """The inference check's inputs, checked before training so a wrong shape never fails a finished run."""
    samples, questions = d.get("inferenceSamples") or None, d.get("inferenceQuestions") or None
    if ttype == "question-answering":  # the one task whose inference inputs are objects
        if samples:
            raise ConfigError(
                "task.inferenceSamples are sentences for text-classification; for "
                "question-answering give task.inferenceQuestions: [{question: ..., context: ...}]"
            )
        for i, q in enumerate(questions or []):
            if not (isinstance(q, dict) and isinstance(q.get("question"), str) and isinstance(q.get("context"), str)):
                raise ConfigError(f"task.inferenceQuestions[{i}] must be {{question: <text>, context: <text>}}")
        return None, [{"question": q["question"], "context": q["context"]} for q in questions or []] or None
    if questions:
        raise ConfigError("task.inferenceQuestions apply to question-answering only; give task.inferenceSamples")
    if samples and not all(isinstance(x, str) for x in samples):
        raise ConfigError("task.inferenceSamples must be a list of sentences (strings)")
    return (list(samples) if samples else None), None


@dataclass(frozen=True)
class TrainingConfig:
    epochs: float = 3.0
    max_steps: int | None = None
    learning_rate: float = 5e-5
    batch_size_per_device: int = 8
    gradient_accumulation_steps: int = 1
    precision: str = "fp32"
    seed: int = 42
    checkpoint_every_steps: int = 500
    log_every_steps: int = 10
    eval_every_steps: int | None = None
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    compile: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainingConfig:
        precision = d.get("precision") or "fp32"
        if precision not in ("fp32", "bf16"):
            raise ConfigError(f"training.precision must be fp32 or bf16, got {precision!r}")
        return cls(
            epochs=float(d.get("epochs", 3.0)),
            max_steps=_opt_int(d.get("maxSteps")),
            learning_rate=float(d.get("learningRate", 5e-5)),
            batch_size_per_device=int(d.get("batchSizePerDevice") or 8),
            gradient_accumulation_steps=int(d.get("gradientAccumulationSteps") or 1),
            precision=precision,
            seed=int(d.get("seed", 42)),
            checkpoint_every_steps=int(d.get("checkpointEverySteps") or 500),
            log_every_steps=int(d.get("logEverySteps") or 10),
            eval_every_steps=_opt_int(d.get("evalEverySteps")),
            warmup_ratio=float(d.get("warmupRatio") or 0.0),
            weight_decay=float(d.get("weightDecay") or 0.0),
            compile=bool(d.get("compile", False)),
        )


@dataclass(frozen=True)
class CompileCacheConfig:
    precompile: bool = False
    # The trial's steps: the operator writes the schema's default into config.json (and FTJOB_PRECOMPILE_STEPS);
    # a config written by hand that precompiles names them (train.py says so when neither does).
    precompile_steps: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompileCacheConfig:
        # url/claimName are the operator's business: the pod sees them as FTJOB_CACHE_DIR / NEURON_COMPILE_CACHE_URL.
        return cls(precompile=bool(d.get("precompile", False)), precompile_steps=_opt_int(d.get("precompileSteps")))


@dataclass(frozen=True)
class JobConfig:
    job_name: str
    namespace: str
    task: TaskConfig | None
    training: TrainingConfig = field(default_factory=TrainingConfig)
    compile_cache: CompileCacheConfig = field(default_factory=CompileCacheConfig)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobConfig:
        task = d.get("task")
        return cls(
            job_name=str(d.get("jobName") or "ftjob"),
            namespace=str(d.get("namespace") or "default"),
            task=TaskConfig.from_dict(task) if task else None,
            training=TrainingConfig.from_dict(d.get("training") or {}),
            compile_cache=CompileCacheConfig.from_dict(d.get("compileCache") or {}),
        )


def load_config(path: str | os.PathLike[str] | None = None) -> JobConfig:
    """Read `$FTJOB_CONFIG` (or `path`). Relative dataset/model paths stay relative to the working directory."""
    p = path or os.environ.get("FTJOB_CONFIG")
    if not p:
        raise ConfigError("FTJOB_CONFIG is not set (path of the job's config.json)")
    try:
        raw = json.loads(Path(p).read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"config file {p} does not exist") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file {p} is not valid JSON: {e}") from e
    return JobConfig.from_dict(raw)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)
