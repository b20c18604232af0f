"""What the xeon-amx default stack costs against the seed's: gloo against oneCCL between 2 ranks on the QA sample.

    python benchmarks/xeon_stacks.py [--arms upstream,ipex] [--repeats 3] [--steps 200] [--mpi mpich]
                                     [--collective-repeats 5] [--json FILE]

Training: each arm is `ftjob run` of examples/jobs/squad-mini-mpi.yaml (the tiny DistilBERT on the SQuAD-format
sample, 2 ranks under mpirun) made a xeon-amx job of one stack (spec.hardware.stack), with the environment the
profile derives for that stack (ftjob run renders the pods' environment with this machine's CPUs):

  upstream  the profile's default: FTJOB_BACKEND=xeon-upstream, gloo between the ranks, all of a rank's cores to
            OpenMP
  ipex      the seed's: FTJOB_BACKEND=xeon, the `ccl` process group (oneCCL) and ipex.optimize, CCL_WORKER_COUNT=2
            progress threads taken from each rank's cores
  upstream-1rank  the upstream arm on one rank: no all-reduce at all, for the scaling of the 2-rank arms

The arms run interleaved, --repeats times; each run's samples/s is its samples over its time after the first
`train` progress line (as benchmarks/calibrate_cpu.py), --steps optimizer steps long (the sample has 12).

Collectives: torch.distributed.all_reduce of a float32 buffer the size of the sample model's gradients and of
DistilBERT-base's (distilbert-base-uncased with a QA head, the seed's model: its size from the config, no download),
between 2 processes on loopback, on each process group this Python has: gloo always, ccl when
oneccl_bindings_for_pytorch imports, mpi when torch was built with it. That is the part of a data-parallel step the
stack's process group changes.

An arm or a process group runs only where its stack is installed in this Python. The ipex arm needs
oneccl_bindings_for_pytorch and intel_extension_for_pytorch: without them the runtime would fall back to gloo and
measure upstream twice, so the arm is not run and the result says why, with the import error and what PyPI has
(`pip download` of oneccl_bind_pt and `pip index versions` of oneCCL's library packages: PyPI is the only registry
the development machine reaches).

On a Sapphire Rapids node with the IPEX stack (the finetune-operator/xeon image, or torch 2.7 + IPEX 2.7 +
oneccl_bind_pt 2.7 from Intel's index) run it as is, with --mpi intel where Intel MPI is installed. Results:
benchmarks/README.md, "Xeon stacks".
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from benchio import write_json
from calibrate_cpu import machine, run_rate, train_windows

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "jobs" / "squad-mini-mpi.yaml"
# What each arm is, and the modules its stack needs in the Python that runs the ranks.
ARMS: dict[str, dict[str, Any]] = {
    "upstream": {"stack": "upstream", "ranks": 2, "needs": ()},
    "ipex": {"stack": "ipex", "ranks": 2, "needs": ("oneccl_bindings_for_pytorch", "intel_extension_for_pytorch")},
    "upstream-1rank": {"stack": "upstream", "ranks": 1, "needs": ()},
}
# The process groups the collectives part tries, and the module that registers each one (None: in torch).
GROUPS: dict[str, str | None] = {"gloo": None, "ccl": "oneccl_bindings_for_pytorch", "mpi": None}
ONECCL_BINDINGS = "oneccl_bind_pt==2.7.0"  # the ipex stack's pin (images/xeon/requirements-ipex.txt)
ONECCL_LIBRARIES = ("oneccl", "oneccl-devel")  # oneCCL itself on PyPI: the C library and its headers, no bindings


def import_error(module: str) -> str | None:
    """None when `module` imports here, else the error as Python gives it."""
    try:
        importlib.import_module(module)
    except Exception as e:  # the message is the result: ImportError, or a binding built for another torch
        return f"{type(e).__name__}: {e}"
    return None


def group_unavailable(group: str) -> str | None:
    import torch.distributed as dist

    if group == "mpi":
        return (
            None
            if dist.is_mpi_available()
            else "torch.distributed.is_mpi_available() is False (torch built without MPI)"
        )
    module = GROUPS[group]
    return import_error(module) if module else None


def pypi_probe() -> dict[str, Any]:
    """What PyPI (the one registry reachable where this was written) offers for oneCCL: its torch bindings, and
    the library alone (libccl, no torch.distributed process group without the bindings)."""
    # This venv's pip, else the one on PATH (uv's venvs have none); the answer does not depend on which.
    pip = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else [shutil.which("pip") or "pip"]
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run(
            [*pip, "download", "--no-deps", "--dest", d, ONECCL_BINDINGS],
            capture_output=True,
            text=True,
            timeout=300,
        )
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    out: dict[str, Any] = {
        "bindings": {"command": f"pip download --no-deps {ONECCL_BINDINGS}", "rc": proc.returncode, "tail": lines[-2:]}
    }
    for lib in ONECCL_LIBRARIES:
        idx = subprocess.run([*pip, "index", "versions", lib], capture_output=True, text=True, timeout=300)
        first = next((ln for ln in idx.stdout.splitlines() if ln.strip()), "")
        out[lib] = {"command": f"pip index versions {lib}", "rc": idx.returncode, "latest": first.strip()}
    return out


def arm_job(arm: str, steps: int, mpi: str) -> dict[str, Any]:
    spec = ARMS[arm]
    job: dict[str, Any] = yaml.safe_load(JOB.read_text(encoding="utf-8"))
    job["metadata"]["name"] = f"squad-mini-{arm}"
    job["spec"]["hardware"] = {"profile": "xeon-amx", "stack": spec["stack"], "procsPerNode": spec["ranks"]}
    job["spec"]["mpi"] = {"implementation": mpi}
    job["spec"]["training"]["maxSteps"] = steps
    job["spec"]["training"]["logEverySteps"] = 4
    job["spec"]["training"]["checkpointEverySteps"] = steps  # one checkpoint, at the end, in every arm
    return job


def run_arm(arm: str, steps: int, mpi: str, workdir: Path) -> dict[str, Any]:
    job = arm_job(arm, steps, mpi)
    ftjob = str(Path(sys.executable).parent / "ftjob")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(job, f)
    try:
        proc = subprocess.run(
            [ftjob, "run", "-f", f.name, "--workdir", str(workdir), "-q"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=3600,
        )
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        raise SystemExit(f"{arm}: ftjob run failed:\n{proc.stderr[-3000:]}")
    log = workdir / "logs" / "train-node0.log"
    group = next(
        (ln.rsplit("process group ", 1)[1].strip() for ln in log.read_text().splitlines() if "process group " in ln),
        "?",
    )
    return {"samplesPerSecond": run_rate(train_windows(log)), "processGroup": group}


def _allreduce_rank(rank: int, world: int, group: str, numel: int, repeats: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    module = GROUPS[group]
    if module:
        importlib.import_module(module)
    dist.init_process_group(group, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    buf = torch.ones(numel, dtype=torch.float32)
    dist.all_reduce(buf)  # warm-up: connections, buffers
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def time_allreduce(group: str, numel: int, repeats: int) -> list[float]:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, 2, group, numel, repeats, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    times: list[float] = out.get(timeout=1800)
    for p in procs:
        p.join(timeout=120)
    return times


def gradient_sizes() -> dict[str, int]:
    """Trained weights (= gradient floats) of the sample's model and of DistilBERT-base with a QA head."""
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering, DistilBertConfig

    job = yaml.safe_load(JOB.read_text(encoding="utf-8"))
    out = {}
    for name, cfg in (
        (
            "sample model (" + job["spec"]["task"]["model"] + ")",
            AutoConfig.from_pretrained(ROOT / job["spec"]["task"]["model"]),
        ),
        ("DistilBERT-base, QA head", DistilBertConfig()),
    ):
        with torch.device("meta"):
            model = AutoModelForQuestionAnswering.from_config(cfg)
        out[name] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="upstream,ipex,upstream-1rank", help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per training run (the sample has 12)")
    ap.add_argument("--mpi", default="mpich", choices=["mpich", "intel", "openmpi"], help="the MPI that launches")
    ap.add_argument("--groups", default="gloo,ccl,mpi", help="process groups for the all-reduce timing")
    ap.add_argument("--collective-repeats", type=int, default=5)
    ap.add_argument("--workdir", default="_out/xeon-stacks")
    ap.add_argument("--json", type=Path, help="write the result document here")
    args = ap.parse_args(argv)

    import torch

    started = time.monotonic()
    loads = [os.getloadavg()[0]]
    doc: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "job": str(JOB.relative_to(ROOT)),
        "mpi": args.mpi,
        "steps": args.steps,
        "arms": {},
        "collectives": {},
        "notRun": {},
    }
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    runnable = []
    for arm in arms:
        errors = {m: e for m in ARMS[arm]["needs"] if (e := import_error(m))}
        if errors:
            doc["notRun"][arm] = {"importErrors": errors}
            print(f"{arm}: not run, its stack is not installed here: {errors}", file=sys.stderr, flush=True)
        else:
            runnable.append(arm)
            doc["arms"][arm] = {"ranks": ARMS[arm]["ranks"], "stack": ARMS[arm]["stack"], "runs": []}
    if any("oneccl_bindings_for_pytorch" in v.get("importErrors", {}) for v in doc["notRun"].values()):
        doc["pypi"] = pypi_probe()

    work = Path(args.workdir).resolve()  # ftjob run runs in the repository root
    for rep in range(args.repeats):
        for arm in runnable:
            got = run_arm(arm, args.steps, args.mpi, work / f"{arm}-r{rep}")
            doc["arms"][arm]["runs"].append(round(got["samplesPerSecond"], 1))
            doc["arms"][arm]["processGroup"] = got["processGroup"]
            loads.append(os.getloadavg()[0])
            print(
                f"{arm} repeat {rep}: {got['samplesPerSecond']:.1f} samples/s ({got['processGroup']})",
                file=sys.stderr,
                flush=True,
            )
    for arm in runnable:
        runs = doc["arms"][arm]["runs"]
        doc["arms"][arm]["samplesPerSecond"] = round(statistics.median(runs), 1) if runs else None

    sizes = gradient_sizes()
    for group in [g.strip() for g in args.groups.split(",") if g.strip()]:
        why = group_unavailable(group)
        if why:
            doc["notRun"][f"all_reduce over {group}"] = why
            print(f"all_reduce over {group}: not run: {why}", file=sys.stderr, flush=True)
            continue
        doc["collectives"][group] = {}
        for name, numel in sizes.items():
            times = time_allreduce(group, numel, args.collective_repeats)
            doc["collectives"][group][name] = {
                "floats": numel,
                "medianSeconds": round(statistics.median(times), 4),
                "seconds": [round(t, 4) for t in times],
            }
            loads.append(os.getloadavg()[0])
            print(
                f"all_reduce over {group}, {name} ({numel:,} floats): {statistics.median(times):.4f} s",
                file=sys.stderr,
                flush=True,
            )
    doc["loadAverage"] = [round(min(loads), 1), round(max(loads), 1)]
    doc["seconds"] = round(time.monotonic() - started)
    write_json(args.json, doc)
    print(yaml.safe_dump(doc, sort_keys=False, width=120))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
