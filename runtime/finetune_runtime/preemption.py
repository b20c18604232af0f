"""Checkpoint on SIGTERM: a drained, evicted or deleted rank pod saves the step it is at before its grace period
ends, and the job resumes from there instead of from its last periodic checkpoint (docs/runtime.md, "Drains").

The kubelet sends SIGTERM to the container's first process (torchrun, which passes it on to its workers; an MPI
worker's `ftjob-runtime sshd`, which passes it on to the ranks mpirun started in its pod), and only in the pods
being deleted: a drain of one node signals that node's ranks, not the others. A Trainer checkpoint is collective
(every rank writes its part, rank 0 the model), so no rank may save alone. Hence:
1. SIGTERM (or SIGUSR1, what mpirun launchers pass on to their ranks) only sets a flag while training runs;
2. at every optimizer step's end every rank contributes its flag to one all-reduce (MAX) over a gloo group of
   its own (a CPU tensor works whatever the training backend: NCCL, XLA, oneCCL); if any rank was signalled, all
   of them ask the Trainer to save this step and stop, at the same step;
3. after the save every rank meets at a barrier (so none exits while rank 0 still writes) and the worker exits
   with EXIT_INTERRUPTED: never 0, so a pod that stopped early never reads as a finished job.

Before training starts (data preparation, compilation) and after it ends (final evaluation, model save) a
signal keeps its default effect: there is no step to save then.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

log = logging.getLogger("finetune_runtime")

# 128 + SIGTERM, what a shell reports for a process SIGTERM ended: the worker stopped because it was told to.
EXIT_INTERRUPTED = 143
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclass
class SignalFlag:
    """Set by SIGTERM/SIGUSR1 while installed; the previous handlers come back on uninstall."""

    received: int | None = None
    at: float | None = None  # time.monotonic() of the first signal
    _previous: dict[int, Any] = field(default_factory=dict)

    def install(self) -> None:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received, self.at = signum, time.monotonic()


def flag_group() -> Any:
    """The process group the flags are all-reduced over: the default one when it is gloo, else a gloo group of
    every rank (made once, by every rank at the same point: the start of training). None without a world."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo")


def agree(mine: bool, group: Any) -> bool:
    """Whether any rank of `group` was signalled (one all-reduce of a one-element CPU tensor)."""
    if group is None:
        return mine
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


def save_on_signal_callback(flag: SignalFlag, agree_fn: Callable[[bool, Any], bool] = agree) -> Any:
    """A TrainerCallback that turns the flag into a collective save of the current step and a stop. Built by a
    function so that this module loads without transformers (the worker installs nothing before training)."""
    from transformers import TrainerCallback

    class SaveOnSignal(TrainerCallback):
        def __init__(self) -> None:
            self.group: Any = None
            self.stopped_at: int | None = None  # the step saved because of a signal

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.group = flag_group()
            flag.install()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if self.stopped_at is None and agree_fn(flag.received is not None, self.group):
                self.stopped_at = state.global_step
                control.should_save = True
                control.should_training_stop = True
                who = f"signal {flag.received}" if flag.received is not None else "another rank's signal"
                log.warning("%s: saving checkpoint-%d and stopping", who, state.global_step)
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            flag.uninstall()

    return SaveOnSignal()
