"""The pure parts of `make bench-peer`: argument handling, the floor's plan and its pipelined writer, the peer's
command line and cert pair, /proc parsing, the README table and its goal line. The numbers themselves are
measured by the benchmark, never asserted here."""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import operator_scale
import peer_report
import procstat
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from finetune_operator import controller
from ftjob_cluster import bins, peer, pki

ROOT = Path(__file__).resolve().parents[2]


def test_peer_mode_arguments_and_their_defaults() -> None:
    args = operator_scale.parse_args(["--peer", "--jobs", "20", "--readme", "x.md"])
    assert (args.peer, args.jobs, args.rounds, args.wide) == (True, 20, 1, 64)
    assert args.systems == ["raw", "floor", "ours", "peer"]
    assert args.readme == Path("x.md")
    assert operator_scale.parse_args(["--peer", "--systems", "ours,peer"]).systems == ["ours", "peer"]
    assert operator_scale.parse_args(["--peer", "--systems", "floor,ours"]).systems == ["floor", "ours"]
    assert not operator_scale.parse_args([]).peer  # make bench-operator's raw, ours, steady run is unchanged


@pytest.mark.parametrize(
    "argv",
    [
        ["--peer", "--systems", "ours,kubeflow"],
        ["--peer", "--rounds", "0"],
        ["--peer", "--jobs", "0"],
        ["--readme", "x.md"],
        ["--rounds", "2"],
        ["--systems", "floor,ours"],
    ],
)
def test_bad_peer_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        operator_scale.parse_args(argv)
    assert e.value.code == 2
    assert "--" in capsys.readouterr().err  # the message names the flag


def test_rounds_rotate_which_system_goes_first() -> None:
    systems = ["raw", "ours", "peer"]
    firsts = [operator_scale.turn_order(systems, r)[0] for r in range(3)]
    assert firsts == ["raw", "ours", "peer"]
    assert all(sorted(operator_scale.turn_order(systems, r)) == sorted(systems) for r in range(5))


def test_the_floor_takes_its_turn_first_middle_and_last() -> None:
    systems = operator_scale.parse_args(["--peer"]).systems
    orders = [operator_scale.turn_order(systems, r) for r in range(4)]
    assert [o.index("floor") for o in orders] == [1, 0, 3, 2]  # every place once in four rounds
    assert orders[1] == ["floor", "ours", "peer", "raw"]


def test_raw_and_the_floor_write_with_the_operators_create_concurrency() -> None:
    # Raw and the floor keep as many requests in flight as the operator's create pool: one constant, not two.
    assert operator_scale.RAW_THREADS == controller.CREATE_CONCURRENCY == 8


def test_the_floor_writes_what_our_first_pass_writes_owned_by_the_job() -> None:
    manifest, children, status = operator_scale.first_pass("job-3", "ns", 2)
    assert manifest == operator_scale.job_manifest("job-3", "ns", 2)  # the very manifest ours is given
    assert sorted(c["kind"] for c in children) == ["ConfigMap", "Pod", "Pod", "Service"]  # raw's objects
    assert status["phase"] == "Pending" and [c["type"] for c in status["conditions"]] == ["Created"]
    owned = [operator_scale.with_uid(c, "real-uid") for c in children]
    for child in owned:
        (ref,) = [r for r in child["metadata"]["ownerReferences"] if r.get("controller")]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("FineTuneJob", "job-3", "real-uid")
    assert operator_scale.PLACEHOLDER_UID not in repr(owned)
    assert operator_scale.PLACEHOLDER_UID in repr(children)  # the plan itself is left as it was
    wide = operator_scale.first_pass("w", "ns", 64)[1]
    assert sum(c["kind"] == "Pod" for c in wide) == 64


