"""The `worker` command: one training process (started by torchrun or mpirun, or alone).

Flow: map the launcher's env -> read config -> backend plan -> tokenizer/model -> tokenised dataset (rank 0
builds the cache, others wait) -> HF Trainer (resuming from the newest complete checkpoint) -> final eval ->
rank 0 saves model/, metrics.json, predictions.json and prints the `done` progress line.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from finetune_runtime import checkpoints, data, s3sync, squad
from finetune_runtime.backends import BackendPlan, backend_from_env, optimize_for_backend, plan_backend, prepare_process
from finetune_runtime.config import QUESTION_ANSWERING, JobConfig, TaskConfig, load_config
from finetune_runtime.distenv import DistInfo, apply_distributed_env
from finetune_runtime.progress import ProgressEmitter, clean_metrics, utc_now
from finetune_runtime.tokenization import load_tokenizer

log = logging.getLogger("finetune_runtime")

DEFAULT_SAMPLES = {
    ("text-classification", "ja"): ["この商品はとても使いやすく、買って本当に良かったです。",
                                     "一週間で壊れてしまいました。最悪です。二度と買いません。",
                                     "値段の割に品質が良く、家族にも好評で満足しています。"],
    ("text-classification", "en"): ["Works perfectly and arrived early, I love it.",
                                    "Broke after two days. A complete waste of money.",
                                    "Good quality for the price, I would buy it again."],
}
SAVE_TOTAL_LIMIT = 3  # checkpoints kept on the output volume (newest ones); bounds the PVC size a job needs


@dataclass(frozen=True)
class Paths:
    output: Path
    cache: Path

    @property
    def checkpoints(self) -> Path:
        return self.output / "checkpoints"

    @property
    def model(self) -> Path:
        return self.output / "model"


def setup_logging(info: DistInfo) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {info.rank}] %(name)s: %(message)s",
                        force=True)
    if not info.is_main:
        # Other ranks print only warnings; the rank-0 log is the one people (and the operator) read.
        logging.getLogger().setLevel(logging.WARNING)


def resolve_paths(env: dict[str, str]) -> Paths:
    out = Path(env.get("FTJOB_OUTPUT_DIR") or "ftjob-output").resolve()
    cache = Path(env.get("FTJOB_CACHE_DIR") or out / ".cache").resolve()
    return Paths(out, cache)


def set_cache_env(paths: Paths, plan: BackendPlan, use_compile: bool) -> None:
    """Cache locations under FTJOB_CACHE_DIR (must happen before transformers/datasets/torch._inductor load)."""
    os.environ.setdefault("HF_HOME", str(paths.cache / "hf"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(paths.cache / "hf" / "datasets"))
    if use_compile and plan.name != "neuron":
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(paths.cache / "torch-compile"))
        os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
        os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")


def detect_language(texts: list[str]) -> str:
    joined = "".join(texts[:20])
    cjk = sum(1 for c in joined if "\u3040" <= c <= "\u30ff" or "\u4e00" <= c <= "\u9fff")
    return "ja" if cjk > len(joined) * 0.2 else "en"


# --- model ------------------------------------------------------------------------------------------------

def has_weights(model_dir: Path) -> bool:
    return any((model_dir / n).exists() for n in ("model.safetensors", "pytorch_model.bin",
                                                 "model.safetensors.index.json", "pytorch_model.bin.index.json"))


def build_model(task: TaskConfig, names: list[str] | None, tokenizer: Any, weights_from: Path | None = None) -> Any:
    from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoModelForSequenceClassification

    kwargs: dict[str, Any] = {}
    if task.type == QUESTION_ANSWERING:
        cls: Any = AutoModelForQuestionAnswering
    else:
        assert names is not None
        cls = AutoModelForSequenceClassification
        kwargs = {"num_labels": len(names), "id2label": dict(enumerate(names)),
                  "label2id": {n: i for i, n in enumerate(names)}}
    local = Path(task.model)
    if weights_from is not None:
        model = cls.from_pretrained(str(weights_from), **kwargs)
    elif local.is_dir() and (local / "config.json").exists() and not has_weights(local):
        log.info("%s has a config but no weights: initialising the model from its config (random weights)",
                 task.model)
        config = AutoConfig.from_pretrained(task.model, **kwargs)
        model = cls.from_config(config)
    else:
        model = cls.from_pretrained(task.model, **kwargs)
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        log.info("resizing token embeddings to the tokenizer's %d entries", len(tokenizer))
        model.resize_token_embeddings(len(tokenizer))
    return model


# --- data -------------------------------------------------------------------------------------------------

def build_classification(raw: Any, task: TaskConfig, tokenizer: Any, names: list[str], seed: int,
                         pad_to_max: bool) -> Any:
    import datasets  # type: ignore[import-untyped,unused-ignore]

    ds = task.dataset
    train, ev = data.train_eval_splits(raw, ds, seed)
    train = data.sample(data.select_classification(train, ds, names), ds.train_samples, seed)
    ev = data.sample(data.select_classification(ev, ds, names), ds.eval_samples, seed)

    def tok(batch: dict[str, list[Any]]) -> Any:
        pair = batch[ds.text_pair_column] if ds.text_pair_column else None
        return tokenizer(batch[ds.text_column], pair, truncation=True, max_length=task.max_length,
                         padding="max_length" if pad_to_max else False)

    text_cols = [c for c in (ds.text_column, ds.text_pair_column) if c]
    return datasets.DatasetDict({
        "train": train.map(tok, batched=True, remove_columns=text_cols),
        "validation": ev.map(tok, batched=True, remove_columns=text_cols),
        # the texts are kept for the language guess of the default inference samples
        "validation_text": ev.remove_columns([c for c in ev.column_names if c != ds.text_column]),
    })


def build_qa(raw: Any, task: TaskConfig, tokenizer: Any, seed: int) -> Any:
    import datasets  # type: ignore[import-untyped,unused-ignore]

    ds = task.dataset
    train, ev = data.train_eval_splits(raw, ds, seed)
    train = data.sample(train, ds.train_samples, seed)
    ev = data.sample(ev, ds.eval_samples, seed)
    if "id" not in ev.column_names:
        ev = ev.add_column("id", [str(i) for i in range(len(ev))])
    cols = (ds.question_column, ds.context_column)
    train_f = train.map(
        lambda b: squad.prepare_train_features(b, tokenizer, task.max_length, task.doc_stride, *cols,
                                               ds.answers_column),
        batched=True, remove_columns=train.column_names)
    eval_f = ev.map(
        lambda b: squad.prepare_eval_features(b, tokenizer, task.max_length, task.doc_stride, *cols),
        batched=True, remove_columns=ev.column_names)
    keep = ["id", ds.question_column, ds.context_column, ds.answers_column]
    return datasets.DatasetDict({"train": train_f, "validation": eval_f,
                                 "validation_examples": ev.remove_columns(
                                     [c for c in ev.column_names if c not in keep])})


# --- metrics ----------------------------------------------------------------------------------------------

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


def _trainer_classes() -> tuple[Any, Any]:
    from transformers import Trainer, TrainerCallback

    class ProgressCallback(TrainerCallback):
        """Progress lines + checkpoint completeness markers + a checkpoint at every epoch end."""

        def __init__(self, emitter: ProgressEmitter, precompile: bool, save_each_epoch: bool,
                     on_checkpoint: Callable[[Path], str | None] | None = None) -> None:
            self.emitter = emitter
            self.on_checkpoint = on_checkpoint  # after the marker (rank 0): e.g. the S3 upload; returns a URL
            self.precompile = precompile
            self.save_each_epoch = save_each_epoch
            self.t0 = self.t_last = time.monotonic()
            self.step0 = self.step_last = 0
            self.last_eval: tuple[int, dict[str, Any]] | None = None
            self.last_saved = -1

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = self.t_last = time.monotonic()
            self.step0 = self.step_last = state.global_step  # after a resume, count from where it resumed

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            # Never lose an epoch of work; skip when this very step was just saved (step schedule, last step).
            if self.save_each_epoch and self.last_saved != state.global_step:
                control.should_save = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kw: Any) -> None:
            if not logs or "loss" not in logs:
                return
            now = time.monotonic()
            steps = state.global_step - self.step_last
            samples = steps * args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            sps = samples / (now - self.t_last) if now > self.t_last and steps > 0 else None
            done = state.global_step - self.step0
            eta = int((state.max_steps - state.global_step) * (now - self.t0) / done) if done > 0 else None
            self.t_last, self.step_last = now, state.global_step
            self.emitter.emit("precompile" if self.precompile else "train", step=state.global_step,
                              totalSteps=state.max_steps, epoch=round(float(state.epoch or 0), 4),
                              loss=float(logs["loss"]), samplesPerSecond=round(sps, 2) if sps else None,
                              etaSeconds=eta, time=utc_now())

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                        **kw: Any) -> None:
            self.last_eval = (state.global_step, dict(metrics or {}))
            self.emitter.emit("eval", step=state.global_step, totalSteps=state.max_steps,
                              epoch=round(float(state.epoch or 0), 4), metrics=clean_metrics(metrics or {}))

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.last_saved = state.global_step
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and ckpt.is_dir():
                checkpoints.mark_complete(ckpt)
                url = self.on_checkpoint(ckpt) if self.on_checkpoint else None
                self.emitter.emit("checkpoint", step=state.global_step, totalSteps=state.max_steps,
                                  epoch=round(float(state.epoch or 0), 4), path=str(ckpt),
                                  **({"url": url} if url else {}))

    class QATrainer(Trainer):
        """Trainer whose evaluate() turns start/end logits into answers and scores them (EM/F1)."""

        def __init__(self, *a: Any, eval_examples: Any, context_column: str, answers_column: str,
                     **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.eval_examples = eval_examples
            self.context_column = context_column
            self.answers_column = answers_column

        def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None,
                     metric_key_prefix: str = "eval") -> dict[str, float]:
            features: Any = eval_dataset if eval_dataset is not None else self.eval_dataset
            loader = self.get_eval_dataloader(features)
            start = time.monotonic()
            out = self.evaluation_loop(loader, description="Evaluation", prediction_loss_only=False,
                                       ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
            predictions: Any = out.predictions
            start_logits, end_logits = predictions[0], predictions[1]
            preds = squad.postprocess_predictions(self.eval_examples, features, start_logits, end_logits,
                                                  self.context_column)
            refs: dict[str, Sequence[str]] = {ex["id"]: list(ex[self.answers_column]["text"])
                                              for ex in self.eval_examples}
            metrics = {f"{metric_key_prefix}_{k}": v for k, v in squad.squad_metrics(preds, refs).items()}
            metrics[f"{metric_key_prefix}_runtime"] = round(time.monotonic() - start, 4)
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    return ProgressCallback, QATrainer


def training_arguments(cfg: JobConfig, plan: BackendPlan, info: DistInfo, out_dir: Path, precompile: bool,
                       precompile_steps: int) -> Any:
    from transformers import TrainingArguments

    t = cfg.training
    params = inspect.signature(TrainingArguments).parameters
    kw: dict[str, Any] = {
        "output_dir": str(out_dir),
        "num_train_epochs": t.epochs,
        "max_steps": precompile_steps if precompile else (t.max_steps or -1),
        "learning_rate": t.learning_rate,
        "per_device_train_batch_size": t.batch_size_per_device,
        "per_device_eval_batch_size": t.batch_size_per_device,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "weight_decay": t.weight_decay,
        "seed": t.seed,
        "data_seed": t.seed,
        "logging_strategy": "steps",
        "logging_steps": t.log_every_steps,
        "logging_first_step": True,
        "save_strategy": "no" if precompile else "steps",
        "save_steps": t.checkpoint_every_steps,
        "save_total_limit": SAVE_TOTAL_LIMIT,
        "bf16": plan.trainer_bf16,
        "use_cpu": plan.use_cpu,
        # Precompile warms inductor where torch.compile is the graph compiler; on Neuron the XLA trial run
        # under neuron_parallel_compile is the compilation, so it does not add torch.compile.
        "torch_compile": (precompile and plan.name != "neuron") or t.compile,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    # "xla" is not a TrainingArguments choice: under torchrun with torch-neuronx present, transformers creates
    # the XLA process group itself when it is imported (training_args.py), so Neuron passes no ddp_backend.
    if info.world_size > 1 and plan.ddp_backend and plan.ddp_backend != "xla":
        kw["ddp_backend"] = plan.ddp_backend
        # Classification heads use every parameter; QA heads leave BERT's pooler unused, which DDP must know.
        # Skipping the unused-parameter search where it is not needed saves a graph traversal per step.
        kw["ddp_find_unused_parameters"] = cfg.task is not None and cfg.task.type == QUESTION_ANSWERING
    if precompile:
        kw["eval_strategy"] = "no"
    elif t.eval_every_steps:
        kw["eval_strategy"], kw["eval_steps"] = "steps", t.eval_every_steps
    else:
        kw["eval_strategy"] = "epoch"
    # transformers 5 folded warmup_ratio into warmup_steps (a value < 1 is a ratio); 4.57 has both.
    if "warmup_ratio" in params:
        kw["warmup_ratio"] = t.warmup_ratio
    else:
        kw["warmup_steps"] = t.warmup_ratio
    return TrainingArguments(**kw)


def make_optimizer(model: Any, cfg: JobConfig) -> Any:
    """AdamW with the usual no-decay groups; built here only when IPEX must see the optimizer."""
    import torch

    decay: list[Any] = []
    no_decay: list[Any] = []
    for n, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in n or n.endswith(".bias") else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.training.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.training.learning_rate)


# --- predictions ------------------------------------------------------------------------------------------

def predict_classification(model_dir: Path, samples: list[str]) -> list[dict[str, Any]]:
    from transformers import pipeline

    clf = pipeline("text-classification", model=str(model_dir),  # type: ignore[call-overload,unused-ignore]
                   tokenizer=load_tokenizer(str(model_dir)), device="cpu")
    results = clf(samples)
    return [{"text": s, "label": r["label"], "score": round(float(r["score"]), 6)}
            for s, r in zip(samples, results, strict=True)]


def predict_qa(model_dir: Path, samples: list[dict[str, Any]], max_length: int,
               doc_stride: int) -> dict[str, Any]:
    """transformers' question-answering pipeline where it exists (4.x); transformers 5 dropped that pipeline,
    so there the saved model runs through the same feature/post-processing code as evaluation."""
    from transformers.pipelines import SUPPORTED_TASKS

    tokenizer = load_tokenizer(str(model_dir))
    if "question-answering" in SUPPORTED_TASKS:
        from transformers import pipeline

        qa: Any = pipeline("question-answering",  # type: ignore[call-overload,unused-ignore]
                           model=str(model_dir), tokenizer=tokenizer, device="cpu")
        out = []
        for s in samples:
            r = qa(question=s["question"], context=s["context"], max_seq_len=max_length, doc_stride=doc_stride)
            out.append({**s, "answer": r["answer"], "score": round(float(r["score"]), 6)})
        return {"method": "pipeline:question-answering", "predictions": out}
    import torch
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(str(model_dir)).eval()
    examples = [{"id": str(i), **s} for i, s in enumerate(samples)]
    batch = {k: [e[k] for e in examples] for k in ("id", "question", "context")}
    feats = squad.prepare_eval_features(batch, tokenizer, max_length, doc_stride, "question", "context")
    names = [n for n in tokenizer.model_input_names if n in feats]
    with torch.no_grad():
        res = model(**{n: torch.tensor(feats[n]) for n in names})
    features = [{"example_id": feats["example_id"][i], "offset_mapping": feats["offset_mapping"][i]}
                for i in range(len(feats["input_ids"]))]
    answers = squad.postprocess_predictions(examples, features, res.start_logits.numpy(),
                                            res.end_logits.numpy(), "context")
    return {"method": "runtime-postprocessing (transformers has no question-answering pipeline)",
            "predictions": [{**s, "answer": answers[str(i)]} for i, s in enumerate(samples)]}


# --- output upload ----------------------------------------------------------------------------------------

def s3_keys(local_root: Path, url: str) -> list[tuple[Path, str, str]]:
    """(file, bucket, key) for each final artefact (model/, metrics.json, predictions.json) under an s3 URL."""
    if not url.startswith("s3://"):
        raise ValueError(f"FTJOB_OUTPUT_URL must be an s3:// URL, got {url!r}")
    bucket, _, prefix = url[5:].partition("/")
    prefix = prefix.strip("/")
    files = [p for p in sorted((local_root / "model").rglob("*")) if p.is_file()]
    files += [local_root / n for n in ("metrics.json", "predictions.json") if (local_root / n).exists()]
    return [(f, bucket, "/".join(x for x in (prefix, f.relative_to(local_root).as_posix()) if x)) for f in files]


def upload(local_root: Path, url: str) -> None:
    from finetune_runtime.backends import MissingStackError

    try:
        import boto3  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as e:
        raise MissingStackError("FTJOB_OUTPUT_URL is set but boto3 is not installed; the finetune-operator "
                                "images (finetune-operator/neuron, finetune-operator/xeon, ...) include it") from e
    client = boto3.client("s3")
    for f, bucket, key in s3_keys(local_root, url):
        client.upload_file(str(f), bucket, key)
    log.info("uploaded final artefacts to %s", url)


# --- main -------------------------------------------------------------------------------------------------

def run_worker() -> int:
    """One training process. On success every rank meets at a barrier and the process group is torn down
    before the interpreter exits: left to interpreter shutdown, gloo's threads can abort the process
    ("terminate called without an active exception") and turn a finished run into a failed rank."""
    rc = _run_worker()
    if rc == 0:
        _shutdown_process_group()
    return rc


def _shutdown_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _run_worker() -> int:
    info = apply_distributed_env()
    setup_logging(info)
    env = dict(os.environ)
    cfg = load_config()
    if cfg.task is None:
        log.error("config.json has no task (a bring-your-own command job): the runtime worker has nothing to do")
        return 2
    task = cfg.task
    precompile = env.get("FTJOB_MODE", "train") == "precompile"
    precompile_steps = int(env.get("FTJOB_PRECOMPILE_STEPS") or cfg.compile_cache.precompile_steps)
    paths = resolve_paths(env)
    plan = plan_backend(backend_from_env(env), cfg.training.precision)
    prepare_process(plan)
    set_cache_env(paths, plan, precompile or cfg.training.compile)
    emitter = ProgressEmitter(info.is_main)
    log.info("job %s/%s: %s on %s, rank %d of %d (%s), mode %s", cfg.namespace, cfg.job_name, task.type,
             plan.name, info.rank, info.world_size, info.source, "precompile" if precompile else "train")

    if "OMP_NUM_THREADS" not in env:
        # mpirun (unlike torchrun) leaves OMP_NUM_THREADS unset: split the cores between the local ranks
        # instead of letting each rank start one thread per core.
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, info.local_world_size)))
    import datasets
    import transformers

    transformers.logging.set_verbosity_warning()  # type: ignore[no-untyped-call,unused-ignore]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call,unused-ignore]
    # Our own cache (below) is the one that counts; datasets' per-map cache files would only duplicate it.
    datasets.disable_caching()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.set_seed(cfg.training.seed)

    if info.is_main and not precompile:
        for p in checkpoints.remove_incomplete(paths.checkpoints):
            log.info("removed incomplete checkpoint %s", p)
    run_dir = paths.cache / "precompile-run" if precompile else paths.checkpoints
    args = training_arguments(cfg, plan, info, run_dir, precompile, precompile_steps)

    tokenizer = load_tokenizer(task.tokenizer_name)
    names = None if task.type == QUESTION_ANSWERING else data.label_names(task)
    pad_to_max = plan.name == "neuron"  # XLA compiles one graph per shape: keep shapes static there
    key_inputs = data.key_inputs(task, cfg.training.seed)
    key = data.cache_key(key_inputs) + ("-static" if pad_to_max else "")

    def build() -> Any:
        raw = data.load_raw(task.dataset, cache_dir=os.environ.get("HF_DATASETS_CACHE"))
        if task.type == QUESTION_ANSWERING:
            return build_qa(raw, task, tokenizer, cfg.training.seed)
        assert names is not None
        return build_classification(raw, task, tokenizer, names, cfg.training.seed, pad_to_max)

    dsets, hit = data.load_or_build(paths.cache / "datasets", key, build,
                                    lambda: args.main_process_first(desc="dataset preparation"))
    if info.is_main:
        log.info("tokenised dataset %s (%s): %d train / %d eval rows", key, "cache hit" if hit else "built",
                 len(dsets["train"]), len(dsets["validation"]))

    # output.url: /output dies with the pod, so checkpoints go to (and come back from) <url>/checkpoints/.
    sync = None if precompile else s3sync.from_env(env, SAVE_TOTAL_LIMIT)
    restored: tuple[Path, str] | None = None
    if sync is not None:
        with args.main_process_first(desc="checkpoint download"):  # each node's local rank 0 downloads
            if info.local_rank == 0:
                restored = sync.restore(paths.checkpoints)
        if restored is not None:
            log.info("downloaded checkpoint %s from %s", restored[0].name, restored[1])
    resume = None if precompile else checkpoints.newest_complete(paths.checkpoints)
    finished = resume is not None and checkpoints.finished_training(resume)
    model = build_model(task, names, tokenizer, weights_from=resume if finished else None)
    if plan.cast_model_bf16:
        import torch

        model = model.to(torch.bfloat16)
    optimizers: tuple[Any, Any] = (None, None)
    if plan.ipex:
        model, opt = optimize_for_backend(plan, model, make_optimizer(model, cfg))
        optimizers = (opt, None)

    progress_cls, qa_trainer_cls = _trainer_classes()
    callback = progress_cls(emitter, precompile, save_each_epoch=not precompile,
                            on_checkpoint=sync.upload if sync is not None else None)
    common: dict[str, Any] = {"model": model, "args": args, "train_dataset": dsets["train"],
                              "eval_dataset": dsets["validation"], "processing_class": tokenizer,
                              "callbacks": [callback], "optimizers": optimizers}
    if task.type == QUESTION_ANSWERING:
        trainer = qa_trainer_cls(eval_examples=dsets["validation_examples"],
                                 context_column=task.dataset.context_column,
                                 answers_column=task.dataset.answers_column, **common)
    else:
        trainer = transformers.Trainer(
            compute_metrics=lambda p: classification_metrics(np.asarray(p.predictions), np.asarray(p.label_ids)),
            **common)

    train_metrics: dict[str, Any] = {}
    if finished:
        assert resume is not None
        log.info("training had finished at %s: resuming with the final steps (eval, model, predictions)", resume)
        trainer.state.global_step = checkpoints.checkpoint_step(resume) or 0
        trainer.state.max_steps = trainer.state.global_step
    else:
        if resume is not None:
            log.info("resuming from %s%s", resume, f" (downloaded from {restored[1]})" if restored else "")
        train_metrics = trainer.train(resume_from_checkpoint=str(resume) if resume else None).metrics

    if precompile:
        if info.is_main:
            shutil.rmtree(run_dir, ignore_errors=True)
        emitter.emit("precompile", step=trainer.state.global_step, totalSteps=trainer.state.max_steps,
                     complete=True, cacheDir=os.environ.get("NEURON_COMPILE_CACHE_URL") if plan.name == "neuron"
                     else os.environ.get("TORCHINDUCTOR_CACHE_DIR"), time=utc_now())
        return 0

    # The epoch schedule usually evaluated the final step already; evaluate again only when it did not.
    if callback.last_eval is not None and callback.last_eval[0] == trainer.state.global_step:
        eval_metrics = callback.last_eval[1]
    else:
        eval_metrics = trainer.evaluate()
    final = clean_metrics(eval_metrics)
    if trainer.is_world_process_zero():
        trainer.save_model(str(paths.model))
        tokenizer.save_pretrained(str(paths.model))
        metrics_doc = {"eval": final, "train": clean_metrics(train_metrics, prefix="train_"),
                       "globalStep": trainer.state.global_step, "task": task.type, "model": task.model,
                       "backend": plan.name, "worldSize": info.world_size,
                       "trainRows": len(dsets["train"]), "evalRows": len(dsets["validation"]),
                       "resumedFrom": str(resume) if resume else None,
                       "resumedFromUrl": restored[1] if restored and restored[0] == resume else None}
        (paths.output / "metrics.json").write_text(json.dumps(metrics_doc, indent=2, ensure_ascii=False) + "\n")
        preds: Any
        if task.type == QUESTION_ANSWERING:
            ds, vex = task.dataset, dsets["validation_examples"]
            samples: list[Any] = list(task.inference_questions or []) or [
                {"question": ex[ds.question_column], "context": ex[ds.context_column],
                 "gold": list(ex[ds.answers_column]["text"])}
                for ex in vex.select(range(min(3, len(vex))))
            ]
            preds = predict_qa(paths.model, samples, task.max_length, task.doc_stride)
        else:
            lang = detect_language(list(dsets["validation_text"][task.dataset.text_column]))
            samples = task.inference_samples or DEFAULT_SAMPLES[(task.type, lang)]
            preds = {"method": "pipeline:text-classification",
                     "predictions": predict_classification(paths.model, samples)}
        (paths.output / "predictions.json").write_text(json.dumps(preds, indent=2, ensure_ascii=False) + "\n")
        url = env.get("FTJOB_OUTPUT_URL")
        if url:
            upload(paths.output, url)
        emitter.emit("done", step=trainer.state.global_step, totalSteps=trainer.state.max_steps, metrics=final,
                     outputDir=url or str(paths.output), time=utc_now())
    return 0
