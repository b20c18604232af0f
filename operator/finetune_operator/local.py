"""`ftjob run`: a FineTuneJob as local processes, with the environment the pods get.

The env comes from the same builders as the pods (builders.env.derived_env); only what differs on one machine
is replaced: paths (config, cache, output), the rank-0 address (127.0.0.1) and the CPUs the thread math starts
from (this machine's, shared by the local "nodes"). Each local node runs the runtime's own per-pod entry point
(`ftjob-runtime launch` for torchrun, `ftjob-runtime mpirun` for MPI), so local mode exercises the same code.
A `spec.command` job runs as its pods do: the command itself once per local node (torchrun launcher, with the
PET_* variables a bare `torchrun script.py` reads), or under `ftjob-runtime mpirun -- COMMAND` (MPI).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from . import progress
from .builders import Names, resolve
from .builders.env import command_env, derived_env, thread_env
from .builders.objects import runtime_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _process_start() -> float:
    """When this process was created (Unix time), as the kernel recorded it (/proc/self/stat's starttime against
    /proc/uptime), so the interpreter's start-up counts; now where there is no /proc. The runtime's own copy,
    finetune_runtime.startup.process_start, does the same for its launchers."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # starttime, field 22: fields 3... follow the last ')'
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _runtime_cmd() -> list[str]:
    exe = shutil.which("ftjob-runtime") or str(Path(sys.executable).with_name("ftjob-runtime"))
    if not Path(exe).exists():
        raise SystemExit(
            "error: the training runtime (ftjob-runtime) is not installed in this environment; run `make setup`"
        )
    return [exe]


class _Reporter:
    """Folds progress lines into a progress bar (tqdm, on a terminal) or a plain line every few seconds and at
    each eval/checkpoint/end (logs, CI, pipes)."""

    def __init__(self, quiet: bool, label: str):
        self.state: dict[str, Any] | None = None
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.last_print = 0.0
        self.last_summary = ""
        self.label = label
        self.bar: Any = None  # tqdm, made at the first line with a step count
        self.lock = threading.Lock()

    def record(self, rec: dict[str, Any]) -> None:
        with self.lock:
            self.state = progress.fold([rec], self.state)
            if self.quiet or self.state is None:
                return
            important = rec.get("event") in ("eval", "done", "checkpoint") or rec.get("complete")
            if self.tty:
                self._draw(self.state, bool(important))
                return
            now = time.monotonic()
            if (important or now - self.last_print >= 5) and self.state["summary"] != self.last_summary:
                sys.stderr.write(f"{self.label} {self.state['summary']}\n")
                sys.stderr.flush()
                self.last_print = now
                self.last_summary = self.state["summary"]

    def _draw(self, state: dict[str, Any], important: bool) -> None:
        step, total = state.get("step"), state.get("totalSteps")
        if not isinstance(step, int):
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total if isinstance(total, int) else None,
                desc=self.label,
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
            )
        if isinstance(total, int) and self.bar.total != total:
            self.bar.total = total
        if step >= self.bar.n:
            self.bar.update(step - self.bar.n)  # update(), not n=: tqdm's step rate comes from the increments
        else:  # a group restart resumed from an older checkpoint
            self.bar.n = step
        self.bar.set_postfix_str(_postfix(state), refresh=True)
        if important:
            self.bar.write(f"{self.label} {state['summary']}", file=sys.stderr)

    def close(self) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None


def _postfix(state: dict[str, Any]) -> str:
    """What the bar shows beside its own step counter and rate: loss, throughput, the newest eval metric."""
    parts = []
    if isinstance(state.get("loss"), int | float):
        parts.append(f"loss {state['loss']:.3g}")
    if isinstance(state.get("samplesPerSecond"), int | float):
        parts.append(f"{state['samplesPerSecond']:.3g} samples/s")
    headline = progress.summary_metric(state)
    if headline:
        parts.append(headline)
    return ", ".join(parts)


def _pump(stream: IO[str], log: IO[str], reporter: _Reporter) -> None:
    for line in stream:
        log.write(line)
        log.flush()
        rec = progress.parse_line(line)
        if rec is not None:
            reporter.record(rec)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def local_path(path: str) -> str:
    """PATH as a local run sees it: this Python's bin directory (the runtime's, as in the images) first."""
    bin_dir = str(Path(sys.executable).parent)
    return path if bin_dir in path.split(os.pathsep) else os.pathsep.join([bin_dir, *([path] if path else [])])


