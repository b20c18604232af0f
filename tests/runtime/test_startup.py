"""The start of a run (finetune_runtime/startup.py): the clock of the time to the first step, and what a worker
leaves unimported (docs/runtime.md, "Time to the first step")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import (
    DEMO_CONFIG,
    ROOT,
    descendants,
    job_config,
    progress_records,
    runtime_argv,
    runtime_env,
)

from finetune_runtime import startup
from finetune_runtime.config import TaskConfig

# The kernel counts process starts and uptime in clock ticks (10 ms); the two readings round apart by that much.
TICK_SLACK = 0.03


def _unix(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_process_start_is_when_the_kernel_created_the_process() -> None:
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    after = time.time()
    try:
        started = startup.process_start(child.pid)
    finally:
        child.communicate(b"")
    assert started is not None
    assert before - TICK_SLACK <= started <= after + TICK_SLACK
    own = startup.process_start()
    assert own is not None and own <= time.time()


def test_process_start_reads_the_fields_after_the_command_name(tmp_path: Path) -> None:
    """The command name (field 2) may hold spaces and parentheses; starttime is field 22, in clock ticks."""
    hz = startup.os.sysconf("SC_CLK_TCK")
    (tmp_path / "7").mkdir()
    fields = ["S", *["0"] * 18, str(500 * hz)]  # fields 3..22
    (tmp_path / "7" / "stat").write_text(f"7 (odd) name (x) {' '.join(fields)} 0 0\n")
    (tmp_path / "uptime").write_text("1000.00 900.00\n")
    started = startup.process_start(7, proc=tmp_path)
    assert started is not None
    assert abs(started - (time.time() - 500)) < 1  # created 500 s after boot, 1000 s after which it is now
    assert startup.process_start(8, proc=tmp_path) is None  # no such process


def test_a_launcher_marks_its_start_unless_an_outer_one_did() -> None:
    env: dict[str, str] = {}
    mine = startup.mark_start(env)
    assert env[startup.STARTED_AT_VAR] == f"{mine:.3f}"
    assert mine == pytest.approx(startup.process_start() or 0, abs=0.01)
    outer = {startup.STARTED_AT_VAR: "1700000000.250"}
    assert startup.mark_start(outer) == 1700000000.25 and outer[startup.STARTED_AT_VAR] == "1700000000.250"
    assert startup.started_at(outer) == 1700000000.25
    # A worker started without a launcher's clock (or with a broken one) counts from its own start.
    for env in ({}, {startup.STARTED_AT_VAR: "yesterday"}):
        assert startup.started_at(env) == pytest.approx(startup.process_start() or 0, abs=0.01)


def test_iso_times_carry_milliseconds_in_utc() -> None:
    assert startup.iso_utc(1700000000.25) == "2023-11-14T22:13:20.250Z"
    assert _unix(startup.iso_utc(1700000000.25)) == 1700000000.25


def _task(**kw: object) -> TaskConfig:
    doc = json.loads(DEMO_CONFIG.read_text(encoding="utf-8"))["task"]
    doc["model"] = str(ROOT / doc["model"])
    return TaskConfig.from_dict({**doc, **kw})


def test_unused_packages_follow_the_job(tmp_path: Path) -> None:
    demo = _task()
    assert startup.unused_packages(demo, {}) == ("peft", "boto3")
    # LoRA is peft; so is a local model that is an adapter (transformers loads it through peft).
    assert "peft" not in startup.unused_packages(_task(type="causal-lm", lora={"r": 8}), {})
    (tmp_path / "adapter_config.json").write_text("{}")
    assert "peft" not in startup.unused_packages(_task(model=str(tmp_path)), {})
    # S3 is boto3: an output URL or an s3:// resumeFrom; a claim's resumeFrom is a local directory.
    assert "boto3" not in startup.unused_packages(demo, {"FTJOB_OUTPUT_URL": "s3://b/p/ns/job/"})
    assert "boto3" not in startup.unused_packages(demo, {"FTJOB_RESUME_FROM": "s3://b/p/ns/other/"})
    assert "boto3" in startup.unused_packages(demo, {"FTJOB_RESUME_FROM": "/resume-from"})


def test_hide_marks_absent_what_is_not_imported_yet() -> None:
    present = object()
    modules: dict[str, object] = {"boto3": present}
    assert startup.hide(("peft", "boto3"), modules) == ("peft",)
    assert modules == {"boto3": present, "peft": None}


# Modules a rank must not load for the demo job: the unused optional packages, and the other tasks' plugins.
HEAVY = ("torch", "transformers", "datasets", "peft", "boto3", "botocore")
OTHER_TASKS = ("finetune_runtime.tasks.causal_lm", "finetune_runtime.tasks.question_answering")

LIST_MODULES = "import json, sys; print('MODULES ' + json.dumps(sorted(k for k, v in sys.modules.items() if v)))"


def _modules(out: str) -> set[str]:
    line = next(x for x in out.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line[len("MODULES ") :]))


def _loaded(modules: set[str], package: str) -> bool:
    return any(m == package or m.startswith(package + ".") for m in modules)


def test_launcher_and_rank_entry_modules_import_no_stack() -> None:
    """`ftjob-runtime launch` execs torchrun without importing torch itself, and a rank's entry modules load the
    stack only when the worker runs (after its caches and hidden packages are set)."""
    code = (
        "import finetune_runtime.cli, finetune_runtime.launcher, finetune_runtime.train, finetune_runtime.startup\n"
        + LIST_MODULES
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules = _modules(out)
    assert not [p for p in HEAVY if _loaded(modules, p)], sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not [t for t in OTHER_TASKS if _loaded(modules, t)]


@pytest.mark.slow
@pytest.mark.tf457
def test_demo_rank_never_imports_peft_boto3_or_other_tasks(tmp_path: Path) -> None:
    """The rank entry (train.run_worker, what `python -m finetune_runtime worker` runs) on the demo job: peft and
    boto3 stay unimported although the image installs them (transformers and accelerate would import both), and
    only the job's own task plugin loads. Its train lines carry the start and the end of its first step."""
    cfg = job_config(DEMO_CONFIG).training(maxSteps=2, logEverySteps=1).write(tmp_path / "config.json")
    env = runtime_env(tmp_path, cfg, FTJOB_NPROC_PER_NODE="1")
    code = (
        "from finetune_runtime.train import run_worker\nrc = run_worker()\n" + LIST_MODULES + "\nraise SystemExit(rc)"
    )
    before = time.time()
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    after = time.time()
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    modules = _modules(p.stdout)
    assert _loaded(modules, "transformers") and "finetune_runtime.tasks.text_classification" in modules
    assert not _loaded(modules, "peft") and not _loaded(modules, "boto3") and not _loaded(modules, "botocore")
    assert not [t for t in OTHER_TASKS if _loaded(modules, t)]
    assert "not loading peft, boto3: this job does not use them" in p.stderr
    train = [r for r in progress_records(p.stdout) if r["event"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert len({(r["startedAt"], r["firstStepAt"]) for r in train}) == 1  # the same two times on every line
    started, first = _unix(train[0]["startedAt"]), _unix(train[0]["firstStepAt"])
    # No launcher: the worker counts from its own start.
    assert before - TICK_SLACK <= started < first <= after


@pytest.mark.slow
def test_lora_rank_imports_peft(tmp_path: Path) -> None:
    """The other side of the rule: a LoRA job's rank has peft (the hidden-package list follows the job)."""
    code = (
        "from finetune_runtime import startup\n"
        "from finetune_runtime.config import load_config\n"
        "task = load_config().task\n"
        "startup.hide(startup.unused_packages(task, {}))\n"
        "import transformers.trainer_utils, importlib.util\n"
        "print('PEFT', importlib.util.find_spec('peft') is not None)\n" + LIST_MODULES
    )
    for lora, expected in ((None, False), ({"r": 4}, True)):
        cfg = job_config(DEMO_CONFIG).task(type="causal-lm", lora=lora).write(tmp_path / "config.json")
        env = runtime_env(tmp_path, cfg)
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        assert f"PEFT {expected}" in p.stdout
        # transformers.trainer_utils imports peft whenever it can find it.
        assert _loaded(_modules(p.stdout), "peft") is expected


@pytest.mark.slow
def test_a_pod_counts_from_its_launchers_start(tmp_path: Path) -> None:
    """`ftjob-runtime launch` (a rank pod's main process) starts the clock: rank 0's train lines carry its start,
    before either rank's process, which torchrun started later."""
    cfg = (
        job_config(DEMO_CONFIG)
        .training(maxSteps=2, logEverySteps=1, checkpointEverySteps=100)
        .dataset(trainSamples=64, evalSamples=16)
        .write(tmp_path / "config.json")
    )
    env = runtime_env(tmp_path, cfg)
    proc = subprocess.Popen(
        runtime_argv("launch"), env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    launcher = startup.process_start(proc.pid)
    workers: dict[int, float] = {}
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the workers exist from torchrun's start until the run ends
        lines.append(line)
        for pid in descendants(proc.pid):
            if pid not in workers and (t := startup.process_start(pid)) is not None:
                workers[pid] = t
    assert proc.wait(timeout=600) == 0, "".join(lines[-40:])
    train = [r for r in progress_records("".join(lines)) if r["event"] == "train"]
    assert train, "".join(lines[-40:])
    assert launcher is not None and _unix(train[0]["startedAt"]) == pytest.approx(launcher, abs=TICK_SLACK)
    assert len(workers) >= 2 and _unix(train[0]["startedAt"]) < min(workers.values())


def test_train_lines_carry_the_start_and_the_first_steps_end_once_there_is_one() -> None:
    import io
    from types import SimpleNamespace

    from finetune_runtime.callbacks import ProgressCallback
    from finetune_runtime.progress import ProgressEmitter

    def lines(precompile: bool, started_at: float | None) -> list[dict[str, object]]:
        out = io.StringIO()
        cb = ProgressCallback(ProgressEmitter(True, out), precompile, False, uid="u", started_at=started_at)
        args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=1, world_size=1, bf16=False)
        state = SimpleNamespace(global_step=0, max_steps=3, epoch=0.0)
        cb.on_train_begin(args, state, None)
        cb.on_log(args, state, None, logs={"loss": 1.0})  # before any step (a resumed run's first log)
        for step in (1, 2):
            state.global_step = step
            cb.on_step_end(args, state, None)
            cb.on_log(args, state, None, logs={"loss": 1.0})
        return progress_records(out.getvalue())

    before = time.time()
    first, *later = lines(False, 1700000000.5)
    assert "startedAt" not in first and "firstStepAt" not in first
    assert [r["startedAt"] for r in later] == ["2023-11-14T22:13:20.500Z"] * 2
    assert len({r["firstStepAt"] for r in later}) == 1 and _unix(str(later[0]["firstStepAt"])) >= before - 0.001
    # A precompile trial's steps are not the job's first; without a start there is nothing to report.
    assert not [r for r in lines(True, 1700000000.5) + lines(False, None) if "startedAt" in r or "firstStepAt" in r]
