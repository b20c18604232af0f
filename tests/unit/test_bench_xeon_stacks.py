"""benchmarks/xeon_stacks.py: each arm is the QA sample as a xeon-amx job of one stack, rendered with the
environment the profile derives for it, and an arm whose stack is not installed is refused, never measured as
another stack."""

from __future__ import annotations

from pathlib import Path

import pytest
import xeon_stacks as xs
import yaml

from finetune_operator.admission import validate
from finetune_operator.local import local_env


@pytest.mark.parametrize("arm", sorted(xs.ARMS))
def test_each_arm_is_the_qa_sample_on_its_stack(arm: str, tmp_path: Path) -> None:
    job = validate(xs.arm_job(arm, steps=200, mpi="mpich"))
    sample = validate(yaml.safe_load(xs.JOB.read_text()))
    assert job["spec"]["task"] == sample["spec"]["task"], "the same work in every arm"
    assert job["spec"]["hardware"]["stack"] == xs.ARMS[arm]["stack"]
    env, nodes, procs, _ = local_env(job, tmp_path, None, None, None)
    assert (nodes, procs) == (1, xs.ARMS[arm]["ranks"])
    backend = {"upstream": "xeon-upstream", "ipex": "xeon"}[xs.ARMS[arm]["stack"]]
    assert env["FTJOB_BACKEND"] == backend
    # oneCCL's progress threads and variables only on the stack that has oneCCL
    assert ("CCL_WORKER_COUNT" in env) == (arm == "ipex")


def test_a_stack_that_is_not_installed_is_named_with_its_import_error() -> None:
    assert xs.import_error("json") is None
    assert xs.import_error("no_such_module_here") == "ModuleNotFoundError: No module named 'no_such_module_here'"


def test_ipex_arm_needs_the_modules_without_which_the_runtime_falls_back_to_gloo() -> None:
    """The runtime's xeon backend quietly uses gloo without oneCCL's bindings (backends.py vendor_ddp): the arm
    must not run then, or it would measure the upstream path under the ipex name."""
    from finetune_runtime.backends import BACKENDS

    xeon = BACKENDS["xeon"]
    assert xeon.vendor_ddp is not None and xeon.vendor_ddp[0] in xs.ARMS["ipex"]["needs"]
    assert xeon.optimizer is not None and xeon.optimizer.module in xs.ARMS["ipex"]["needs"]
    assert xs.GROUPS["ccl"] == xeon.vendor_ddp[0]
