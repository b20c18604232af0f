"""Seconds to the first training step of the demo job (examples/jobs/demo-ja-sentiment.yaml: 2 ranks, torchrun,
tiny Japanese BERT), as its rank-0 pod runs it in the cpu image and as `ftjob run` runs it, A/B interleaved.

    python benchmarks/first_step.py [--rounds 3] [--image IMAGE] [--compare-image IMAGE] [--no-image] [--quick]
                                    [--json OUT]

Sides, each run once per round (the order rotates from round to round), after one untimed round (page cache):
- `image`: `docker run` of the image (default finetune-operator/cpu:VERSION) with what `ftjob render` gives the
  rank-0 pod: its command (`ftjob-runtime launch`), its env (FTJOB_MASTER_ADDR 127.0.0.1: no cluster DNS here),
  its config.json at FTJOB_CONFIG, /cache and /output fresh folders (the pod's emptyDir and claim: the
  tokenised-dataset cache starts cold, as in a demo pod), the examples read-only under the working directory
  /home/ftjob, no network, every capability dropped, as UID 1000;
- `image, no venv bytecode`: the same with PYTHONPYCACHEPREFIX pointing at a folder that holds the bytecode of
  the image's standard library only (compiled into it once, before the rounds) and PYTHONDONTWRITEBYTECODE=1:
  Python looks for bytecode only under the prefix, so it compiles every module of the venv it imports, and
  nothing else, which is what an image built without bytecode does for a user who cannot write its venv;
- `compare` (--compare-image): another image the same way, e.g. one built before a change;
- `ftjob run`: `ftjob run -f examples/jobs/demo-ja-sentiment.yaml` from this venv, in a fresh workdir (cold dataset
  cache, as `make demo`);
- `ftjob run, no venv bytecode`: the same with such a prefix of this Python's standard library (a venv without
  bytecode, as `make setup` made it before it compiled).
A run ends at rank 0's first `train` progress line: the container is removed, `ftjob run` interrupted.

Clocks, in seconds to that line (docs/runtime.md, "Time to the first step"):
- `startToFirstStep`: from the container's start (docker's State.StartedAt, nanoseconds) or from starting `ftjob
  run` (this process's clock) to the moment this process reads the line;
- `reported`: what the runtime itself reports on the line (firstStepAt - startedAt: from the pod's main process,
  or `ftjob run`, to the end of the first step), the figure the operator puts into status.progress; absent for an
  image whose runtime predates it;
- `launchToFirstStep` (image sides): from calling `docker run`, i.e. with docker's own container set-up;
- `createdToStarted` (image sides whose runtime reports): from the creation of the container's main process (the
  line's startedAt: the process exists from the container runtime's create on) to docker's StartedAt, which is
  how much earlier the runtime's clock starts than the container's reported start;
- `cpuToFirstStep`: CPU seconds (user + system, all cores) spent until that line by the container (its cgroup's
  cpuacct.usage, or cpu.stat's usage_usec under cgroup v2) or by `ftjob run`'s process tree (utime + stime of
  every live process in it plus what each has reaped of its children, from /proc). The wall clocks above grow
  with the machine's load; this one much less, so it is what compares across runs on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from benchio import write_json

from finetune_operator.admission import validate
from finetune_operator.builders import desired
from finetune_operator.progress import parse_line, time_to_first_step

ROOT = Path(__file__).resolve().parents[1]
DEMO_JOB = ROOT / "examples" / "jobs" / "demo-ja-sentiment.yaml"
VERSION = (ROOT / "VERSION").read_text().strip()
DEFAULT_IMAGE = f"finetune-operator/cpu:{VERSION}"
DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
WORKDIR = "/home/ftjob"  # the images' WORKDIR, where the pods run and the demo's relative paths resolve
# Where a `no venv bytecode` container finds its standard library's bytecode (PYTHONPYCACHEPREFIX, read-only).
PREFIX_IN_CONTAINER = "/ftjob-stdlib-bytecode"
COMPILE_STDLIB = "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['stdlib'], quiet=2)"


@dataclass(frozen=True)
class Side:
    name: str
    kind: str  # "image" or "ftjob-run"
    image: str | None = None
    no_venv_bytecode: bool = False  # the venv's modules compile from source; the standard library's do not


@dataclass(frozen=True)
class FirstStep:
    side: str
    round: int
    start_to_first_step: float  # container start (docker) or `ftjob run` start (this clock) -> line read
    reported: float | None  # the runtime's own figure on the line (status.progress.timeToFirstStepSeconds)
    launch_to_first_step: float | None  # `docker run` called -> line read (image sides)
    # The container's main process created (the line's startedAt) -> docker's StartedAt: the container runtime's
    # own set-up, which the runtime's figure includes (the process exists from `runc create` on).
    created_to_started: float | None = None
    cpu_to_first_step: float | None = None  # CPU seconds of the container's cgroup or `ftjob run`'s process tree


@dataclass(frozen=True)
class PodRun:
    """The rank-0 pod of the demo job as `ftjob render` makes it: what a `docker run` needs of it."""

    command: list[str]
    env: dict[str, str]
    config_path: str  # FTJOB_CONFIG
    config_json: str  # the ConfigMap's config.json


def rank0_pod(job_file: Path = DEMO_JOB) -> PodRun:
    job = validate(yaml.safe_load(job_file.read_text(encoding="utf-8")))
    built = desired(job)
    pod = next(p for p in built.pods if p["metadata"]["labels"].get("finetune.dev/rank") == "0")
    cm = next(o for o in built.objects if o["kind"] == "ConfigMap")
    container = pod["spec"]["containers"][0]
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    # No cluster DNS for a lone container: rank 0 meets its local ranks on the loopback, as under `ftjob run`.
    env["FTJOB_MASTER_ADDR"] = "127.0.0.1"
    return PodRun(
        [*container["command"], *container.get("args", [])], env, env["FTJOB_CONFIG"], cm["data"]["config.json"]
    )


def docker_time(text: str) -> float:
    """docker inspect's RFC 3339 time with nanoseconds (2026-12-04T19:33:40.123456789Z) as Unix time."""
    head, _, frac = text.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00").timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def first_train(line: str) -> dict[str, Any] | None:
    rec = parse_line(line)
    return rec if rec is not None and rec.get("event") == "train" else None


