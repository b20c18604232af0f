"""benchmarks/runtime_overhead.py and data_prep.py: the timing lines they read and the summaries they write."""

from __future__ import annotations

import json
from pathlib import Path

import data_prep
import pytest
import runtime_overhead as ro

from finetune_runtime.progress import format_line

ROOT = Path(__file__).resolve().parents[2]


def test_step_of_reads_runtime_progress_lines_and_bare_lines() -> None:
    assert ro.step_of(format_line("train", step=10, totalSteps=30, loss=0.5)) == 10
    assert ro.step_of("2026-12-03 [rank 0] x: " + format_line("train", step=1, totalSteps=30)) == 1
    assert ro.step_of(format_line("eval", step=10, totalSteps=30, metrics={})) is None
    assert ro.step_of("BENCH-STEP 20") == 20
    assert ro.step_of("{'loss': 0.69}") is None


def test_samples_per_second_from_first_to_last_logged_step() -> None:
    lines = [
        (0.5, "loading"),
        (12.0, "BENCH-STEP 1"),
        (20.0, "BENCH-STEP 10"),
        (29.0, "{'eval_loss': 1}"),
        (32.0, "BENCH-STEP 20"),
        (35.0, "BENCH-DONE"),
    ]
    r = ro.result_from_lines("bare", lines, wall=36.0, batch=16)
    assert r.seconds_to_first_step == 12.0
    assert r.samples_per_second == pytest.approx(19 * 16 / 20.0, abs=0.01)
    assert r.steps == 20


def test_a_run_without_a_step_one_line_is_an_error() -> None:
    with pytest.raises(ValueError, match="step-1 line"):
        ro.result_from_lines("runtime", [(1.0, "BENCH-STEP 10"), (2.0, "BENCH-STEP 20")], 3.0, 16)


def test_summary_is_ratio_of_medians_and_per_pair_ratios() -> None:
    runs = [
        ro.RunResult("runtime", 5.0, 9.0, 0, 30),
        ro.RunResult("bare", 4.0, 10.0, 0, 30),
        ro.RunResult("runtime", 7.0, 10.0, 0, 30),
        ro.RunResult("bare", 6.0, 10.0, 0, 30),
        ro.RunResult("runtime", 6.0, 99.0, 0, 30),
        ro.RunResult("bare", 5.0, 11.0, 0, 30),
    ]
    s = ro.summarize(runs)
    assert s["median"]["runtime"] == {"samplesPerSecond": 10.0, "secondsToFirstStep": 6.0}
    assert s["median"]["bare"] == {"samplesPerSecond": 10.0, "secondsToFirstStep": 5.0}
    assert s["samplesPerSecondRatio"] == 1.0
    assert s["firstStepDelaySeconds"] == 1.0
    assert s["pairRatios"] == [0.9, 1.0, 9.0] and s["pairRatioMedian"] == 1.0


