"""`ftjob run`: real local trainings through the runtime's own launch paths, with the pods' environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from homes import SentinelHome
from tierdeps import MPI_IMPLEMENTATIONS, mpi_env

from finetune_operator import progress
from finetune_operator.admission import validate
from finetune_operator.builders import desired
from finetune_operator.local import local_env
from finetune_operator.sshkeys import generate_keys

ROOT = Path(__file__).resolve().parents[2]
FTJOB = str(Path(sys.executable).with_name("ftjob"))


def _job(name: str) -> dict:
    return validate(yaml.safe_load((ROOT / "examples" / "jobs" / name).read_text()))


def test_local_env_is_the_pod_env_with_local_paths(tmp_path: Path) -> None:
    job = _job("demo-ja-sentiment.yaml")
    pod_env = {e["name"]: e["value"] for e in desired(job).pods[0]["spec"]["containers"][0]["env"] if "value" in e}
    env, nodes, procs, _ = local_env(job, tmp_path, None, None, None)
    assert (nodes, procs) == (1, 2)
    local_only = {
        "FTJOB_CONFIG",
        "FTJOB_CACHE_DIR",
        "FTJOB_OUTPUT_DIR",
        "FTJOB_MASTER_ADDR",
        "FTJOB_MASTER_PORT",
        "HF_HOME",
        "HOME",
        "OMP_NUM_THREADS",
        "FTJOB_NODE_RANK",
        "FTJOB_NAMESPACE",
        "FTJOB_JOB_NAME",
        "FTJOB_SSH_DIR",
        "FTJOB_JOB_UID",
    }
    same = {k for k in pod_env if k not in local_only}
    assert {k: env[k] for k in same} == {k: pod_env[k] for k in same}
    assert env["FTJOB_MASTER_ADDR"] == "127.0.0.1"
    assert env["FTJOB_OUTPUT_DIR"] == str((tmp_path / "output" / "demo-ja").resolve())
    assert env["FTJOB_SSH_DIR"] == str((tmp_path / "ssh").resolve())  # never the user's ~/.ssh
    assert "FTJOB_SSH_DIR" not in pod_env  # pods keep the image user's ~/.ssh
    assert "FTJOB_JOB_UID" in pod_env and "FTJOB_JOB_UID" not in env  # local runs: the runtime's own uid


def test_local_env_says_the_pod_templates_volumes_are_not_made_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job("demo-ja-sentiment.yaml")
    local_env(job, tmp_path, None, None, None)
    assert "spec.podTemplate" not in capsys.readouterr().err
    job["spec"]["podTemplate"] = {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    local_env(job, tmp_path, None, None, None)
    err = capsys.readouterr().err
    assert "spec.podTemplate's volumes and init containers belong to the pods" in err and "/data" in err


@pytest.mark.parametrize(
    ("stack", "variable", "folder"),
    [("xla", "NEURON_COMPILE_CACHE_URL", "neuron"), ("native", "TORCH_NEURONX_NEFF_CACHE_DIR", "neuron-neff")],
)
def test_local_env_keeps_the_stacks_compile_cache_in_the_workdir(
    tmp_path: Path, stack: str, variable: str, folder: str
) -> None:
    """A trn2 job run on a trn2 machine: the stack's compile cache goes under the workdir's cache, not the pods'
    /cache mount; an S3 cache URL (xla) stays as given."""
    job = yaml.safe_load((ROOT / "examples" / "jobs" / "demo-ja-sentiment.yaml").read_text())
    job["spec"]["hardware"] = {"profile": "trn2", "stack": stack, "instanceType": "trn2.48xlarge", "procsPerNode": 2}
    env, _, _, _ = local_env(validate(job), tmp_path, None, None, None)
    assert env[variable] == str((tmp_path / "cache" / folder).resolve())
    other = {"NEURON_COMPILE_CACHE_URL", "TORCH_NEURONX_NEFF_CACHE_DIR"} - {variable}
    assert not other & set(env)
    if stack == "xla":
        job["spec"]["compileCache"] = {"url": "s3://bucket/neff"}
        env, _, _, _ = local_env(validate(job), tmp_path, None, None, None)
        assert env[variable] == "s3://bucket/neff"


def test_local_mpi_hostfile_matches_implementation(tmp_path: Path) -> None:
    job = _job("squad-mini-mpi.yaml")
    env, _, procs, _ = local_env(job, tmp_path, None, None, None)
    assert Path(env["FTJOB_HOSTFILE"]).read_text() == f"localhost:{procs}\n"
    job["spec"]["mpi"]["implementation"] = "openmpi"
    env, _, procs, _ = local_env(job, tmp_path, None, None, None)
    assert Path(env["FTJOB_HOSTFILE"]).read_text() == f"localhost slots={procs}\n"
    assert desired(job, ssh_keys=generate_keys("x")).layout.launcher == "mpi"
    job["spec"]["mpi"]["implementation"] = "intel"  # Hydra's dialect, as MPICH
    env, _, procs, _ = local_env(job, tmp_path, None, None, None)
    assert Path(env["FTJOB_HOSTFILE"]).read_text() == f"localhost:{procs}\n"


def _run_example(
    job: str | Path, workdir: Path, output: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`ftjob run` of examples/jobs/JOB (or a job file) from the repository root, with HOME a stand-in for a
    user's home that must stay as it was; the run's metrics.json."""
    home = SentinelHome(workdir.parent / f"{workdir.name}-home")
    r = subprocess.run(
        [FTJOB, "run", "-f", str(ROOT / "examples" / "jobs" / job), "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        env={**os.environ, **(env or {}), "HOME": str(home.path)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    home.assert_unchanged()
    return r, json.loads((workdir / "output" / output / "metrics.json").read_text())


@pytest.mark.slow
def test_demo_job_trains_two_ranks_with_torchrun(tmp_path: Path) -> None:
    before = time.time()
    r, metrics = _run_example("demo-ja-sentiment.yaml", tmp_path / "w", "demo-ja")
    assert metrics["worldSize"] == 2
    assert metrics["eval"]["accuracy"] >= 0.7  # balanced eval set: chance is 0.5
    assert "predictions:" in r.stdout and "positive" in r.stdout
    assert "done" in r.stderr  # the progress reporter saw the runtime's final line
    # The operator's parser turns this real runtime log into status.progress (what `kubectl get ftj` shows).
    prog = progress.from_text((tmp_path / "w" / "logs" / "train-node0.log").read_text())
    assert prog is not None and prog["event"] == "done"
    assert prog["step"] == prog["totalSteps"] == metrics["globalStep"]
    assert prog["metrics"]["accuracy"] == metrics["eval"]["accuracy"]
    assert prog["summary"].endswith("done") and f"{prog['step']}/{prog['totalSteps']} (100%)" in prog["summary"]
    assert f"accuracy {metrics['eval']['accuracy']:.3g}" in prog["summary"]  # the task's summaryMetric
    # The time to the first step counts from `ftjob run`'s own start (docs/runtime.md), and ftjob run says it.
    train = [x for x in map(progress.parse_line, (tmp_path / "w" / "logs" / "train-node0.log").open()) if x]
    train = [x for x in train if x["event"] == "train"]
    started = datetime.fromisoformat(train[0]["startedAt"]).timestamp()
    assert before - 0.03 <= started < datetime.fromisoformat(train[0]["firstStepAt"]).timestamp()
    assert prog["timeToFirstStepSeconds"] > 0
    assert f"train: first training step after {prog['timeToFirstStepSeconds']} s" in r.stderr


@pytest.mark.slow
def test_causal_lm_lora_job_trains_two_ranks_and_saves_a_working_adapter(tmp_path: Path) -> None:
    """examples/jobs/instruct-mini-lora.yaml: the tiny Llama with LoRA on 2 torchrun ranks prints metrics and
    generations, and its adapter loads with peft and generates."""
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    r, metrics = _run_example("instruct-mini-lora.yaml", tmp_path / "w", "instruct-mini")
    assert metrics["worldSize"] == 2 and metrics["task"] == "causal-lm"
    assert {"loss", "perplexity"} <= set(metrics["eval"]) and metrics["eval"]["perplexity"] < 30
    assert "perplexity=" in r.stdout and '"generation"' in r.stdout
    out = tmp_path / "w" / "output" / "instruct-mini"
    tok = AutoTokenizer.from_pretrained(str(out / "model"))
    model = AutoPeftModelForCausalLM.from_pretrained(str(out / "model")).eval()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the opposite of early?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
    answer = tok.decode(gen[0][ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip(), "the adapter generated nothing"
    assert (out / "model-merged" / "model.safetensors").exists()  # task.lora.merge


@pytest.mark.slow
@pytest.mark.parametrize("impl", MPI_IMPLEMENTATIONS)
def test_squad_job_trains_two_ranks_over_mpi(tmp_path: Path, impl: str, request: pytest.FixtureRequest) -> None:
    """The SQuAD-format sample with each `mpi.implementation` (Intel MPI: Hydra with `-bootstrap ssh`, the
    xeon profile's launcher). The ssh files go to the workdir, not to the user's ~/.ssh."""
    doc = yaml.safe_load((ROOT / "examples" / "jobs" / "squad-mini-mpi.yaml").read_text())
    doc["spec"]["mpi"]["implementation"] = impl
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in mpi_env(request, impl).items() if k != "FTJOB_MPI_IMPLEMENTATION"}  # the spec's
    workdir = tmp_path / "w"
    _, metrics = _run_example(job, workdir, "squad-mini", env)
    assert metrics["worldSize"] == 2 and metrics["globalStep"] == 12
    assert {"exact_match", "f1"} <= set(metrics["eval"])
    log = (workdir / "logs" / "train-node0.log").read_text()
    flag = {"mpich": "-launcher-exec", "openmpi": "plm_rsh_agent", "intel": "-bootstrap-exec"}[impl]
    assert f"{flag} {(workdir / 'ssh' / 'ftjob-ssh').resolve()}" in log.splitlines()[0]
    assert f"rank 0 of 2 ({'openmpi' if impl == 'openmpi' else 'hydra'})" in log
    # The same strict client config as in pods; without a Secret there is no known_hosts, so nothing is trusted.
    ssh_cfg = [ln.strip() for ln in (workdir / "ssh" / "config").read_text().splitlines()]
    assert "StrictHostKeyChecking yes" in ssh_cfg and not (workdir / "ssh" / "known_hosts").exists()


def test_invalid_job_is_rejected_before_anything_runs(tmp_path: Path) -> None:
    bad = yaml.safe_load((ROOT / "examples/jobs/demo-ja-sentiment.yaml").read_text())
    bad["spec"]["training"]["precision"] = "fp8"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    r = subprocess.run(
        [FTJOB, "run", "-f", str(path), "--workdir", str(tmp_path / "w")], capture_output=True, text=True
    )
    assert r.returncode == 1 and "spec.training.precision" in r.stderr
    assert not (tmp_path / "w").exists()
