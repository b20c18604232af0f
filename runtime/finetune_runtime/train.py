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
from typing import TYPE_CHECKING, Any

from finetune_runtime import checkpoints, compilecache, data, location, resume, s3sync, startup, tasks
from finetune_runtime.backends import (
    INDUCTOR_CACHE_VAR,
    BackendPlan,
    backend_from_env,
    optimize_for_backend,
    plan_backend,
    prepare_process,
)
from finetune_runtime.config import JobConfig, TaskConfig, load_config
from finetune_runtime.distenv import DistInfo, apply_distributed_env
from finetune_runtime.preemption import EXIT_INTERRUPTED, SignalFlag, save_on_signal_callback
from finetune_runtime.progress import ProgressEmitter, clean_metrics, utc_now
from finetune_runtime.tokenization import load_tokenizer

if TYPE_CHECKING:
    from finetune_runtime.tasks.base import TaskPlugin

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
    if use_compile and plan.backend.inductor:
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
    if kw["torch_compile"]:
        kw["torch_compile_backend"] = plan.backend.compile_backend  # inductor, or the device's own (neuron)
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
    if rc in (0, EXIT_INTERRUPTED):
        # Interrupted too: no rank exits while rank 0 still writes the checkpoint of the step it stopped at.
        _shutdown_process_group()
    return rc


def _shutdown_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@dataclass(frozen=True)
class Run:
    """What every stage of one worker process reads: set up once by `start`."""

    env: dict[str, str]
    info: DistInfo
    cfg: JobConfig
    task: TaskConfig
    me: location.Identity
    paths: Paths
    plan: BackendPlan
    emitter: ProgressEmitter
    precompile: bool  # FTJOB_MODE=precompile: a short trial that fills the compile cache, no model
    precompile_steps: int

    @property
    def output_url(self) -> str | None:
        return self.env.get("FTJOB_OUTPUT_URL")


def _run_worker() -> int:
    run = start()
    if isinstance(run, int):
        return run
    quiet_libraries(run)
    loc = job_location(run)
    run_dir = run.paths.cache / "precompile-run" if run.precompile else run.paths.checkpoints
    args = training_arguments(run.cfg, run.plan, run.info, run_dir, run.precompile, run.precompile_steps)
    plugin = tasks.get(run.task.type)
    tokenizer = load_tokenizer(run.task.tokenizer_name)
    dsets = tokenised_dataset(run, args, plugin, tokenizer)
    sync = checkpoint_sync(run, loc)
    point, problem = resume_point(run, args, loc, sync)
    if problem:
        log.error("%s", problem)
        return 2
    trainer, callback = build_trainer(run, args, plugin, tokenizer, dsets, point, sync)
    # A SIGTERM during training saves the current step on every rank and stops (preemption.py).
    stop = None if run.precompile else save_on_signal_callback(SignalFlag())
    if stop is not None:
        trainer.add_callback(stop)
    probe = None  # a precompile trial counts the compile cache before its first step
    if run.precompile:
        probe = compilecache.CacheProbe(compilecache.cache_root(os.environ, run.plan.backend.compile_cache_var))
    train_metrics = train(run, trainer, point)
    if stop is not None and stop.stopped_at is not None:
        log.warning("stopped at step %d on a signal, its checkpoint saved: exiting", stop.stopped_at)
        return EXIT_INTERRUPTED
    if probe is not None:
        finish_precompile(run, trainer, run_dir, probe)
    else:
        finish(run, trainer, callback, plugin, tokenizer, dsets, loc, point, train_metrics)
    return 0


