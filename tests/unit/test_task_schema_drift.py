"""The operator's task schema and the runtime's task plugins name the same tasks and options.

A task is a runtime plugin (runtime/finetune_runtime/tasks/<type>.py) plus its schema entry
(operator/finetune_operator/api/schema.py); the two packages never import each other at run time, so this test
is what keeps them in step. It imports the plugins, which need the runtime's dependencies (installed by
`make setup`)."""

from __future__ import annotations

import pytest

from finetune_operator.api import schema
from finetune_runtime import config, tasks
from finetune_runtime.tasks.base import COMMON_DATASET_OPTIONS, COMMON_TASK_OPTIONS


def _plugins() -> list[tasks.base.TaskPlugin]:
    return [tasks.get(t) for t in tasks.task_types()]


def test_task_types_are_the_plugins() -> None:
    assert set(schema.TASK_TYPES) == set(tasks.task_types()), (
        "spec.task.type's enum (schema.TASK_TYPES) and the runtime's plugin modules differ: add the schema entry "
        "or the plugin module"
    )
    assert set(config.TASK_TYPES) == set(tasks.task_types())
    assert schema.TASK["properties"]["type"]["enum"] == list(schema.TASK_TYPES)


@pytest.mark.parametrize("task_type", tasks.task_types())
def test_plugin_module_serves_its_type(task_type: str) -> None:
    assert tasks.get(task_type).name == task_type


def test_task_options_match_the_plugins() -> None:
    runtime = set(COMMON_TASK_OPTIONS).union(*(p.task_options for p in _plugins()))
    operator = set(schema.TASK["properties"])
    assert operator == runtime, (
        f"spec.task options only in the schema: {sorted(operator - runtime)}; only in "
        f"the runtime plugins' task_options: {sorted(runtime - operator)}"
    )


def test_dataset_options_match_the_plugins() -> None:
    runtime = set(COMMON_DATASET_OPTIONS).union(*(p.dataset_options for p in _plugins()))
    operator = set(schema.DATASET["properties"])
    assert operator == runtime, (
        f"spec.task.dataset options only in the schema: {sorted(operator - runtime)}; "
        f"only in the plugins' dataset_options: {sorted(runtime - operator)}"
    )


def test_each_option_belongs_to_one_task_or_all() -> None:
    seen: dict[str, str] = {}
    for p in _plugins():
        for opt in (*p.task_options, *(f"dataset.{o}" for o in p.dataset_options)):
            assert opt.split(".")[-1] not in (*COMMON_TASK_OPTIONS, *COMMON_DATASET_OPTIONS), (p.name, opt)
            assert opt not in seen, f"{opt} is claimed by {seen[opt]} and {p.name}"
            seen[opt] = p.name


def test_lora_schema_matches_the_runtime_parser() -> None:
    from finetune_runtime.tasks.causal_lm import LoraOptions

    lora = schema.TASK["properties"]["lora"]["properties"]
    defaults = LoraOptions()
    assert set(lora) == {"r", "alpha", "dropout", "targetModules", "merge"}
    assert (lora["r"]["default"], lora["alpha"]["default"], lora["dropout"]["default"], lora["merge"]["default"]) == (
        defaults.r,
        defaults.alpha,
        defaults.dropout,
        defaults.merge,
    )