def _served(
    jobs: list[tuple[str, str, list[dict[str, Any]], dict[str, Any]] | None], fail: str = ""
) -> tuple[list[tuple[str, str]], int, list[Any]]:
    """serve_writes over in-memory queues, with writes that record themselves (and fail for the job `fail`)."""
    inbox: queue.Queue[Any] = queue.Queue()
    outbox: queue.Queue[Any] = queue.Queue()
    for job in jobs:
        inbox.put(job)
    lock = threading.Lock()
    state = {"running": 0, "most": 0}
    writes: list[tuple[str, str]] = []

    def write(what: str, name: str) -> None:
        with lock:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
            writes.append((what, name))
        time.sleep(0.01)  # long enough for the other threads to pile up if the pool let them
        with lock:
            state["running"] -= 1
        if name == fail:
            raise RuntimeError(f"409 on {name}")

    operator_scale.serve_writes(
        inbox,
        outbox,
        lambda child: write("create", child["metadata"]["name"]),
        lambda ns, name, status: write(f"patch {ns} {status['phase']}", name),
        3,
    )
    answers = []
    while not outbox.empty():
        answers.append(outbox.get())
    return writes, state["most"], answers


def test_the_floors_writer_creates_every_child_and_patches_each_job_once_within_its_pool() -> None:
    def job(name: str) -> tuple[str, str, list[dict[str, Any]], dict[str, Any]]:
        children = [{"metadata": {"name": f"{name}-{k}"}} for k in range(4)]
        return ("ns", name, children, {"phase": "Pending"})

    writes, most, answers = _served([job(f"job-{i}") for i in range(5)] + [None])
    assert sorted(n for w, n in writes if w == "create") == sorted(f"job-{i}-{k}" for i in range(5) for k in range(4))
    assert sorted(n for w, n in writes if w.startswith("patch")) == [f"job-{i}" for i in range(5)]
    assert all(w == "patch ns Pending" for w, n in writes if w.startswith("patch"))
    assert most == 3  # CREATE_CONCURRENCY in the benchmark: never more writes in flight
    assert sorted(a[0] for a in answers[:-1]) == [f"job-{i}" for i in range(5)]  # one patch time per job
    assert all(isinstance(t, float) for _, t in answers[:-1]) and answers[-1] == ("!done", 0.0)


def test_the_floors_writer_reports_a_failed_write_and_still_ends() -> None:
    writes, _, answers = _served([("ns", "job-0", [], {"phase": "Pending"}), None], fail="job-0")
    assert writes == [("patch ns Pending", "job-0")]
    assert answers == [("!error", "job-0: 409 on job-0"), ("!done", 0.0)]


def test_both_systems_make_one_pod_per_rank() -> None:
    spec = operator_scale.pytorchjob_manifest("j", "ns", 64)["spec"]["pytorchReplicaSpecs"]
    assert (spec["Master"]["replicas"], spec["Worker"]["replicas"]) == (1, 63)
    assert "Worker" not in operator_scale.pytorchjob_manifest("j", "ns", 1)["spec"]["pytorchReplicaSpecs"]
    assert operator_scale.job_manifest("j", "ns", 64)["spec"]["hardware"]["nodes"] == 64
    assert (operator_scale.PEER.services_per_job(64), operator_scale.OURS.services_per_job(64)) == (64, 1)