def container_cpu_seconds(container_id: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPU seconds a running container has used so far (its cgroup: v1 cpuacct or v2 cpu.stat), None if not found."""
    v1 = cgroup_root / "cpuacct" / "docker" / container_id / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text().strip()) / 1e9
    v2 = [cgroup_root / "system.slice" / f"docker-{container_id}.scope", cgroup_root / "docker" / container_id]
    for folder in v2:
        if (folder / "cpu.stat").exists():
            stat = dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines() if line.strip())
            return int(stat["usage_usec"]) / 1e6
    return None


def tree_cpu_seconds(root: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds of `root` and its live descendants: each one's utime + stime, plus cutime + cstime (what it has
    reaped of its children: counted once, by the parent that waited for them)."""
    stats: dict[int, tuple[int, float]] = {}  # pid -> (ppid, its CPU seconds with its reaped children's)
    tick = os.sysconf("SC_CLK_TCK")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3 of stat(5)
        stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats[pid][1] if pid in stats else 0.0
        todo += children.get(pid, [])
    return total


def stdlib_bytecode(prefix: Path, image: str | None) -> Path:
    """A PYTHONPYCACHEPREFIX folder that holds the standard library's bytecode only: that of `image`'s Python
    (compiled in a container, as UID 1000), or of this Python (image None)."""
    prefix.mkdir(parents=True)
    if image is None:
        env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)}
        subprocess.run([sys.executable, "-c", COMPILE_STDLIB], env=env, check=True, capture_output=True)
        return prefix
    prefix.chmod(0o777)
    mount = ["-v", f"{prefix}:{PREFIX_IN_CONTAINER}", "-e", f"PYTHONPYCACHEPREFIX={PREFIX_IN_CONTAINER}"]
    subprocess.run(
        [DOCKER, "run", "--rm", "--network", "none", *mount, image, "python", "-c", COMPILE_STDLIB],
        check=True,
        capture_output=True,
    )
    return prefix