def start() -> Run | int:
    """The launcher's env mapped, logging, config, identity, backend and caches; an exit code when the job
    cannot run here (said before minutes of data preparation)."""
    info = apply_distributed_env()
    setup_logging(info)
    env = dict(os.environ)
    cfg = load_config()
    if cfg.task is None:
        log.error("config.json has no task (a bring-your-own command job): the runtime worker has nothing to do")
        return 2
    # Before anything imports transformers, which imports these whenever they are installed.
    hidden = startup.hide(startup.unused_packages(cfg.task, env))
    precompile = env.get("FTJOB_MODE", "train") == "precompile"
    steps = env.get("FTJOB_PRECOMPILE_STEPS") or cfg.compile_cache.precompile_steps
    if precompile and not steps:
        log.error("a precompile trial needs its steps: FTJOB_PRECOMPILE_STEPS or compileCache.precompileSteps")
        return 2
    me = location.Identity.from_env(env)
    paths = resolve_paths(env, me.uid)
    plan = plan_backend(backend_from_env(env), cfg.training.precision)
    prepare_process(plan)
    set_cache_env(paths, plan, precompile or cfg.training.compile)
    if (precompile or cfg.training.compile) and plan.backend.inductor:
        problem = compilecache.toolchain_problem()
        if problem:  # before minutes of data preparation, not at the first forward pass
            log.error("%s", problem)
            return 2
    run = Run(
        env=env,
        info=info,
        cfg=cfg,
        task=cfg.task,
        me=me,
        paths=paths,
        plan=plan,
        emitter=ProgressEmitter(info.is_main),
        precompile=precompile,
        precompile_steps=int(steps or 0),
    )
    log.info(
        "job %s/%s (uid %s): %s on %s, rank %d of %d (%s), mode %s",
        cfg.namespace,
        cfg.job_name,
        me.uid,
        run.task.type,
        plan.name,
        info.rank,
        info.world_size,
        info.source,
        "precompile" if precompile else "train",
    )
    if hidden:
        log.info("not loading %s: this job does not use them", ", ".join(hidden))
    return run


def quiet_libraries(run: Run) -> None:
    """Threads, the libraries' logging and caches, the seed."""
    if "OMP_NUM_THREADS" not in run.env:
        # mpirun (unlike torchrun) leaves OMP_NUM_THREADS unset: split the cores between the local ranks
        # instead of letting each rank start one thread per core.
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, run.info.local_world_size)))
    import datasets  # type: ignore[import-untyped,unused-ignore]
    import transformers

    transformers.logging.set_verbosity_warning()  # type: ignore[no-untyped-call,unused-ignore]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call,unused-ignore]
    # Our own cache (data.py) is the one that counts; datasets' per-map cache files would only duplicate it.
    datasets.disable_caching()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.set_seed(run.cfg.training.seed)


def job_location(run: Run) -> location.Location:
    """The job's location: an S3 prefix (output.url; /output is scratch), else /output itself (the claim's).
    Global rank 0 of a training run clears partial checkpoints and takes the location over (location.py)."""
    url = run.output_url
    loc: location.Location = s3sync.location_from_url(url) if url else location.DirLocation(run.paths.output)
    if run.info.is_main and not run.precompile:
        for p in checkpoints.remove_incomplete(run.paths.checkpoints):
            log.info("removed incomplete checkpoint %s", p)
        moved = location.take_over(loc, run.me)
        if moved:
            log.info("%s held another job's final artefacts (%s): moved to %s/", loc, ", ".join(moved[1]), moved[0])
    return loc


def checkpoint_sync(run: Run, loc: location.Location) -> s3sync.CheckpointSync | None:
    """Checkpoints go to (and come back from) S3: /output dies with the pod when the output is a URL."""
    if isinstance(loc, s3sync.S3Location) and not run.precompile:
        return s3sync.CheckpointSync(loc, run.me.uid, SAVE_TOTAL_LIMIT)
    return None


