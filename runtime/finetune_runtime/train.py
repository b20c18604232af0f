"""The `worker` command: one training process (started by torchrun or mpirun, or alone).

Flow: map the launcher's env -> read config -> backend plan -> tokenizer -> tokenised dataset (rank 0 builds
the cache, others wait) -> model -> Trainer (resuming from this job's newest complete checkpoint, else from
output.resumeFrom's) -> final eval -> rank 0 saves model/, metrics.json, predictions.json into the job's location
(location.py) and prints the `done` progress line. This pipeline is the
same for every task: what differs (dataset, model, Trainer, metrics, saving, predictions) is the task plugin's
(finetune_runtime/tasks/, chosen by task.type).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_runtime import checkpoints, compilecache, data, location, resume, s3sync, tasks
from finetune_runtime.backends import (
    INDUCTOR_CACHE_VAR,
    BackendPlan,
    backend_from_env,
    optimize_for_backend,
    plan_backend,
    prepare_process,
)
from finetune_runtime.config import JobConfig, load_config
from finetune_runtime.distenv import DistInfo, apply_distributed_env
from finetune_runtime.progress import ProgressEmitter, clean_metrics, utc_now
from finetune_runtime.tokenization import load_tokenizer

log = logging.getLogger("finetune_runtime")

SAVE_TOTAL_LIMIT = 3  # checkpoints kept on the output volume (newest ones); bounds the PVC size a job needs
# What the pipeline writes beside the task plugin's own outputs (plugin.outputs); all are uploaded to an S3 location.
METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.json"


@dataclass(frozen=True)
class Paths:
    output: Path  # the job's location on the output claim, or the scratch copy of an S3 one
    cache: Path
    uid: str  # the job's: its checkpoints live under checkpoints/<uid>/ (location.py)

    @property
    def checkpoints(self) -> Path:
        return self.output / location.checkpoint_dir(self.uid)


def setup_logging(info: DistInfo) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {info.rank}] %(name)s: %(message)s", force=True)
    if not info.is_main:
        # Other ranks print only warnings; the rank-0 log is the one people (and the operator) read.
        logging.getLogger().setLevel(logging.WARNING)


def resolve_paths(env: dict[str, str], uid: str) -> Paths:
    out = Path(env.get("FTJOB_OUTPUT_DIR") or "ftjob-output").resolve()
    cache = Path(env.get("FTJOB_CACHE_DIR") or out / ".cache").resolve()
    return Paths(out, cache, uid)


def set_cache_env(paths: Paths, plan: BackendPlan, use_compile: bool) -> None:
    """Cache locations under FTJOB_CACHE_DIR (must happen before transformers/datasets/torch._inductor load)."""
    os.environ.setdefault("HF_HOME", str(paths.cache / "hf"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(paths.cache / "hf" / "datasets"))
    if use_compile and plan.backend.torch_compile:
        os.environ.setdefault(INDUCTOR_CACHE_VAR, str(paths.cache / "torch-compile"))
        os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
        os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")


def training_arguments(
    cfg: JobConfig, plan: BackendPlan, info: DistInfo, out_dir: Path, precompile: bool, precompile_steps: int
) -> Any:
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
        # Precompile warms inductor where torch.compile is the graph compiler; where the backend compiles
        # itself (Neuron: the XLA trial under neuron_parallel_compile) the trial adds no torch.compile.
        "torch_compile": (precompile and plan.backend.torch_compile) or t.compile,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    if info.world_size > 1 and plan.trainer_ddp_backend:
        kw["ddp_backend"] = plan.trainer_ddp_backend
        # Skipping the unused-parameter search where the task does not need it saves a graph traversal per step.
        kw["ddp_find_unused_parameters"] = cfg.task is not None and tasks.get(cfg.task.type).find_unused_parameters
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
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.training.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.training.learning_rate,
    )


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
    me = location.Identity.from_env(env)
    paths = resolve_paths(env, me.uid)
    plan = plan_backend(backend_from_env(env), cfg.training.precision)
    prepare_process(plan)
    set_cache_env(paths, plan, precompile or cfg.training.compile)
    if (precompile or cfg.training.compile) and plan.backend.torch_compile:
        problem = compilecache.toolchain_problem()
        if problem:  # before minutes of data preparation, not at the first forward pass
            log.error("%s", problem)
            return 2
    emitter = ProgressEmitter(info.is_main)
    log.info(
        "job %s/%s: %s on %s, rank %d of %d (%s), mode %s",
        cfg.namespace,
        cfg.job_name,
        task.type,
        plan.name,
        info.rank,
        info.world_size,
        info.source,
        "precompile" if precompile else "train",
    )

    if "OMP_NUM_THREADS" not in env:
        # mpirun (unlike torchrun) leaves OMP_NUM_THREADS unset: split the cores between the local ranks
        # instead of letting each rank start one thread per core.
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, info.local_world_size)))
    import datasets  # type: ignore[import-untyped,unused-ignore]
    import transformers

    transformers.logging.set_verbosity_warning()  # type: ignore[no-untyped-call,unused-ignore]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call,unused-ignore]
    # Our own cache (below) is the one that counts; datasets' per-map cache files would only duplicate it.
    datasets.disable_caching()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.set_seed(cfg.training.seed)

    url = env.get("FTJOB_OUTPUT_URL")
    # The job's location: an S3 prefix (output.url; /output is scratch), else /output itself (the claim's).
    loc: location.Location = s3sync.location_from_url(url) if url else location.DirLocation(paths.output)
    if info.is_main and not precompile:
        for p in checkpoints.remove_incomplete(paths.checkpoints):
            log.info("removed incomplete checkpoint %s", p)
        moved = location.take_over(loc, me)
        if moved:
            log.info("%s held another job's final artefacts (%s): moved to %s/", loc, ", ".join(moved[1]), moved[0])
    run_dir = paths.cache / "precompile-run" if precompile else paths.checkpoints
    args = training_arguments(cfg, plan, info, run_dir, precompile, precompile_steps)

    plugin = tasks.get(task.type)
    from finetune_runtime.callbacks import ProgressCallback

    tokenizer = load_tokenizer(task.tokenizer_name)
    pad_to_max = plan.backend.static_shapes
    key = data.cache_key(data.key_inputs(task, cfg.training.seed)) + ("-static" if pad_to_max else "")

    def build() -> Any:
        raw = data.load_raw(task.dataset, cache_dir=os.environ.get("HF_DATASETS_CACHE"))
        return plugin.build_dataset(raw, task, tokenizer, cfg.training.seed, pad_to_max)

    dsets, hit = data.load_or_build(
        paths.cache / "datasets", key, build, lambda: args.main_process_first(desc="dataset preparation")
    )
    if info.is_main:
        log.info(
            "tokenised dataset %s (%s): %d train / %d eval rows",
            key,
            "cache hit" if hit else "built",
            len(dsets["train"]),
            len(dsets["validation"]),
        )

    # output.url: /output dies with the pod, so checkpoints go to (and come back from) the location's
    # checkpoints/<uid>/.
    sync = (
        s3sync.CheckpointSync(loc, me.uid, SAVE_TOTAL_LIMIT)
        if isinstance(loc, s3sync.S3Location) and not precompile
        else None
    )
    restored: tuple[Path, str] | None = None
    if sync is not None:
        with args.main_process_first(desc="checkpoint download"):  # each node's local rank 0 downloads
            if info.local_rank == 0:
                restored = sync.restore(paths.checkpoints)
        if restored is not None:
            log.info("downloaded checkpoint %s from %s", restored[0].name, restored[1])
    point: resume.ResumePoint | None = None
    if not precompile:
        own = checkpoints.newest_complete(paths.checkpoints, me.uid)
        if own is not None:
            point = resume.ResumePoint(own, restored[1] if restored and restored[0] == own else None, own=True)
        else:
            point, problem = _resume_from(env, paths, info, args, loc, me)
            if problem:
                log.error("%s", problem)
                return 2
    resume_dir = point.path if point else None
    finished = point is not None and point.finished
    model = plugin.build_model(task, tokenizer, weights_from=resume_dir if finished else None)
    if plan.cast_model_bf16:
        import torch

        model = model.to(torch.bfloat16)
    optimizers: tuple[Any, Any] = (None, None)
    if plan.optimizer_module:
        model, opt = optimize_for_backend(plan, model, make_optimizer(model, cfg))
        optimizers = (opt, None)

    callback = ProgressCallback(
        emitter,
        precompile,
        save_each_epoch=not precompile,
        uid=me.uid,
        on_checkpoint=sync.upload if sync is not None else None,
        summary_metric=plugin.metrics[0],
    )
    common: dict[str, Any] = {
        "model": model,
        "args": args,
        "train_dataset": dsets["train"],
        "eval_dataset": dsets["validation"],
        "processing_class": tokenizer,
        "callbacks": [callback],
        "optimizers": optimizers,
    }
    trainer = plugin.trainer(task, dsets, tokenizer, common)
    if info.is_main:  # where the steps really run: the proof that a backend's device was taken up
        import torch.distributed as dist

        log.info(
            "training on %s, %s, process group %s",
            args.device,
            "bf16 weights" if plan.cast_model_bf16 else "bf16 autocast" if args.bf16 else "fp32",
            dist.get_backend() if dist.is_initialized() else "none",
        )

    train_metrics: dict[str, Any] = {}
    probe = (
        compilecache.CacheProbe(compilecache.cache_root(os.environ, plan.backend.compile_cache_var))
        if precompile
        else None
    )
    if finished:
        assert resume_dir is not None
        log.info("training had finished at %s: resuming with the final steps (eval, model, predictions)", resume_dir)
        trainer.state.global_step = checkpoints.checkpoint_step(resume_dir) or 0
        trainer.state.max_steps = trainer.state.global_step
    else:
        if point is not None:
            source = f" (downloaded from {point.url})" if point.url else ""
            log.info("resuming from %s%s%s", point.path, source, "" if point.own else " (output.resumeFrom)")
        train_metrics = trainer.train(resume_from_checkpoint=str(resume_dir) if resume_dir else None).metrics

    if precompile:
        if info.is_main:
            shutil.rmtree(run_dir, ignore_errors=True)
        assert probe is not None
        # The launcher relays this record to the pod's termination message, whence status.compileCache.
        emitter.emit(
            "precompile",
            step=trainer.state.global_step,
            totalSteps=trainer.state.max_steps,
            complete=True,
            cacheDir=os.environ.get(plan.backend.compile_cache_var),
            cache=probe.report(),
            time=utc_now(),
        )
        return 0

    # The epoch schedule usually evaluated the final step already; evaluate again only when it did not.
    if callback.last_eval is not None and callback.last_eval[0] == trainer.state.global_step:
        eval_metrics = callback.last_eval[1]
    else:
        eval_metrics = trainer.evaluate()
    final = clean_metrics(eval_metrics)
    if trainer.is_world_process_zero():
        plugin.save(trainer, tokenizer, paths.output, task)
        metrics_doc = {
            "eval": final,
            "train": clean_metrics(train_metrics, prefix="train_"),
            "globalStep": trainer.state.global_step,
            "task": task.type,
            "model": task.model,
            "backend": plan.name,
            "worldSize": info.world_size,
            "trainRows": len(dsets["train"]),
            "evalRows": len(dsets["validation"]),
            "resumedFrom": str(resume_dir) if resume_dir else None,
            "resumedFromUrl": point.url if point else None,
        }
        (paths.output / METRICS_FILE).write_text(json.dumps(metrics_doc, indent=2, ensure_ascii=False) + "\n")
        preds = plugin.predictions(paths.output, task, dsets)
        (paths.output / PREDICTIONS_FILE).write_text(json.dumps(preds, indent=2, ensure_ascii=False) + "\n")
        if isinstance(loc, s3sync.S3Location):
            location.upload_outputs(paths.output, loc, [*plugin.outputs, METRICS_FILE, PREDICTIONS_FILE])
        emitter.emit(
            "done",
            step=trainer.state.global_step,
            totalSteps=trainer.state.max_steps,
            metrics=final,
            summaryMetric=plugin.metrics[0],
            outputDir=url or str(paths.output),
            time=utc_now(),
        )
    return 0


def _resume_from(
    env: dict[str, str], paths: Paths, info: DistInfo, args: Any, loc: location.Location, me: location.Identity
) -> tuple[resume.ResumePoint | None, str | None]:
    """output.resumeFrom's checkpoint for a job without checkpoints of its own: (point, None), or (None, why
    not). Every rank passes the same barrier, so a failed download never leaves the others waiting."""
    point: resume.ResumePoint | None = None
    problem: str | None = None
    with args.main_process_first(desc="output.resumeFrom download"):
        try:
            point = resume.resume_from(env, paths.output, downloader=info.local_rank == 0)
        except resume.ResumeError as e:
            problem = str(e)
    if point is None and problem is None and info.is_main:
        others = location.others_checkpoints(loc, me.uid)
        if others:
            log.info(
                "starting from step 0: %s holds checkpoints of other jobs (%s), which this job (uid %s) does not "
                "resume; output.resumeFrom can name them",
                loc,
                ", ".join(others),
                me.uid,
            )
    return point, problem