def docker_args(pod: PodRun, image: str, name: str, work: Path, prefix: Path | None = None) -> list[str]:
    config = work / "config.json"
    config.write_text(pod.config_json, encoding="utf-8")
    args = ["run", "--name", name, "--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    args += ["--shm-size", "256m", "-w", WORKDIR, "-v", f"{config}:{pod.config_path}:ro"]
    # The pod's emptyDir /cache and its claim's /output: fresh empty folders, written by UID 1000 in the container
    # (docker's tmpfs mounts here ignore their mode and stay root's). /home/ftjob and /tmp: the image's own, empty.
    for folder, target in (("cache", pod.env.get("FTJOB_CACHE_DIR", "/cache")), ("output", "/output")):
        (work / folder).mkdir()
        (work / folder).chmod(0o777)
        args += ["-v", f"{work / folder}:{target}"]
    args += ["-v", f"{ROOT / 'examples'}:{WORKDIR}/examples:ro"]
    env = {**pod.env, "HF_HUB_OFFLINE": "1"}
    if prefix is not None:
        args += ["-v", f"{prefix}:{PREFIX_IN_CONTAINER}:ro"]
        env |= {"PYTHONPYCACHEPREFIX": PREFIX_IN_CONTAINER, "PYTHONDONTWRITEBYTECODE": "1"}
    for key, value in env.items():
        args += ["-e", f"{key}={value}"]
    return [*args, image, *pod.command]


def run_image(side: Side, pod: PodRun, n: int, timeout: float, prefix: Path | None) -> FirstStep:
    assert side.image is not None
    name = f"ftjob-first-step-{os.getpid()}-{n}"
    with tempfile.TemporaryDirectory(prefix="first-step-") as tmp:
        args = docker_args(pod, side.image, name, Path(tmp), prefix)
        lines: list[str] = []
        launched = time.time()
        proc = subprocess.Popen([DOCKER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None
            rec, seen = None, 0.0
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if (rec := first_train(line)) is not None:
                    seen = time.time()
                    break
                if time.time() - launched > timeout:
                    break
            started, _, container_id = (
                subprocess.run(
                    [DOCKER, "inspect", "--format", "{{.State.StartedAt}} {{.Id}}", name],
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .partition(" ")
            )
            cpu = container_cpu_seconds(container_id) if rec is not None and container_id else None
        finally:
            subprocess.run([DOCKER, "rm", "-f", name], capture_output=True)
            proc.wait()
        for folder in ("cache", "output"):  # files of UID 1000, which the temporary folder's clean-up may not remove
            shutil.rmtree(Path(tmp) / folder, ignore_errors=True)
    if rec is None or not started:
        raise RuntimeError(f"{side.name} run {n}: no train line\n" + "\n".join(lines[-30:]))
    created = datetime.fromisoformat(rec["startedAt"]).timestamp() if "startedAt" in rec else None
    return FirstStep(
        side.name,
        n,
        round(seen - docker_time(started), 3),
        time_to_first_step(rec),
        round(seen - launched, 3),
        None if created is None else round(docker_time(started) - created, 3),
        None if cpu is None else round(cpu, 2),
    )


def run_ftjob(side: Side, n: int, timeout: float, prefix: Path | None) -> FirstStep:
    ftjob = Path(sys.executable).with_name("ftjob")
    with tempfile.TemporaryDirectory(prefix="first-step-run-") as tmp:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.pop("FTJOB_STARTED_AT", None)  # `ftjob run` starts the clock itself
        if prefix is not None:
            env |= {"PYTHONPYCACHEPREFIX": str(prefix), "PYTHONDONTWRITEBYTECODE": "1"}
        log = Path(tmp) / "logs" / "train-node0.log"
        launched = time.time()
        proc = subprocess.Popen(
            [str(ftjob), "run", "-f", str(DEMO_JOB), "--workdir", tmp, "-q"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # A shell's background job starts with SIGINT ignored, and exec keeps it ignored: `ftjob run` would then
            # not stop on the SIGINT below. Its default disposition makes it stop its ranks as on Ctrl-C.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        rec, seen, cpu = None, 0.0, None
        try:
            while rec is None and proc.poll() is None and time.time() - launched < timeout:
                text = log.read_text(errors="replace") if log.exists() else ""
                rec = next((r for r in map(first_train, text.splitlines()) if r is not None), None)
                seen = time.time()
                if rec is not None:
                    cpu = tree_cpu_seconds(proc.pid)
                time.sleep(0.01)  # polls the log the run writes
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # `ftjob run` then stops its torchrun groups and waits for them
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if rec is None:
            tail = log.read_text(errors="replace").splitlines()[-30:] if log.exists() else []
            raise RuntimeError(f"{side.name} run {n}: no train line\n" + "\n".join(tail))
    cpu_s = None if cpu is None else round(cpu, 2)
    return FirstStep(side.name, n, round(seen - launched, 3), time_to_first_step(rec), None, None, cpu_s)


def run_side(side: Side, pod: PodRun, n: int, timeout: float, prefixes: dict[str | None, Path]) -> FirstStep:
    prefix = prefixes[side.image] if side.no_venv_bytecode else None
    return run_image(side, pod, n, timeout, prefix) if side.kind == "image" else run_ftjob(side, n, timeout, prefix)


def sides_for(image: str | None, compare: str | None) -> list[Side]:
    sides: list[Side] = []
    if image:
        sides += [Side("image", "image", image), Side("image, no venv bytecode", "image", image, True)]
    if compare:
        sides.append(Side("compare", "image", compare))
    sides += [Side("ftjob run", "ftjob-run"), Side("ftjob run, no venv bytecode", "ftjob-run", None, True)]
    return sides


def image_present(image: str) -> str | None:
    """None when docker has `image`, else why the image sides are skipped."""
    if not Path(DOCKER).exists():
        return f"no docker at {DOCKER}"
    found = subprocess.run([DOCKER, "image", "inspect", image], capture_output=True, text=True)
    return None if found.returncode == 0 else f"{image} is not built (make image-cpu)"


def summarize(results: list[FirstStep]) -> dict[str, Any]:
    """Median per side of each clock, and per round the bytecode sides against their `no venv bytecode` twins."""
    out: dict[str, Any] = {}
    for side in dict.fromkeys(r.side for r in results):
        rs = [r for r in results if r.side == side]
        med: dict[str, float | None] = {
            "startToFirstStep": round(statistics.median(r.start_to_first_step for r in rs), 2)
        }
        reported = [r.reported for r in rs if r.reported is not None]
        med["reported"] = round(statistics.median(reported), 2) if reported else None
        launch = [r.launch_to_first_step for r in rs if r.launch_to_first_step is not None]
        med["launchToFirstStep"] = round(statistics.median(launch), 2) if launch else None
        setup = [r.created_to_started for r in rs if r.created_to_started is not None]
        med["createdToStarted"] = round(statistics.median(setup), 3) if setup else None
        cpu = [r.cpu_to_first_step for r in rs if r.cpu_to_first_step is not None]
        med["cpuToFirstStep"] = round(statistics.median(cpu), 2) if cpu else None
        out[side] = med
    saved: dict[str, Any] = {}
    for side in ("image", "ftjob run"):
        twin = f"{side}, no venv bytecode"
        runs = [(a, b) for a in results for b in results if a.side == side and b.side == twin and a.round == b.round]
        if runs:
            pairs = [(a.start_to_first_step, b.start_to_first_step) for a, b in runs]
            saved[side] = {
                "withoutMinusWithSeconds": [round(b - a, 2) for a, b in pairs],
                "median": round(statistics.median(b - a for a, b in pairs), 2),
            }
            cpu = [(a.cpu_to_first_step, b.cpu_to_first_step) for a, b in runs]
            cpu_pairs = [(a, b) for a, b in cpu if a is not None and b is not None]
            if cpu_pairs:
                saved[side]["cpuWithoutMinusWithSeconds"] = [round(b - a, 2) for a, b in cpu_pairs]
                saved[side]["cpuMedian"] = round(statistics.median(b - a for a, b in cpu_pairs), 2)
    return {"median": out, "bytecodeSaves": saved}


def table(summary: dict[str, Any]) -> str:
    rows = [
        "| side | start to first step, s | reported by the runtime, s | `docker run` to first step, s "
        "| process created to container started, s | CPU to first step, s |"
    ]
    rows.append("|---|---|---|---|---|---|")
    for side, m in summary["median"].items():
        cells = [m["startToFirstStep"], m["reported"], m["launchToFirstStep"], m["createdToStarted"]]
        cells.append(m["cpuToFirstStep"])
        rows.append(f"| {side} | " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(rows)


def measure(rounds: int, warm_up: bool, image: str | None, compare: str | None, timeout: float) -> dict[str, Any]:
    notes: list[str] = []
    present: dict[str, str | None] = {}
    for name in (image, compare):
        why = image_present(name) if name else None
        if why:
            notes.append(f"{name} skipped: {why}")
            print(notes[-1], flush=True)
        present[str(name)] = name if name and not why else None
    sides = sides_for(present[str(image)], present[str(compare)])
    pod = rank0_pod()
    results: list[FirstStep] = []
    with tempfile.TemporaryDirectory(prefix="first-step-prefix-") as tmp:
        prefixes = {
            s.image: stdlib_bytecode(Path(tmp) / str(i), s.image) for i, s in enumerate(sides) if s.no_venv_bytecode
        }
        if warm_up:
            for side in sides:
                print(f"warm-up {side.name}: {asdict(run_side(side, pod, 0, timeout, prefixes))}", flush=True)
        for n in range(1, rounds + 1):
            shift = (n - 1) % len(sides)
            for side in sides[shift:] + sides[:shift]:
                r = run_side(side, pod, n, timeout, prefixes)
                results.append(r)
                print(f"round {n} {side.name}: {asdict(r)}", flush=True)
    summary = summarize(results)
    return {
        "config": {
            "job": str(DEMO_JOB.relative_to(ROOT)),
            "rounds": rounds,
            "warmUp": warm_up,
            "sides": [asdict(s) for s in sides],
            "podCommand": pod.command,
            "cpus": os.cpu_count(),
            "loadAverage": os.getloadavg(),
            "notes": notes,
        },
        "runs": [asdict(r) for r in results],
        **summary,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds, every side once each (default 3)")
    ap.add_argument("--image", default=DEFAULT_IMAGE, help=f"the cpu image (default {DEFAULT_IMAGE})")
    ap.add_argument("--compare-image", help="a second image measured the same way (e.g. one built before a change)")
    ap.add_argument("--no-image", action="store_true", help="`ftjob run` sides only (no docker)")
    ap.add_argument("--quick", action="store_true", help="1 round, no warm-up")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    doc = measure(
        1 if args.quick else args.rounds,
        not args.quick,
        None if args.no_image else args.image,
        None if args.no_image else args.compare_image,
        args.timeout,
    )
    print(table(doc))
    print(json.dumps(doc["bytecodeSaves"]))
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
