"""Trainer callbacks every task shares: progress lines (with throughput: tokens and the model's numbers, from
modelstats.py), checkpoint completeness markers, a save per epoch.

Imports transformers at import time: train.py imports this module only after pointing the caches at
FTJOB_CACHE_DIR.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from finetune_runtime import checkpoints, modelstats, startup
from finetune_runtime.progress import ProgressEmitter, clean_metrics, utc_now

# An epoch-end save bounds what a restart loses to one epoch. When the newest checkpoint (or the start of
# training) is younger than this, the save costs more than the work it protects: with short epochs (a small model
# or dataset) a save per epoch was the runtime's whole overhead over a bare Trainer (benchmarks/README.md).
EPOCH_SAVE_MIN_SECONDS = 60.0


class ProgressCallback(TrainerCallback):
    """Progress lines + checkpoint completeness markers + a checkpoint at every epoch end (unless the newest
    one is under EPOCH_SAVE_MIN_SECONDS old)."""

    def __init__(
        self,
        emitter: ProgressEmitter,
        precompile: bool,
        save_each_epoch: bool,
        uid: str,
        on_checkpoint: Callable[[Path], str | None] | None = None,
        summary_metric: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        started_at: float | None = None,
    ) -> None:
        self.emitter = emitter
        self.uid = uid  # the job's: each checkpoint's marker records it (checkpoints.mark_complete)
        self.summary_metric = summary_metric  # the task's headline metric (plugin.metrics[0]), named in eval lines
        self.on_checkpoint = on_checkpoint  # after the marker (rank 0): e.g. the S3 upload; returns a URL
        self.precompile = precompile
        self.save_each_epoch = save_each_epoch
        self.clock = clock
        self.t0 = self.t_last = self.saved_at = clock()
        self.step0 = self.step_last = 0
        self.last_eval: tuple[int, dict[str, Any]] | None = None
        self.last_saved = -1
        # Throughput (rank 0 only: the others print nothing, so they count nothing): the training batches'
        # tokens, the model's numbers and precision for the operator's FLOPs and MFU, and the first logged step
        # (time, step), from which the run's mean samples/s counts (the first step's start-up excluded).
        self.tokens = modelstats.TokenCounter() if emitter.enabled else None
        self.model_numbers: dict[str, int] | None = None
        self.precision: str | None = None
        self.first_log: tuple[float, int] | None = None
        # The time to the first step (startup.py): when the run started (Unix time), when this process's first
        # optimizer step ended; both on every train line from then on.
        self.started_at = started_at
        self.first_step_at: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.t0 = self.t_last = self.saved_at = self.clock()  # a resume starts from a checkpoint: as if just saved
        self.step0 = self.step_last = state.global_step  # after a resume, count from where it resumed
        self.first_log = None
        if self.tokens is not None and model is not None:
            self.model_numbers = modelstats.model_numbers(model)
            self.precision = modelstats.precision_of(model, bool(args.bf16))
            self.tokens.detach()
            self.tokens.attach(model)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.tokens is not None:
            self.tokens.detach()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        # Never lose an epoch of work; skip when this very step was just saved (step schedule, last step), or
        # when the newest checkpoint is too young to be worth another (EPOCH_SAVE_MIN_SECONDS).
        if (
            self.save_each_epoch
            and self.last_saved != state.global_step
            and self.clock() - self.saved_at >= EPOCH_SAVE_MIN_SECONDS
        ):
            control.should_save = True
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if not logs or "loss" not in logs:
            return
        now = time.monotonic()
        steps = state.global_step - self.step_last
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        sps = steps * per_step / (now - self.t_last) if now > self.t_last and steps > 0 else None
        done = state.global_step - self.step0
        eta = int((state.max_steps - state.global_step) * (now - self.t0) / done) if done > 0 else None
        self.t_last, self.step_last = now, state.global_step
        mean = None
        if self.first_log is None:
            self.first_log = (now, state.global_step)
        elif now > self.first_log[0] and state.global_step > self.first_log[1]:
            mean = (state.global_step - self.first_log[1]) * per_step / (now - self.first_log[0])
        self.emitter.emit(
            "precompile" if self.precompile else "train",
            step=state.global_step,
            totalSteps=state.max_steps,
            epoch=round(float(state.epoch or 0), 4),
            loss=float(logs["loss"]),
            samplesPerSecond=round(sps, 2) if sps else None,
            etaSeconds=eta,
            **self._throughput(sps),
            meanSamplesPerSecond=round(mean, 2) if mean else None,
            time=utc_now(),
            **self._first_step(),
        )

    def _throughput(self, sps: float | None) -> dict[str, Any]:
        """Tokens/s over all ranks (samples/s times rank 0's tokens per sample since the last line), the run's
        mean padded length of a sample, the precision and the model's numbers."""
        if self.tokens is None:
            return {}
        got = self.tokens.take()
        out: dict[str, Any] = {}
        if sps and got.sequences:
            if self.tokens.real_known:
                out["tokensPerSecond"] = round(sps * got.real / got.sequences, 1)
            out["paddedTokensPerSecond"] = round(sps * got.padded / got.sequences, 1)
        total = self.tokens.total
        if total.sequences:
            out["paddedTokensPerSample"] = round(total.padded / total.sequences, 2)
        out["precision"] = self.precision
        out["model"] = self.model_numbers
        return out

    def _first_step(self) -> dict[str, str]:
        if self.precompile or self.started_at is None or self.first_step_at is None:
            return {}
        return {"startedAt": startup.iso_utc(self.started_at), "firstStepAt": startup.iso_utc(self.first_step_at)}

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        self.last_eval = (state.global_step, dict(metrics or {}))
        self.emitter.emit(
            "eval",
            step=state.global_step,
            totalSteps=state.max_steps,
            epoch=round(float(state.epoch or 0), 4),
            metrics=clean_metrics(metrics or {}),
            summaryMetric=self.summary_metric,
        )

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.last_saved = state.global_step
        self.saved_at = self.clock()
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and ckpt.is_dir():
            checkpoints.mark_complete(ckpt, self.uid)
            url = self.on_checkpoint(ckpt) if self.on_checkpoint else None
            self.emitter.emit(
                "checkpoint",
                step=state.global_step,
                totalSteps=state.max_steps,
                epoch=round(float(state.epoch or 0), 4),
                path=str(ckpt),
                **({"url": url} if url else {}),
            )