def local_env(
    job: dict[str, Any], workdir: Path, output: Path | None, max_procs: int | None, max_nodes: int | None
) -> tuple[dict[str, str], int, int, Path]:
    """The pods' environment with local paths and this machine's CPUs. Returns env, nodes, procs, output dir."""
    layout = resolve(job)
    nodes = min(layout.nodes, max_nodes or layout.nodes)
    procs = min(layout.procs_per_node, max_procs or layout.procs_per_node)
    cpus = float(os.cpu_count() or 1)
    if layout.launcher == "mpi":  # one local "node" holds every rank: a hostfile of localhost only
        procs, nodes = procs * nodes, 1
    layout = dataclasses.replace(layout, nodes=nodes, procs_per_node=procs, cpu_per_pod=max(1.0, cpus / nodes))
    names = Names("local", "local", layout.launcher)
    env = derived_env(job, layout, names)
    env.update(thread_env(layout))
    out_cfg = job["spec"].get("output") or {}
    out_dir = (output or (workdir / "output" / (out_cfg.get("path") or job["metadata"]["name"]))).resolve()
    cache = (workdir / "cache").resolve()
    env.update(
        {
            "FTJOB_CONFIG": str((workdir / "config.json").resolve()),
            "FTJOB_CACHE_DIR": str(cache),
            "FTJOB_OUTPUT_DIR": str(out_dir),
            "FTJOB_MASTER_ADDR": "127.0.0.1",
            "FTJOB_MASTER_PORT": str(_free_port()),
            "HF_HOME": os.environ.get("HF_HOME", str(cache / "hf")),
            "HOME": os.environ.get("HOME", str(workdir)),
            # The runtime's ssh keys, client config and ssh wrapper (pods: the image user's ~/.ssh). Never the
            # user's own ~/.ssh: `mpirun` writes a `Host *` config there that would redirect every later ssh.
            "FTJOB_SSH_DIR": str((workdir / "ssh").resolve()),
        }
    )
    env.pop("FTJOB_OUTPUT_URL", None)  # local runs keep results on disk
    # No uid here (the pods get the job's): the runtime's own local uid lets a rerun in this workdir resume.
    env.pop("FTJOB_JOB_UID", None)
    if env.get("FTJOB_RESUME_FROM", "").startswith("/"):  # a pvc:// resumeFrom: no claim on this machine
        print(
            f"note: output.resumeFrom {out_cfg.get('resumeFrom')} is a claim's directory: not used here",
            file=sys.stderr,
        )
        del env["FTJOB_RESUME_FROM"]
    template = job["spec"].get("podTemplate") or {}
    if template.get("volumeMounts") or template.get("initContainers"):
        mounts = ", ".join(str(m.get("mountPath")) for m in template.get("volumeMounts") or [])
        print(
            "note: spec.podTemplate's volumes and init containers belong to the pods: none is made here"
            + (f" (what the pods mount at {mounts} must exist on this machine)" if mounts else ""),
            file=sys.stderr,
        )
    # The images have the runtime's environment on PATH (torchrun, accelerate, ftjob-runtime): so does a local
    # run, when ftjob was started from a virtual environment that is not activated.
    env["PATH"] = local_path(os.environ.get("PATH", ""))
    compile_cache = layout.stack.compile_cache  # the stack's (Neuron: NEURON_COMPILE_CACHE_URL, the NEFF dir)
    if compile_cache and not env.get(compile_cache.variable, "").startswith("s3://"):
        env[compile_cache.variable] = str(cache / compile_cache.directory)
    if env.get("LD_PRELOAD") and not Path(env["LD_PRELOAD"]).exists():
        print(f"note: {env['LD_PRELOAD']} is not installed here; running without LD_PRELOAD", file=sys.stderr)
        del env["LD_PRELOAD"]
    if layout.launcher == "mpi":
        impl = layout.mpi_implementation
        line = f"localhost slots={procs}\n" if impl == "openmpi" else f"localhost:{procs}\n"
        hostfile = (workdir / "hostfile").resolve()
        hostfile.parent.mkdir(parents=True, exist_ok=True)
        hostfile.write_text(line)
        env["FTJOB_HOSTFILE"] = str(hostfile)
    for e in job["spec"].get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
    return env, nodes, procs, out_dir


