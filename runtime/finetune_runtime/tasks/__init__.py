"""Task plugins: `task.type` -> the module (or package) `finetune_runtime.tasks.<type with '-' as '_'>` and its
`PLUGIN`.

The registry is the package's module list (task_types.py), so adding a task is adding its module (and its schema
entry in the operator). Modules are imported on first use: they import transformers, which must load only after
train.py has pointed its caches at FTJOB_CACHE_DIR.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

from finetune_runtime.task_types import task_types

if TYPE_CHECKING:
    from finetune_runtime.tasks.base import TaskPlugin

__all__ = ["get", "module_name", "task_types"]


def module_name(task_type: str) -> str:
    return f"{__name__}.{task_type.replace('-', '_')}"


@cache
def get(task_type: str) -> TaskPlugin:
    if task_type not in task_types():
        raise KeyError(f"unknown task type {task_type!r}; known: {', '.join(task_types())}")
    plugin: TaskPlugin = importlib.import_module(module_name(task_type)).PLUGIN
    assert plugin.name == task_type, f"{module_name(task_type)}.PLUGIN.name is {plugin.name!r}"
    return plugin