def tokenised_dataset(run: Run, args: Any, plugin: TaskPlugin, tokenizer: Any) -> Any:
    """The plugin's tokenised splits, from the dataset cache (global rank 0 builds it, the others wait)."""
    task, seed, static = run.task, run.cfg.training.seed, run.plan.backend.static_shapes
    key = data.cache_key(data.key_inputs(task, seed)) + ("-static" if static else "")

    def build() -> Any:
        raw = data.load_raw(task.dataset, cache_dir=os.environ.get("HF_DATASETS_CACHE"))
        return plugin.build_dataset(raw, task, tokenizer, seed, static)

    dsets, hit = data.load_or_build(
        run.paths.cache / "datasets", key, build, lambda: args.main_process_first(desc="dataset preparation")
    )
    if run.info.is_main:
        log.info(
            "tokenised dataset %s (%s): %d train / %d eval rows",
            key,
            "cache hit" if hit else "built",
            len(dsets["train"]),
            len(dsets["validation"]),
        )
    return dsets


def resume_point(
    run: Run, args: Any, loc: location.Location, sync: s3sync.CheckpointSync | None
) -> tuple[resume.ResumePoint | None, str | None]:
    """Where training starts: this job's newest complete checkpoint (restored from S3 first by each node's
    local rank 0), else output.resumeFrom's; (None, None) for step 0, (None, why) when resumeFrom fails."""
    if run.precompile:
        return None, None
    restored: tuple[Path, str] | None = None
    if sync is not None:
        with args.main_process_first(desc="checkpoint download"):  # each node's local rank 0 downloads
            if run.info.local_rank == 0:
                restored = sync.restore(run.paths.checkpoints)
        if restored is not None:
            log.info("downloaded checkpoint %s from %s", restored[0].name, restored[1])
    own = checkpoints.newest_complete(run.paths.checkpoints, run.me.uid)
    if own is not None:
        return resume.ResumePoint(own, restored[1] if restored and restored[0] == own else None, own=True), None
    return _resume_from(run, args, loc)