def test_peer_command_line() -> None:
    args = peer.peer_args(1001, 1002, 1003)
    assert {"--enable-scheme=pytorchjob", "--leader-elect=false", "--webhook-server-port=1003"} <= set(args)
    assert "--health-probe-bind-address=127.0.0.1:1001" in args and "--metrics-bind-address=127.0.0.1:1002" in args
    cmd = peer.in_private_cert_dir(["/bin/peer", *args], Path("/w/certs"))
    assert cmd[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert cmd[-len(args) - 1 :] == ["/bin/peer", *args]  # exec'd in place: the pid measured is the peer's
    setup = cmd[cmd.index("-c") + 1]
    assert 'mount -t tmpfs tmpfs "/tmp/k8s-webhook-server"' in setup and setup.endswith('exec "$@"')
    assert "training-operator" in bins.tool_names() and "kueue" in bins.tool_names()


def test_webhook_serving_pair_is_a_matching_loopback_pair(tmp_path: Path) -> None:
    ca = pki.webhook_serving_pair(tmp_path, "training-operator")
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    key = load_pem_private_key((tmp_path / "tls.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    issuer = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    cert.verify_directly_issued_by(issuer)
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0


def test_proc_parsing_and_this_process_usage() -> None:
    stat = "4242 (a (b) c) S 17 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0 0 0 0"
    ppid, cpu = procstat.parse_stat(stat)
    assert (ppid, cpu) == (17, 300 / os.sysconf("SC_CLK_TCK"))
    assert procstat.parse_status_kib("Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t 1024 kB\n", "VmRSS") == 1024 * 1024
    assert procstat.parse_status_kib("Name:\tzombie\n", "VmRSS") == 0
    me = procstat.usage(os.getpid())
    assert me.cpu_seconds > 0 and me.rss_bytes > 0 and me.peak_rss_bytes > 0


def _session(makespan: float, cpu: float, requests: float = 6.0, plane: float = 10.0) -> dict[str, Any]:
    run = {
        "jobs": 200,
        "makespanSeconds": makespan,
        "latencySeconds": {"p50": 1.0, "p95": 2.0, "max": 3.0},
        "requestsPerJob": requests,
        "cpuMsPerJob": cpu,
        "controlPlaneCpuSeconds": plane,
    }
    return {
        "narrow": run,
        "wide": {**run, "requestsPerJob": 70.0},
        "rssAtRestMiB": 80.0,
        "rssPeakMiB": 200.0,
        "rssAfterDeleteMiB": 90.0,
    }


def _floor(makespan: float) -> dict[str, Any]:
    run = {
        "jobs": 200,
        "makespanSeconds": makespan,
        "latencySeconds": {"p50": 0.5, "p95": 1.0, "max": 1.5},
        "requestsPerJob": 5.0,
        "controlPlaneCpuSeconds": 8.0,
    }
    return {"narrow": run, "wide": {**run, "jobs": 1, "requestsPerJob": 67.0}}


def _results(rounds: int, floor: float = 8.0) -> dict[str, Any]:
    raw = {
        "narrow": {"seconds": 5.0, "watchedSeconds": 5.5, "perJob": 4.0},
        "wide": {"seconds": 0.5, "watchedSeconds": 0.55, "perJob": 66.0},
    }
    return {
        "jobs": 200,
        "wideRanks": 64,
        "kubernetes": "v1.37.2",
        "peerVersion": "v1.8.1",
        "loadBefore": 1.5,
        "machine": {"cpus": 2},
        "rounds": [
            {
                "order": operator_scale.turn_order(["raw", "floor", "ours", "peer"], r),
                "raw": raw,
                "floor": _floor(floor),
                "ours": {**_session(10.0 + r, 60.0), "loadAfter": 3.0 + r},
                "peer": _session(40.0, 20.0, requests=9.0, plane=20.0),
            }
            for r in range(rounds)
        ],
    }


def test_table_has_medians_ranges_and_the_floor_peer_and_raw_ratios() -> None:
    text = peer_report.table(_results(3))
    assert text.splitlines()[0] == "| workload | ours | floor | peer | raw | **ours:floor** | ours:peer | ours:raw |"
    rows = [line for line in text.splitlines() if line.startswith("| 200 jobs × 2 ranks: makespan")]
    # ours median 11 s over 10..12, the floor 8 s, peer 40 s, raw 5.5 s watched (5 s to its last create)
    assert rows == [
        "| 200 jobs × 2 ranks: makespan to every pod and Service (floor: and its status patch; raw: seen by the same watch) | 11.00 s (10.00 s–12.00 s) | 8.00 s | 40.00 s | 5.50 s | 1.38× | 0.28× | 2.00× |",  # noqa: E501
        "| 200 jobs × 2 ranks: makespan (raw: until its last create returned) | 11.00 s (10.00 s–12.00 s) | 8.00 s | 40.00 s | 5.00 s | 1.38× | 0.28× | 2.20× |",  # noqa: E501
    ]
    wide = next(line for line in text.splitlines() if line.startswith("| 1 job × 64 ranks: every child (floor"))
    assert "| 0.55 s |" in wide
    # The floor has no operator process: no operator CPU or RSS, no ratio against it there.
    cpu = next(line for line in text.splitlines() if "CPU per 2-rank job" in line)
    assert cpu.endswith("| 60 ms | – | 20 ms | – | – | 3.00× | – |")
    total = next(line for line in text.splitlines() if "API server + etcd + operator CPU" in line)
    assert total.endswith("| 22.0 s | – | 24.0 s | – | – | 0.92× | – |")  # 10 s + 200 × 60 ms; 20 s + 200 × 20 ms
    requests = next(line for line in text.splitlines() if "requests per job until its children exist, 2" in line)
    assert requests.endswith("| 6.0 | 5.0 | 9.0 | 4.0 | 1.20× | 0.67× | 1.50× |")
    assert peer_report.ratio(1.0, None) == "–" and peer_report.ratio(1.0, 0.0) == "–"


def test_goal_line_says_plainly_whether_the_run_met_it() -> None:
    # ours 11 s against the floor's 8 s: 1.38×, over 1.3 on makespan; CPU 10/8 and requests 6/5 are within.
    missed = peer_report.goal(_results(3))
    assert "floor on the 200-job run's makespan, API server + etcd CPU and API requests per job: **not met**" in missed
    assert "(makespan 1.38× (**missed**), API server + etcd CPU 1.25×, requests per job 1.20×)" in missed
    assert "ahead of the peer on makespan, CPU and requests per job: **met** (makespan 0.28×," in missed
    assert "the operator process alone uses 3.00× the peer's CPU per job: behind" in missed
    assert missed.endswith("- This run did not meet the goal.")
    met = peer_report.goal(_results(3, floor=9.0))  # 11 / 9 = 1.22×
    assert "**not met**" not in met and met.endswith("- This run met the goal.")
    assert "no lower bound" not in met
    below = peer_report.goal(_results(3, floor=12.0))  # ours 11 s before the floor's 12 s: said, not hidden
    assert "- Ours finished before the floor: in this run the floor's makespan was no lower bound" in below
    without_floor = _results(1)
    del without_floor["rounds"][0]["floor"]
    text = peer_report.goal(without_floor)
    assert "**not measured** (ours or the floor not measured in this run)" in text
    assert text.endswith("- This run did not meet the goal.")


def test_peer_report_knows_the_make_targets_full_size() -> None:
    bench_mk = (ROOT / "mk" / "bench.mk").read_text()
    assert f"BENCH_PEER_JOBS ?= $(if $(QUICK),20,{peer_report.FULL_JOBS})" in bench_mk
    short = peer_report.section({**_results(1), "jobs": 50}, "make bench-peer BENCH_PEER_JOBS=50")
    assert "A shorter run than the default: 50 jobs instead of 200." in short
    assert "shorter" not in peer_report.section(_results(1), "make bench-peer")


def test_readme_block_is_appended_once_then_replaced(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\nintro\n")
    peer_report.write_section(readme, peer_report.section(_results(1), "make bench-peer"))
    first = readme.read_text()
    assert first.startswith("# Benchmarks\n\nintro\n") and first.count(peer_report.BEGIN) == 1
    assert "Reproduce: `make bench-peer`" in first and "| 40.00 s |" in first
    assert "1 round(s) of raw, floor, ours and peer interleaved" in first and "- This run met the goal." in first
    readme.write_text(first + "\n## Later section\n")
    peer_report.write_section(readme, peer_report.section(_results(2), "make bench-peer BENCH_PEER_ROUNDS=2"))
    second = readme.read_text()
    assert second.count(peer_report.BEGIN) == 1 and second.count(peer_report.END) == 1
    assert "BENCH_PEER_ROUNDS=2" in second and "## Later section" in second and "2 round(s)" in second
    assert "load average 1.5 before it and 3.0–4.0 after the turns" in second


def test_peer_build_is_pinned_where_bins_says() -> None:
    tool = bins.MODULE_TOOLS["training-operator"]
    go_mod = (tool.directory / "go.mod").read_text()
    assert f"\t{bins.PEER_MODULE} {bins.PEER_VERSION} " in go_mod  # go.mod and PEER_VERSION bumped together
    assert f"tool {tool.package}\n" in go_mod
    assert tool.bin_dir() == bins.cache_root() / "peer" / bins.PEER_VERSION / "bin"
    # Kueue's cache folder is where it was before both became ModuleTools: existing caches stay valid.
    assert bins.kueue_bin_dir() == bins.cache_root() / "kueue" / bins.KUEUE_VERSION / "bin"
