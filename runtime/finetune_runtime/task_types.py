"""The task types: one per plugin module (or package) under finetune_runtime/tasks/, found by name, without
importing it (plugins import transformers, which must load only after train.py has pointed its caches at
FTJOB_CACHE_DIR). A leaf module: config.py checks task.type against it, and the plugin registry
(tasks/__init__.py) loads from it, while the plugins themselves import config.py.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path

TASKS_DIR = Path(__file__).parent / "tasks"
_NOT_TASKS = {"base"}  # tasks/base.py: the plugin interface and helpers every task shares


def task_types() -> tuple[str, ...]:
    """Every task type, from the module names (`causal_lm` serves `causal-lm`)."""
    return tuple(
        sorted(
            m.name.replace("_", "-")
            for m in pkgutil.iter_modules([str(TASKS_DIR)])
            if m.name not in _NOT_TASKS and not m.name.startswith("_")
        )
    )
