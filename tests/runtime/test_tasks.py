"""What each task plugin declares: the outputs it writes and the metrics it reports (shared code asks it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from finetune_runtime import config, tasks, train
from finetune_runtime.task_types import TASKS_DIR, task_types
from finetune_runtime.tasks.base import MODEL_DIR

PACKAGE = TASKS_DIR.parent


@pytest.mark.parametrize("task_type", task_types())
def test_each_plugin_declares_its_outputs_and_metrics(task_type: str) -> None:
    plugin = tasks.get(task_type)
    assert plugin.outputs[0] == MODEL_DIR and len(set(plugin.outputs)) == len(plugin.outputs)
    assert train.METRICS_FILE not in plugin.outputs and train.PREDICTIONS_FILE not in plugin.outputs
    assert plugin.metrics and len(set(plugin.metrics)) == len(plugin.metrics)


def test_the_causal_lm_plugin_names_perplexity_and_its_extra_directories() -> None:
    clm = tasks.get("causal-lm")
    assert clm.metrics[0] == "perplexity" and {"model-merged", "base-model"} <= set(clm.outputs)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_config_does_not_import_the_task_plugins() -> None:
    """config.py <- tasks/base.py <- the plugins: config.py reads the task types from the leaf task_types.py, so
    the import graph has no circle through the tasks package."""
    assert not any(m.startswith("finetune_runtime.tasks") for m in _imports(PACKAGE / "config.py"))
    assert _imports(PACKAGE / "task_types.py") <= {
        "__future__",
        "__future__.annotations",
        "pkgutil",
        "pathlib",
        "pathlib.Path",
    }
    assert config.TASK_TYPES == task_types() == tasks.task_types()


def test_no_task_knowledge_outside_the_plugins() -> None:
    """SQuAD's code and the names of task outputs live with their task (tasks/), not in shared modules."""
    assert not (PACKAGE / "squad.py").exists()
    shared = [p for p in PACKAGE.glob("*.py")]
    for path in shared:
        text = path.read_text(encoding="utf-8")
        assert "model-merged" not in text and "adapter_model" not in text, path.name
