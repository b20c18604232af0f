"""Helpers for the runtime tier: job configs, the runtime's env contract, running launchers, reading progress."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DEMO_CONFIG = EXAMPLES / "jobs" / "demo-ja-config.json"
SQUAD_CONFIG = EXAMPLES / "jobs" / "squad-mini-config.json"
PROGRESS = "FTJOB_PROGRESS "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class JobConfig:
    """job_config(DEMO_CONFIG).training(maxSteps=8).write(tmp_path / "config.json")"""

    def __init__(self, base: Path) -> None:
        self.doc: dict[str, Any] = json.loads(base.read_text(encoding="utf-8"))
        # Example configs use repo-relative paths; tests run from tmp dirs.
        task = self.doc["task"]
        task["model"] = str(ROOT / task["model"])
        if "path" in task["dataset"]:
            task["dataset"]["path"] = str(ROOT / task["dataset"]["path"])

    def training(self, **kw: Any) -> JobConfig:
        self.doc["training"].update(kw)
        return self

    def task(self, **kw: Any) -> JobConfig:
        self.doc["task"].update(kw)
        return self

    def dataset(self, **kw: Any) -> JobConfig:
        self.doc["task"]["dataset"].update(kw)
        return self

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(copy.deepcopy(self.doc), ensure_ascii=False), encoding="utf-8")
        return path


def job_config(base: Path) -> JobConfig:
    return JobConfig(base)


# The Japanese samples' data source (manifests/samples/*bert-ja*.yaml) and the tiny model that stands in for
# their hub model here.
HUB_DATASET = "hf://datasets/mteb/amazon_reviews_multi/"
TINY_BERT_JA = EXAMPLES / "models" / "tiny-bert-ja"


def write_hub_layout(root: Path) -> Path:
    """Our reviews in mteb/amazon_reviews_multi's layout: root/ja/{train,validation}.jsonl, sorted by label."""
    path = EXAMPLES / "data" / "ja-reviews" / "compose_reviews.py"
    spec = importlib.util.spec_from_file_location("compose_reviews", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write_hub_layout(root)
    return root


def sample_config(sample: str, hub_root: Path, path: Path) -> JobConfig:
    """The config.json the operator puts into the pods of manifests/samples/<sample>.yaml (admission defaults,
    then the ConfigMap builder), with the Hub dataset's URL prefix pointing at hub_root (the same layout) and
    the hub model replaced by the tiny one: everything else, recipe included, is the sample's."""
    from finetune_operator.admission import validate
    from finetune_operator.builders import desired

    job = validate(yaml.safe_load((ROOT / "manifests" / "samples" / f"{sample}.yaml").read_text()))
    cm = next(o for o in desired(job).objects if o["kind"] == "ConfigMap")
    doc = json.loads(cm["data"]["config.json"])
    files = doc["task"]["dataset"]["dataFiles"]
    assert all(url.startswith(HUB_DATASET) for url in files.values()), files
    doc["task"]["dataset"]["dataFiles"] = {s: str(hub_root) + "/" + url[len(HUB_DATASET) :] for s, url in files.items()}
    doc["task"]["model"] = str(TINY_BERT_JA)
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return JobConfig(path)


@dataclass
class Run:
    rc: int
    out: str
    output_dir: Path

    @property
    def progress(self) -> list[dict[str, Any]]:
        return progress_records(self.out)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.progress if r["event"] == name]

    @property
    def done(self) -> dict[str, Any]:
        done = self.events("done")
        assert len(done) == 1, f"expected one done line, got {len(done)}\n{self.out[-3000:]}"
        return done[0]


def progress_records(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        i = line.find(PROGRESS)
        if i >= 0:
            out.append(json.loads(line[i + len(PROGRESS) :]))
    return out


def runtime_env(tmp: Path, config: Path, **extra: str) -> dict[str, str]:
    """The env contract of docs/architecture.md with local values (what `ftjob run` sets)."""
    # Drop what an earlier test (torch._inductor sets TORCHINDUCTOR_CACHE_DIR in-process) or the caller's
    # shell may carry: each run gets only the contract's variables.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "FTJOB_",
                "RANK",
                "LOCAL_RANK",
                "WORLD_SIZE",
                "MASTER_",
                "PMI_",
                "OMPI_",
                "TORCHINDUCTOR_",
                "HF_HOME",
                "HF_DATASETS_CACHE",
            )
        )
    }
    env.update(
        {
            "FTJOB_JOB_NAME": "t",
            "FTJOB_NAMESPACE": "default",
            "FTJOB_CONFIG": str(config),
            "FTJOB_PROFILE": "cpu",
            "FTJOB_BACKEND": "cpu",
            "FTJOB_LAUNCHER": "torchrun",
            "FTJOB_NNODES": "1",
            "FTJOB_NPROC_PER_NODE": "2",
            "FTJOB_NODE_RANK": "0",
            "FTJOB_MASTER_ADDR": "127.0.0.1",
            "FTJOB_MASTER_PORT": str(free_port()),
            "FTJOB_OUTPUT_DIR": str(tmp / "output"),
            "FTJOB_CACHE_DIR": str(tmp / "cache"),
            "FTJOB_MODE": "train",
            "FTJOB_SSH_PORT": "2222",
            # Two ranks on two shared cores: one thread each (torchrun does this; mpirun does not).
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(extra)
    return env


def runtime_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "finetune_runtime", *args]


def run_runtime(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 420) -> Run:
    p = subprocess.run(
        runtime_argv(*args),
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    (cwd / "run.log").write_text(p.stdout)
    return Run(p.returncode, p.stdout, Path(env["FTJOB_OUTPUT_DIR"]))


def poll(cond: Callable[[], Any], deadline_s: float, what: str, interval: float = 0.2) -> Any:
    """Wait for cond() to be truthy, failing with `what` at the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(interval)  # poll again until the deadline
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")


def descendants(pid: int) -> list[int]:
    """Every process below pid (from /proc). torchrun starts its workers in sessions of their own, so a
    process-group kill of the launcher would leave the ranks running; a pod's death takes them all."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int) -> list[int]:
    """SIGKILL pid and everything it started (what happens to a pod's processes when the pod dies)."""
    pids = [pid, *descendants(pid)]
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return pids


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (zombies waiting for a reaper count as gone)."""
    out = []
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append(p)
    return out


@pytest.fixture
def popen_group() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start processes in their own process group; kill whatever is left of those groups afterwards."""
    procs: list[subprocess.Popen[str]] = []

    def start(argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        p = subprocess.Popen(argv, start_new_session=True, text=True, **kw)
        procs.append(p)
        return p

    yield start
    for p in procs:
        kill_tree(p.pid)
        p.wait(timeout=30)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tf457: the reduced subset also run under transformers 4.57 (.venv-tf457)")