def run_local(
    job: dict[str, Any],
    *,
    workdir: Path,
    max_procs: int | None = None,
    max_nodes: int | None = None,
    output: Path | None = None,
    precision: str | None = None,
    quiet: bool = False,
) -> int:
    command: list[str] = list(job["spec"].get("command") or [])
    if command and not shutil.which(command[0], path=local_path(os.environ.get("PATH", ""))):
        raise SystemExit(
            f"error: spec.command[0] {command[0]!r} is not on PATH here (nor a file); install it or "
            "give its path in spec.command"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    if precision:
        job["spec"].setdefault("training", {})["precision"] = precision
    env_extra, nodes, procs, out_dir = local_env(job, workdir, output, max_procs, max_nodes)
    config = runtime_config(job)
    (workdir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    launcher = env_extra["FTJOB_LAUNCHER"]
    base_env = {**os.environ, **env_extra}
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    what = f"`{shlex.join(command)}`" if command else "the built-in task"
    print(
        f"ftjob run: {job['metadata']['name']} ({what}) — {launcher}, {nodes} node(s) x {procs} process(es), "
        f"backend {env_extra['FTJOB_BACKEND']}, OMP_NUM_THREADS={env_extra.get('OMP_NUM_THREADS', 'unset')}\n"
        f"  output {out_dir}\n  logs   {logs}",
        file=sys.stderr,
    )
    stages = []
    if (job["spec"].get("compileCache") or {}).get("precompile"):
        stages.append(("precompile", {"FTJOB_MODE": "precompile"}))
    stages.append(("train", {"FTJOB_MODE": "train"}))
    # The time to the first step (status.progress.timeToFirstStepSeconds) counts from this process's start, as in
    # a pod it counts from its main container's; a train stage after a precompile one counts from its own start,
    # as the trainer container starts after the precompile init container.
    stages[0][1].setdefault("FTJOB_STARTED_AT", os.environ.get("FTJOB_STARTED_AT") or f"{_process_start():.3f}")
    for stage, stage_env in stages:
        plans = [_node_plan(command, launcher, node, nodes, procs, {**base_env, **stage_env}) for node in range(nodes)]
        rc = _run_stage(stage, plans, logs, quiet)
        if rc != 0:
            return rc
    _print_results(out_dir)
    return 0


def _node_plan(
    command: list[str], launcher: str, node: int, nodes: int, procs: int, env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of one local node, as its pod's main container runs it (builders/pods.py)."""
    env = {**env, "FTJOB_NODE_RANK": str(node)}
    if launcher == "mpi":  # the launcher pod: mpirun with the built-in worker or the job's own command
        return [*_runtime_cmd(), "mpirun", *(["--", *command] if command else [])], env
    if not command:
        return [*_runtime_cmd(), "launch"], env
    rank_env = command_env(nodes, procs, env["FTJOB_MASTER_ADDR"], int(env["FTJOB_MASTER_PORT"]), node)
    return list(command), {**env, **rank_env}


def _run_stage(stage: str, plans: list[tuple[list[str], dict[str, str]]], logs: Path, quiet: bool) -> int:
    reporter = _Reporter(quiet, stage)
    procs: list[tuple[subprocess.Popen[str], Path, threading.Thread]] = []
    for node, (argv, env) in enumerate(plans):
        log_path = logs / f"{stage}-node{node}.log"
        p = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # the whole torchrun/mpirun tree can be signalled at once
        )
        log = log_path.open("w")
        assert p.stdout is not None
        t = threading.Thread(target=_pump, args=(p.stdout, log, reporter), daemon=True)
        t.start()
        procs.append((p, log_path, t))
    rc = 0
    try:
        while procs and rc == 0:
            for entry in list(procs):
                code = entry[0].poll()
                if code is not None:
                    entry[2].join(timeout=5)
                    procs.remove(entry)
                    if code != 0:
                        rc = code
                        print(
                            f"\n{stage}: {entry[1].name} exited with {code}; last lines:\n{_tail(entry[1])}",
                            file=sys.stderr,
                        )
            time.sleep(0.2)
    except KeyboardInterrupt:
        rc = 130
    finally:
        for p, _, _ in procs:  # a failed node takes the others down, like a group restart would
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p, _, _ in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
    reporter.close()
    first = (reporter.state or {}).get("timeToFirstStepSeconds")
    if rc == 0 and first is not None:
        print(f"{stage}: first training step after {first} s", file=sys.stderr)
    return rc


def _print_results(out_dir: Path) -> None:
    metrics = out_dir / "metrics.json"
    preds = out_dir / "predictions.json"
    if metrics.exists():
        print("metrics:")
        for k, v in json.loads(metrics.read_text()).items():
            if isinstance(v, dict):
                v = "  ".join(f"{mk}={mv:.4g}" if isinstance(mv, float) else f"{mk}={mv}" for mk, mv in v.items())
            print(f"  {k}: {v}")
    if preds.exists():
        data = json.loads(preds.read_text())
        print("predictions:")
        items = data if isinstance(data, list) else data.get("predictions", data)
        for item in items if isinstance(items, list) else [items]:
            print(f"  {json.dumps(item, ensure_ascii=False)}")
    if (out_dir / "model").exists():
        print(f"model: {out_dir / 'model'}")
    else:
        print(f"output: {out_dir}")
