"""Task plugins: `task.type` -> the module `finetune_runtime.tasks.<type with '-' as '_'>` and its `PLUGIN`.

The registry is the package's module list, so adding a task is adding its module (and its schema entry in the
operator). Modules are imported on first use: they import transformers, which must load only after train.py
has pointed its caches at FTJOB_CACHE_DIR.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from finetune_runtime.tasks.base import TaskPlugin

_NOT_TASKS = {"base"}


def module_name(task_type: str) -> str:
    return f"{__name__}.{task_type.replace('-', '_')}"


def task_types() -> tuple[str, ...]:
    """Every task type, from the module names (no imports)."""
    return tuple(
        sorted(
            m.name.replace("_", "-")
            for m in pkgutil.iter_modules(__path__)
            if m.name not in _NOT_TASKS and not m.name.startswith("_")
        )
    )


@cache
def get(task_type: str) -> TaskPlugin:
    if task_type not in task_types():
        raise KeyError(f"unknown task type {task_type!r}; known: {', '.join(task_types())}")
    plugin: TaskPlugin = importlib.import_module(module_name(task_type)).PLUGIN
    assert plugin.name == task_type, f"{module_name(task_type)}.PLUGIN.name is {plugin.name!r}"
    return plugin