def test_scaled_data_repeats_rows_with_unique_ids(tmp_path: Path) -> None:
    texts = data_prep.write_scaled(tmp_path, 3)
    train = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    original = (ROOT / "examples/data/ja-reviews/train.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(train) == len(texts) == 3 * len(original)
    assert len({r["review_id"] for r in train}) == len(train)


def test_compile_cache_job_is_the_sample_with_a_trial_and_compile(tmp_path: Path) -> None:
    import compile_cache as cc

    from finetune_operator.admission import validate

    doc = cc.job_doc(trial_steps=3)
    spec = validate(doc)["spec"]  # what ftjob run checks first: the benchmark's job is a valid FineTuneJob
    assert spec["compileCache"] == {"precompile": True, "precompileSteps": 3} | {
        k: v for k, v in spec["compileCache"].items() if k not in ("precompile", "precompileSteps")
    }
    assert spec["training"]["compile"] is True and spec["hardware"]["procsPerNode"] == 1
    assert Path(spec["task"]["model"]).is_dir() and Path(spec["task"]["dataset"]["path"]).is_dir()
    log = tmp_path / "precompile-node0.log"
    log.write_text(
        "noise\n"
        + format_line("precompile", step=1)
        + "\n"
        + "[rank0]: "
        + format_line("precompile", step=2, complete=True, cache={"warm": True})
        + "\n"
    )
    assert [r["step"] for r in cc.records(log, "precompile")] == [1, 2]
    assert cc.records(log, "train") == [] and cc.records(tmp_path / "absent.log", "train") == []


def test_first_step_runs_the_rank0_pod_as_ftjob_render_makes_it(tmp_path: Path) -> None:
    """first_step.py's container: the demo job's rank-0 pod (command, env, config.json) from the builders, with
    the loopback as rank 0's address and the pod's volumes as fresh folders."""
    import first_step as fs

    pod = fs.rank0_pod()
    assert pod.command == ["ftjob-runtime", "launch"]
    assert pod.env["FTJOB_NPROC_PER_NODE"] == "2" and pod.env["FTJOB_MASTER_ADDR"] == "127.0.0.1"
    assert json.loads(pod.config_json)["task"]["model"] == "examples/models/tiny-bert-ja"
    args = fs.docker_args(pod, "img:tag", "c1", tmp_path)
    assert args[args.index("img:tag") :] == ["img:tag", "ftjob-runtime", "launch"]
    assert f"{tmp_path / 'config.json'}:{pod.config_path}:ro" in args
    assert not [a for a in args if a.startswith("PYTHONPYCACHEPREFIX")]
    assert f"{tmp_path / 'cache'}:/cache" in args and (tmp_path / "cache").stat().st_mode & 0o777 == 0o777
    assert args[args.index("--network") + 1] == "none" and args[args.index("-w") + 1] == fs.WORKDIR
    # Without venv bytecode: the standard library's, read-only, as the only bytecode Python may read.
    (tmp_path / "2").mkdir()
    twin = fs.docker_args(pod, "img:tag", "c2", tmp_path / "2", tmp_path / "prefix")
    assert f"{tmp_path / 'prefix'}:{fs.PREFIX_IN_CONTAINER}:ro" in twin
    assert f"PYTHONPYCACHEPREFIX={fs.PREFIX_IN_CONTAINER}" in twin and "PYTHONDONTWRITEBYTECODE=1" in twin


def test_first_step_clocks_and_summary() -> None:
    import first_step as fs

    assert fs.docker_time("2026-12-04T19:33:40.123456789Z") == pytest.approx(1796412820.123456789, abs=1e-6)
    assert fs.docker_time("2026-12-04T19:33:40Z") == 1796412820.0
    line = "[rank0]: " + format_line("train", step=1, totalSteps=9, startedAt="2026-12-04T19:33:30.000Z")
    assert fs.first_train(line) is not None and fs.first_train(format_line("eval", step=1)) is None
    assert [s.name for s in fs.sides_for("a", "b")] == [
        "image",
        "image, no venv bytecode",
        "compare",
        "ftjob run",
        "ftjob run, no venv bytecode",
    ]
    assert [s.name for s in fs.sides_for(None, None)] == ["ftjob run", "ftjob run, no venv bytecode"]
    runs = [
        fs.FirstStep("image", 1, 5.0, 5.2, 5.5, 0.2, 8.0),
        fs.FirstStep("image, no venv bytecode", 1, 20.0, 20.2, 20.5, 0.2, 30.0),
        fs.FirstStep("image", 2, 7.0, 7.2, 7.5, 0.1, 9.0),
        fs.FirstStep("image, no venv bytecode", 2, 15.0, 15.2, 15.5, 0.3, None),
        fs.FirstStep("ftjob run", 1, 6.0, 6.0, None),
    ]
    s = fs.summarize(runs)
    assert s["median"]["image"] == {
        "startToFirstStep": 6.0,
        "reported": 6.2,
        "launchToFirstStep": 6.5,
        "createdToStarted": 0.15,
        "cpuToFirstStep": 8.5,
    }
    assert s["median"]["ftjob run"]["launchToFirstStep"] is None
    # Per round, each bytecode side against its twin without venv bytecode.
    # CPU seconds only where both runs of a round have them.
    assert s["bytecodeSaves"] == {
        "image": {
            "withoutMinusWithSeconds": [15.0, 8.0],
            "median": 11.5,
            "cpuWithoutMinusWithSeconds": [22.0],
            "cpuMedian": 22.0,
        }
    }
    assert "| image | 6.0 | 6.2 | 6.5 | 0.15 | 8.5 |" in fs.table(s)
    assert "| ftjob run | 6.0 | 6.0 | - | - | - |" in fs.table(s)


def test_first_step_cpu_of_a_container_cgroup(tmp_path: Path) -> None:
    import first_step as fs

    v1 = tmp_path / "v1" / "cpuacct" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("2500000000\n")
    assert fs.container_cpu_seconds("abc", tmp_path / "v1") == 2.5
    v2 = tmp_path / "v2" / "system.slice" / "docker-abc.scope"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    assert fs.container_cpu_seconds("abc", tmp_path / "v2") == 1.5
    assert fs.container_cpu_seconds("other", tmp_path / "v2") is None


def test_first_step_cpu_of_a_process_tree_counts_live_and_reaped_children() -> None:
    import subprocess
    import sys
    import time

    import first_step as fs

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\n"
    # A parent that burns 0.3 s, has reaped a child that burnt 0.3 s, and has a live child that burns 0.3 s.
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {burn.format(0.3)!r}])\n"
        f"exec({burn.format(0.3)!r})\n"
        f"child = subprocess.Popen([sys.executable, '-c', {(burn.format(0.3) + 'time.sleep(60)')!r}])\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 60
        while (cpu := fs.tree_cpu_seconds(proc.pid)) < 0.9 and time.monotonic() < deadline:
            time.sleep(0.05)  # the live child is still burning
        assert cpu >= 0.9
        # Not this test process's own CPU, nor other processes'.
        assert cpu < 0.9 + 3.0
    finally:
        proc.kill()
        proc.wait()