def build_trainer(
    run: Run,
    args: Any,
    plugin: TaskPlugin,
    tokenizer: Any,
    dsets: Any,
    point: resume.ResumePoint | None,
    sync: s3sync.CheckpointSync | None,
) -> tuple[Any, Any]:
    """The model (on the backend's precision path) and the plugin's Trainer with the shared progress callback."""
    from finetune_runtime.callbacks import ProgressCallback

    plan = run.plan
    finished = point is not None and point.finished
    model = plugin.build_model(run.task, tokenizer, weights_from=point.path if point and finished else None)
    if plan.cast_model_bf16:
        import torch

        model = model.to(torch.bfloat16)
    optimizers: tuple[Any, Any] = (None, None)
    if plan.optimizer_module:
        model, opt = optimize_for_backend(plan, model, make_optimizer(model, run.cfg))
        optimizers = (opt, None)
    callback = ProgressCallback(
        run.emitter,
        run.precompile,
        save_each_epoch=not run.precompile,
        uid=run.me.uid,
        on_checkpoint=sync.upload if sync is not None else None,
        summary_metric=plugin.metrics[0],
        started_at=startup.started_at(run.env),
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
    trainer = plugin.trainer(run.task, dsets, tokenizer, common)
    if run.info.is_main:  # where the steps really run: the proof that a backend's device was taken up
        import torch.distributed as dist

        log.info(
            "training on %s, %s, process group %s",
            args.device,
            "bf16 weights" if plan.cast_model_bf16 else "bf16 autocast" if args.bf16 else "fp32",
            dist.get_backend() if dist.is_initialized() else "none",
        )
    return trainer, callback


def train(run: Run, trainer: Any, point: resume.ResumePoint | None) -> dict[str, Any]:
    """trainer.train() from the resume point; a finished one of this job's skips straight to the final steps."""
    if point is not None and point.finished:
        log.info("training had finished at %s: resuming with the final steps (eval, model, predictions)", point.path)
        trainer.state.global_step = checkpoints.checkpoint_step(point.path) or 0
        trainer.state.max_steps = trainer.state.global_step
        return {}
    if point is not None:
        resume.accept_indexed_cpu_locations()
        source = f" (downloaded from {point.url})" if point.url else ""
        log.info("resuming from %s%s%s", point.path, source, "" if point.own else " (output.resumeFrom)")
    return dict(trainer.train(resume_from_checkpoint=str(point.path) if point else None).metrics)


def finish_precompile(run: Run, trainer: Any, run_dir: Path, probe: compilecache.CacheProbe) -> None:
    """The trial's last line: the launcher relays it to the pod's termination message, whence
    status.compileCache."""
    if run.info.is_main:
        shutil.rmtree(run_dir, ignore_errors=True)
    run.emitter.emit(
        "precompile",
        step=trainer.state.global_step,
        totalSteps=trainer.state.max_steps,
        complete=True,
        cacheDir=os.environ.get(run.plan.backend.compile_cache_var),
        cache=probe.report(),
        time=utc_now(),
    )


def finish(
    run: Run,
    trainer: Any,
    callback: Any,
    plugin: TaskPlugin,
    tokenizer: Any,
    dsets: Any,
    loc: location.Location,
    point: resume.ResumePoint | None,
    train_metrics: dict[str, Any],
) -> None:
    """Final eval; rank 0 writes the plugin's outputs, metrics.json and predictions.json into the location and
    prints the `done` line."""
    # The epoch schedule usually evaluated the final step already; evaluate again only when it did not.
    if callback.last_eval is not None and callback.last_eval[0] == trainer.state.global_step:
        eval_metrics = callback.last_eval[1]
    else:
        eval_metrics = trainer.evaluate()
    final = clean_metrics(eval_metrics)
    if not trainer.is_world_process_zero():
        return
    out = run.paths.output
    plugin.save(trainer, tokenizer, out, run.task)
    metrics_doc = {
        "eval": final,
        "train": clean_metrics(train_metrics, prefix="train_"),
        "globalStep": trainer.state.global_step,
        "task": run.task.type,
        "model": run.task.model,
        "backend": run.plan.name,
        "worldSize": run.info.world_size,
        "trainRows": len(dsets["train"]),
        "evalRows": len(dsets["validation"]),
        "resumedFrom": str(point.path) if point else None,
        "resumedFromUrl": point.url if point else None,
    }
    (out / METRICS_FILE).write_text(json.dumps(metrics_doc, indent=2, ensure_ascii=False) + "\n")
    preds = plugin.predictions(out, run.task, dsets)
    (out / PREDICTIONS_FILE).write_text(json.dumps(preds, indent=2, ensure_ascii=False) + "\n")
    if isinstance(loc, s3sync.S3Location):
        location.upload_outputs(out, loc, [*plugin.outputs, METRICS_FILE, PREDICTIONS_FILE])
    run.emitter.emit(
        "done",
        step=trainer.state.global_step,
        totalSteps=trainer.state.max_steps,
        metrics=final,
        summaryMetric=plugin.metrics[0],
        outputDir=run.output_url or str(out),
        time=utc_now(),
    )


def _resume_from(run: Run, args: Any, loc: location.Location) -> tuple[resume.ResumePoint | None, str | None]:
    """output.resumeFrom's checkpoint for a job without checkpoints of its own: (point, None), or (None, why
    not). Every rank passes the same barrier, so a failed download never leaves the others waiting."""
    point: resume.ResumePoint | None = None
    problem: str | None = None
    with args.main_process_first(desc="output.resumeFrom download"):
        try:
            point = resume.resume_from(run.env, run.paths.output, downloader=run.info.local_rank == 0)
        except resume.ResumeError as e:
            problem = str(e)
    if point is None and problem is None and run.info.is_main:
        others = location.others_checkpoints(loc, run.me.uid)
        if others:
            log.info(
                "starting from step 0: %s holds checkpoints of other jobs (%s), which this job (uid %s) does not "
                "resume; output.resumeFrom can name them",
                loc,
                ", ".join(others),
                run.me.uid,
            )
    return point, problem
