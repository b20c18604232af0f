"""Unit tests of the runtime's pure parts: env mapping, launch commands, labels, SQuAD metric, checkpoints,
progress lines, cache keys, backend selection, config parsing."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import DEMO_CONFIG, SQUAD_CONFIG
from hypothesis import given
from hypothesis import strategies as st

from finetune_runtime import checkpoints, data, distenv, launcher, progress
from finetune_runtime.backends import MissingStackError, plan_backend
from finetune_runtime.config import ConfigError, JobConfig, TaskConfig, load_config
from finetune_runtime.sshd import LAUNCHER_KEYS, install_keys, prepare_sshd, runtime_ssh_dir, sshd_config
from finetune_runtime.tasks import text_classification
from finetune_runtime.tasks.question_answering import squad
from finetune_runtime.waitfor import Probe, check, wait_for

# --- env mapping ------------------------------------------------------------------------------------------


def test_hydra_env_maps_to_torch_distributed() -> None:
    env = {
        "PMI_RANK": "3",
        "PMI_SIZE": "4",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
        "FTJOB_MASTER_ADDR": "job-worker-0.job.ns.svc",
        "FTJOB_MASTER_PORT": "29500",
    }
    assert distenv.distributed_env(env) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "job-worker-0.job.ns.svc",
        "MASTER_PORT": "29500",
    }
    info = distenv.dist_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.source) == (3, 4, 1, "hydra")


def test_openmpi_env_maps_to_torch_distributed() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "FTJOB_MASTER_ADDR": "m",
        "FTJOB_MASTER_PORT": "1234",
    }
    out = distenv.distributed_env(env)
    assert out["RANK"] == "5" and out["WORLD_SIZE"] == "8" and out["LOCAL_RANK"] == "1"
    assert out["LOCAL_WORLD_SIZE"] == "4" and out["MASTER_ADDR"] == "m" and out["MASTER_PORT"] == "1234"
    assert distenv.dist_info(env).source == "openmpi"


def test_hydra_without_local_rank_uses_slots() -> None:
    env = {"PMI_RANK": "5", "PMI_SIZE": "6", "FTJOB_MPI_SLOTS_PER_NODE": "2"}
    out = distenv.distributed_env(env)
    assert out["LOCAL_RANK"] == "1" and out["LOCAL_WORLD_SIZE"] == "2"


def test_torchrun_env_is_left_alone() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "a", "MASTER_PORT": "1", "PMI_RANK": "0"}
    assert distenv.distributed_env(env) == {}
    assert distenv.dist_info(env).rank == 1


def test_single_process_defaults() -> None:
    info = distenv.dist_info({})
    assert (info.rank, info.world_size, info.source) == (0, 1, "single")
    # The port is the operator's to choose (constants.MASTER_PORT); the runtime invents none.
    assert "MASTER_PORT" not in distenv.distributed_env({})


def test_an_mpi_world_without_a_master_port_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="FTJOB_MASTER_PORT is not set: hydra started 2 ranks"):
        distenv.dist_info({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert distenv.dist_info({"PMI_RANK": "0", "PMI_SIZE": "1"}).world_size == 1


@given(st.integers(0, 511), st.integers(1, 8))
def test_local_rank_is_rank_modulo_slots(rank: int, slots: int) -> None:
    out = distenv.distributed_env({"PMI_RANK": str(rank), "PMI_SIZE": "512", "FTJOB_MPI_SLOTS_PER_NODE": str(slots)})
    assert int(out["LOCAL_RANK"]) == rank % slots


# --- launch commands --------------------------------------------------------------------------------------

MPI_ENV = {
    "FTJOB_HOSTFILE": "/etc/ftjob/hostfile",
    "FTJOB_WORLD_SIZE": "4",
    "FTJOB_MPI_SLOTS_PER_NODE": "2",
    "FTJOB_BACKEND": "xeon",
    "OMP_NUM_THREADS": "23",
    "CCL_WORKER_COUNT": "1",
    "UNRELATED": "x",
    "PATH": "/usr/bin",
}


def _which(available: set[str]) -> object:
    return lambda n: f"/usr/bin/{n}" if n in available else None


def test_mpich_command() -> None:
    env = {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "mpich"}
    cmd = launcher.mpirun_command(
        env, python="/py", is_root=True, which=_which({"mpirun", "mpirun.mpich", "mpirun.openmpi"})
    )
    assert cmd == [
        "mpirun.mpich",
        "-f",
        "/etc/ftjob/hostfile",
        "-n",
        "4",
        "-ppn",
        "2",
        "-genvall",
        "/py",
        "-m",
        "finetune_runtime",
        "worker",
    ]
    # In pods the proxies dial mpiexec back by the launcher's DNS name (its short hostname does not resolve).
    env["FTJOB_LAUNCHER_HOST"] = "j-launcher.j.ns.svc"
    cmd = launcher.mpirun_command(env, python="/py", is_root=True, which=_which({"mpirun.mpich"}))
    assert cmd[7:9] == ["-localhost", "j-launcher.j.ns.svc"], cmd


def _intel_tree(root: Path) -> Path:
    """The file layout of an Intel MPI installation (the impi-rt wheel's: bin/ and lib/ under the prefix)."""
    for rel in ("bin/mpirun", "bin/mpiexec.hydra", "bin/impi_info", "lib/libmpi.so.12"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    return root


def test_intel_mpi_command_uses_its_mpirun_and_env(tmp_path: Path) -> None:
    root = _intel_tree(tmp_path / "impi")
    env = {
        **MPI_ENV,
        "FTJOB_MPI_IMPLEMENTATION": "intel",
        "I_MPI_ROOT": str(root),
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/opt/x",
    }
    argv, extra = launcher.mpirun_plan(env, python="/py", which=_which({"mpirun"}))
    assert argv[:8] == [f"{root}/bin/mpirun", "-f", "/etc/ftjob/hostfile", "-n", "4", "-ppn", "2", "-genvall"]
    # Its mpirun runs `mpiexec.hydra` from PATH, which Debian's MPICH also installs: Intel's bin dir goes first.
    assert extra == {"PATH": f"{root}/bin:/usr/bin:/bin", "I_MPI_ROOT": str(root), "I_MPI_HYDRA_BRANCH_COUNT": "-1"}
    # Without I_MPI_ROOT: an Intel mpirun on PATH, and its prefix becomes I_MPI_ROOT.
    on_path = launcher.mpirun_plan(
        {**env, "I_MPI_ROOT": ""}, python="/py", which=lambda n: str(root / "bin" / n) if n == "mpirun" else None
    )
    assert on_path[0][0] == f"{root}/bin/mpirun" and on_path[1]["I_MPI_ROOT"] == str(root)


def test_intel_mpi_never_falls_back_to_another_mpirun(tmp_path: Path) -> None:
    other = tmp_path / "usr" / "bin"
    other.mkdir(parents=True)
    (other / "mpirun").write_text("")  # OpenMPI's or MPICH's: no impi_info beside it
    env = {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "intel"}
    with pytest.raises(MissingStackError, match="I_MPI_ROOT") as e:
        launcher.mpirun_command(env, which=lambda n: str(other / n) if n == "mpirun" else None)
    assert "not Intel MPI" in str(e.value) and "finetune-operator/xeon" in str(e.value)
    assert (
        launcher.mpirun_plan(
            {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "mpich"}, python="/py", which=_which({"mpirun.mpich"})
        )[1]
        == {}
    )


def test_openmpi_command_forwards_vars_and_root_flag() -> None:
    env = {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "openmpi"}
    cmd = launcher.mpirun_command(env, python="/py", is_root=True, which=_which({"mpirun", "mpirun.openmpi"}))
    assert cmd[:9] == [
        "mpirun.openmpi",
        "--hostfile",
        "/etc/ftjob/hostfile",
        "-np",
        "4",
        "--map-by",
        "ppr:2:node",
        "--bind-to",
        "none",
    ]
    assert "--allow-run-as-root" in cmd
    forwarded = {cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"}
    assert {"FTJOB_BACKEND", "OMP_NUM_THREADS", "CCL_WORKER_COUNT", "PATH", "FTJOB_HOSTFILE"} <= forwarded
    assert "UNRELATED" not in forwarded
    assert cmd[-4:] == ["/py", "-m", "finetune_runtime", "worker"]
    non_root = launcher.mpirun_command(env, python="/py", is_root=False, which=_which({"mpirun"}))
    assert "--allow-run-as-root" not in non_root and non_root[0] == "mpirun"


def test_mpirun_ssh_launcher_flags(tmp_path: Path) -> None:
    w = "/home/ftjob/.ssh/ftjob-ssh"
    which = _which({"mpirun", "mpirun.mpich", "mpirun.openmpi"})
    mpich = launcher.mpirun_command(
        {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "mpich"}, python="/py", which=which, ssh_exec=w
    )
    assert mpich[7:11] == ["-launcher", "ssh", "-launcher-exec", w]
    intel = launcher.mpirun_command(
        {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "intel", "I_MPI_ROOT": str(_intel_tree(tmp_path))},
        python="/py",
        which=which,
        ssh_exec=w,
    )
    assert intel[7:11] == ["-bootstrap", "ssh", "-bootstrap-exec", w]
    ompi = launcher.mpirun_command(
        {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "openmpi"}, python="/py", is_root=False, which=which, ssh_exec=w
    )
    i = ompi.index("--mca")
    # No tree spawn: workers hold no client key, so only the launcher may ssh.
    assert ompi[i : i + 6] == ["--mca", "plm_rsh_agent", w, "--mca", "plm_rsh_no_tree_spawn", "1"]


def test_ssh_wrapper_uses_our_config(tmp_path: Path) -> None:
    cfg = launcher.write_ssh_config({"FTJOB_SSH_PORT": "2222"}, [], tmp_path / "my dir")
    assert "Port" not in launcher.ssh_config({}, [], tmp_path), "no port invented: ssh's own default"
    w = launcher.write_ssh_wrapper(cfg)
    assert w.read_text() == f"#!/bin/sh\nexec ssh -F '{cfg}' \"$@\"\n" and w.stat().st_mode & 0o700 == 0o700


def test_mpirun_override_and_missing_vars() -> None:
    env = {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "openmpi", "FTJOB_MPIRUN": "/opt/ompi/bin/mpirun"}
    assert launcher.mpirun_command(env, is_root=False, which=_which(set()))[0] == "/opt/ompi/bin/mpirun"
    with pytest.raises(launcher.LaunchError, match="FTJOB_HOSTFILE"):
        launcher.mpirun_command({"FTJOB_WORLD_SIZE": "2", "FTJOB_MPI_SLOTS_PER_NODE": "1"}, which=_which({"mpirun"}))
    # MPICH ships in the cpu image (backends.py: each backend's MPI implementations), not in the xeon one
    with pytest.raises(MissingStackError, match="use the finetune-operator/cpu image"):
        launcher.mpirun_command({**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "mpich"}, which=_which(set()))


def test_hostfile_dialects() -> None:
    hydra = "job-worker-0.job.ns.svc:2\njob-worker-1.job.ns.svc:2\n"
    ompi = "# generated\njob-worker-0.job.ns.svc slots=2\njob-worker-1.job.ns.svc slots=2\n\n"
    want = [launcher.HostSlots("job-worker-0.job.ns.svc", 2), launcher.HostSlots("job-worker-1.job.ns.svc", 2)]
    assert launcher.parse_hostfile(hydra) == want
    assert launcher.parse_hostfile(ompi) == want
    assert launcher.parse_hostfile("lonely") == [launcher.HostSlots("lonely", 1)]


def test_ssh_config_uses_port_and_key(tmp_path: Path) -> None:
    cfg = launcher.write_ssh_config({"FTJOB_SSH_PORT": "2222"}, ["a", "b"], tmp_path / "ssh")
    text = cfg.read_text()
    assert cfg == tmp_path / "ssh" / "config"
    assert "Port 2222" in text and f"IdentityFile {tmp_path}/ssh/id_ed25519" in text
    lines = [ln.strip() for ln in text.splitlines()]
    assert "StrictHostKeyChecking yes" in lines and f"UserKnownHostsFile {tmp_path}/ssh/known_hosts" in lines
    assert "GlobalKnownHostsFile /dev/null" in lines and "StrictHostKeyChecking no" not in text
    assert oct(cfg.stat().st_mode & 0o777) == "0o600" and oct(cfg.parent.stat().st_mode & 0o777) == "0o700"


def test_torchrun_launch_plan() -> None:
    env = {
        "FTJOB_NNODES": "2",
        "FTJOB_NPROC_PER_NODE": "32",
        "FTJOB_NODE_RANK": "1",
        "FTJOB_MASTER_ADDR": "job-rank-0.job.ns.svc",
        "FTJOB_MASTER_PORT": "29500",
        "FTJOB_BACKEND": "cpu",
    }
    cmd, extra = launcher.launch_plan(env, precompile=False, python="/py")
    assert cmd == [
        "/py",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "32",
        "--node-rank",
        "1",
        "--master-addr",
        "job-rank-0.job.ns.svc",
        "--master-port",
        "29500",
        "-m",
        "finetune_runtime",
        "worker",
    ]
    assert extra == {}
    cmd, extra = launcher.launch_plan({**env, "FTJOB_PRECOMPILE_STEPS": "4"}, precompile=True, python="/py")
    assert cmd[0] == "/py" and extra == {"FTJOB_MODE": "precompile"}  # the steps travel in the env as they are
    del env["FTJOB_MASTER_PORT"]  # run by hand: torchrun's own default port
    assert "--master-port" not in launcher.launch_plan(env, precompile=False, python="/py")[0]


def test_neuron_precompile_wraps_in_neuron_parallel_compile() -> None:
    env = {"FTJOB_BACKEND": "neuron"}
    cmd, _ = launcher.launch_plan(env, True, python="/py", which=_which({"neuron_parallel_compile"}))
    assert cmd[:4] == ["/usr/bin/neuron_parallel_compile", "/py", "-m", "torch.distributed.run"]
    with pytest.raises(MissingStackError, match="finetune-operator/neuron"):
        launcher.launch_plan(env, True, python="/py", which=_which(set()))


# --- backends ---------------------------------------------------------------------------------------------


def _importable(mods: set[str]) -> object:
    return lambda m: m in mods


def test_cpu_backend() -> None:
    p = plan_backend("cpu", "fp32", importable=_importable(set()))
    assert (p.ddp_backend, p.use_cpu, p.trainer_bf16, p.cast_model_bf16, p.ipex) == ("gloo", True, False, False, False)


def test_xeon_backend_with_and_without_intel_stack() -> None:
    full = plan_backend(
        "xeon", "bf16", importable=_importable({"intel_extension_for_pytorch", "oneccl_bindings_for_pytorch"})
    )
    assert (full.ddp_backend, full.ipex, full.trainer_bf16, full.use_cpu) == ("ccl", True, True, True)
    bare = plan_backend("xeon", "bf16", importable=_importable(set()))
    assert (bare.ddp_backend, bare.ipex, bare.trainer_bf16) == ("gloo", False, True)
    assert any("gloo" in n for n in bare.notes)


def test_neuron_backend_casts_model_and_sets_stochastic_rounding() -> None:
    p = plan_backend("neuron", "bf16", importable=_importable({"torch_xla"}))
    assert (p.ddp_backend, p.cast_model_bf16, p.trainer_bf16, p.use_cpu) == ("xla", True, False, False)
    assert p.env == {"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"}
    assert "XLA_USE_BF16" not in p.env  # deprecated by Neuron; see docs/runtime.md
    assert plan_backend("neuron", "fp32", importable=_importable({"torch_xla"})).env == {}


def test_missing_stacks_name_the_image() -> None:
    with pytest.raises(MissingStackError, match="finetune-operator/neuron"):
        plan_backend("neuron", "bf16", importable=_importable(set()))
    with pytest.raises(MissingStackError, match="finetune-operator/nvidia"):
        plan_backend("nvidia", "bf16", cuda_available=lambda: False)
    p = plan_backend("nvidia", "bf16", cuda_available=lambda: True)
    assert (p.ddp_backend, p.trainer_bf16, p.use_cpu) == ("nccl", True, False)
    with pytest.raises(ValueError, match="FTJOB_BACKEND"):
        plan_backend("tpu", "fp32")


def test_real_missing_stack_here() -> None:
    """This machine has no torch_xla: the real import check must refuse the neuron backend."""
    with pytest.raises(MissingStackError, match="finetune-operator/neuron"):
        plan_backend("neuron", "bf16")


# --- labels / sampling ------------------------------------------------------------------------------------

STAR_MAP = {"1": 0, "2": 0, "4": 1, "5": 1}


@pytest.mark.parametrize(
    ("value", "want"), [(1, 0), (2, 0), (3, None), (4, 1), (5, 1), ("5", 1), (4.0, 1), (None, None)]
)
def test_star_label_map(value: object, want: int | None) -> None:
    assert text_classification.map_label(value, STAR_MAP, ["negative", "positive"]) == want


def test_labels_without_map() -> None:
    names = ["negative", "positive"]
    assert text_classification.map_label("positive", None, names) == 1
    assert text_classification.map_label(0, None, names) == 0
    assert text_classification.map_label("1", None, names) == 1
    assert text_classification.map_label("neutral", None, names) is None


def test_select_classification_drops_unmapped_rows() -> None:
    import datasets

    ds = datasets.Dataset.from_list(
        [{"review_body": f"r{i}", "stars": s, "product_category": "x"} for i, s in enumerate([1, 2, 3, 4, 5, 3])]
    )
    cfg = TaskConfig.from_dict(json.loads(DEMO_CONFIG.read_text())["task"]).dataset
    out = text_classification.select_classification(ds, cfg, ["negative", "positive"])
    assert out.column_names == ["review_body", "labels"]
    assert out["labels"] == [0, 0, 1, 1] and out["review_body"] == ["r0", "r1", "r3", "r4"]


def test_seeded_sampling_is_reproducible() -> None:
    import datasets

    ds = datasets.Dataset.from_dict({"x": list(range(100))})
    a = data.sample(ds, 10, seed=1)["x"]
    assert a == data.sample(ds, 10, seed=1)["x"] and a != data.sample(ds, 10, seed=2)["x"]
    assert len(set(a)) == 10
    assert sorted(data.sample(ds, None, seed=1)["x"]) == list(range(100))


def test_eval_split_falls_back_to_seeded_holdout() -> None:
    import datasets

    raw = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"x": list(range(50))})})
    cfg = TaskConfig.from_dict({**json.loads(DEMO_CONFIG.read_text())["task"]}).dataset
    train, ev = data.train_eval_splits(raw, cfg, seed=3)
    assert len(ev) == 5 and len(train) == 45 and not set(train["x"]) & set(ev["x"])


# --- SQuAD metric -----------------------------------------------------------------------------------------


def test_squad_normalisation_and_scores() -> None:
    assert squad.normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert squad.exact_match("the Eiffel tower", "Eiffel Tower.") == 1.0
    assert squad.f1("in the year 1872", "1872") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert squad.f1("granite", "grey granite") == pytest.approx(2 / 3)
    assert squad.f1("", "") == 1.0 and squad.f1("a", "granite") == 0.0
    m = squad.squad_metrics({"q1": "1872", "q2": "grey stone"}, {"q1": ["1872"], "q2": ["grey granite", "granite"]})
    assert m["exact_match"] == pytest.approx(50.0)
    assert m["f1"] == pytest.approx((100 + 50) / 2)
    assert squad.squad_metrics({}, {"q": ["x"]}) == {"exact_match": 0.0, "f1": 0.0}


@given(st.text(min_size=1, max_size=40))
def test_squad_prediction_equal_to_gold_is_perfect(s: str) -> None:
    assert squad.exact_match(s, s) == 1.0 and squad.f1(s, s) == 1.0


def test_postprocess_picks_best_valid_span() -> None:
    import numpy as np

    context = "Built in 1872 from granite."
    offsets = [None, (0, 5), (6, 8), (9, 13), (14, 18), (19, 26), None]
    features = [{"example_id": "a", "offset_mapping": offsets}]
    start = np.array([[9.0, 0, 0, 5, 0, 1, 9]])  # the best raw start (0, 6) points outside the context
    end = np.array([[9.0, 0, 0, 4, 0, 2, 9]])
    out = squad.postprocess_predictions([{"id": "a", "context": context}], features, start, end, "context")
    assert out == {"a": "1872"}


# --- checkpoints ------------------------------------------------------------------------------------------


def _ckpt(root: Path, step: int, complete: bool, state: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x")
    if state:
        (d / "trainer_state.json").write_text("{}")
    if complete:
        checkpoints.mark_complete(d, "u")
    return d


def test_newest_complete_checkpoint_wins(tmp_path: Path) -> None:
    assert checkpoints.newest_complete(tmp_path / "none") is None
    _ckpt(tmp_path, 5, True)
    want = _ckpt(tmp_path, 10, True)
    _ckpt(tmp_path, 15, False)  # killed mid-save: no marker
    _ckpt(tmp_path, 20, True, state=False)  # marker but no trainer state: not resumable
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "tmp-checkpoint-25").mkdir()
    assert checkpoints.newest_complete(tmp_path) == want
    # numeric, not lexical, order
    big = _ckpt(tmp_path, 100, True)
    assert checkpoints.newest_complete(tmp_path) == big
    gone = checkpoints.remove_incomplete(tmp_path)
    assert sorted(p.name for p in gone) == ["checkpoint-15", "checkpoint-20"]
    assert [s for s, _ in checkpoints.list_checkpoints(tmp_path)] == [5, 10, 100]


def test_checkpoint_at_max_steps_counts_as_finished(tmp_path: Path) -> None:
    mid = _ckpt(tmp_path, 5, True)
    (mid / "trainer_state.json").write_text('{"global_step": 5, "max_steps": 60}')
    end = _ckpt(tmp_path, 60, True)
    (end / "trainer_state.json").write_text('{"global_step": 60, "max_steps": 60}')
    assert not checkpoints.finished_training(mid) and checkpoints.finished_training(end)
    (end / "trainer_state.json").write_text("{broken")
    assert not checkpoints.finished_training(end)


# --- progress lines ---------------------------------------------------------------------------------------


def test_progress_line_format() -> None:
    line = progress.format_line(
        "train",
        step=120,
        totalSteps=500,
        epoch=1.2,
        loss=0.41,
        samplesPerSecond=35.2,
        etaSeconds=96,
        time="2026-12-02T10:00:00Z",
    )
    assert line == (
        'FTJOB_PROGRESS {"event":"train","step":120,"totalSteps":500,"epoch":1.2,"loss":0.41,'
        '"samplesPerSecond":35.2,"etaSeconds":96,"time":"2026-12-02T10:00:00Z"}'
    )
    done = progress.format_line(
        "done", step=5, totalSteps=5, metrics={"accuracy": 0.86}, outputDir="/o", etaSeconds=None
    )
    assert done == (
        'FTJOB_PROGRESS {"event":"done","step":5,"totalSteps":5,"metrics":{"accuracy":0.86},"outputDir":"/o"}'
    )
    assert progress.parse_line("[default0]:" + done) == {
        "event": "done",
        "step": 5,
        "totalSteps": 5,
        "metrics": {"accuracy": 0.86},
        "outputDir": "/o",
    }
    with pytest.raises(ValueError):
        progress.format_line("started")
    assert '"loss":null' in progress.format_line("train", loss=float("nan"))


def test_clean_metrics_keeps_model_metrics_only() -> None:
    m = {
        "eval_loss": 0.5,
        "eval_accuracy": 0.9,
        "eval_runtime": 1.2,
        "eval_samples_per_second": 3.0,
        "epoch": 2.0,
        "eval_f1": 0.8,
    }
    assert progress.clean_metrics(m) == {"loss": 0.5, "accuracy": 0.9, "f1": 0.8}


def test_emitter_is_silent_off_rank_zero(capsys: pytest.CaptureFixture[str]) -> None:
    progress.ProgressEmitter(False).emit("train", step=1)
    progress.ProgressEmitter(True).emit("eval", step=2, metrics={"accuracy": 1.0})
    assert capsys.readouterr().out == 'FTJOB_PROGRESS {"event":"eval","step":2,"metrics":{"accuracy":1.0}}\n'


# --- cache key --------------------------------------------------------------------------------------------


def test_cache_key_changes_with_what_changes_tokens() -> None:
    task = TaskConfig.from_dict(json.loads(DEMO_CONFIG.read_text())["task"])
    base = data.cache_key(data.key_inputs(task, 42))
    assert base == data.cache_key(data.key_inputs(task, 42))
    assert base.startswith("ja-reviews-tiny-bert-ja-128-")
    doc = json.loads(DEMO_CONFIG.read_text())["task"]
    variants = [
        {**doc, "maxLength": 64},
        {**doc, "tokenizer": "cl-tohoku/bert-base-japanese-v3"},
        {**doc, "dataset": {**doc["dataset"], "labelMap": {"1": 0, "5": 1}}},
        {**doc, "dataset": {**doc["dataset"], "trainSamples": 100}},
        {**doc, "dataset": {**doc["dataset"], "path": "examples/data/squad-mini"}},
    ]
    keys = {data.cache_key(data.key_inputs(TaskConfig.from_dict(v), 42)) for v in variants}
    assert base not in keys and len(keys) == len(variants)
    assert data.cache_key(data.key_inputs(task, 7)) != base  # the seed decides the sample


def test_cache_key_follows_local_file_changes(tmp_path: Path) -> None:
    f = tmp_path / "train.jsonl"
    f.write_text('{"text": "a", "label": 0}\n')
    before = data.path_fingerprint(str(tmp_path))
    f.write_text('{"text": "a", "label": 0}\n{"text": "b", "label": 1}\n')
    assert data.path_fingerprint(str(tmp_path)) != before


# --- config -----------------------------------------------------------------------------------------------


def test_example_configs_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTJOB_CONFIG", str(DEMO_CONFIG))
    cfg = load_config()
    assert cfg.task is not None and cfg.task.type == "text-classification"
    assert cfg.task.dataset.label_map == STAR_MAP and cfg.training.precision == "fp32"
    qa = JobConfig.from_dict(json.loads(SQUAD_CONFIG.read_text()))
    assert qa.task is not None and qa.task.doc_stride == 32 and qa.task.dataset.eval_split == "validation"


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"task\.type"):
        TaskConfig.from_dict({"type": "summarization", "model": "m", "dataset": {"path": "p"}})
    with pytest.raises(ConfigError, match=r"task\.dataset"):
        TaskConfig.from_dict({"type": "text-classification", "model": "m", "dataset": {}})
    with pytest.raises(ConfigError, match="precision"):
        JobConfig.from_dict({"training": {"precision": "fp8"}})
    assert JobConfig.from_dict({"jobName": "byo", "task": None}).task is None


def test_qa_inference_inputs_are_checked_before_training() -> None:
    """Sentences given to a QA job used to crash the inference check after training had finished."""
    qa = {"type": "question-answering", "model": "m", "dataset": {"path": "p"}}
    with pytest.raises(ConfigError, match=r"task\.inferenceQuestions"):
        TaskConfig.from_dict({**qa, "inferenceSamples": ["What is it?"]})
    with pytest.raises(ConfigError, match=r"task\.inferenceQuestions\[0\]"):
        TaskConfig.from_dict({**qa, "inferenceQuestions": [{"question": "q"}]})
    q = {"question": "Who?", "context": "Ann did."}
    assert TaskConfig.from_dict({**qa, "inferenceQuestions": [q]}).inference_questions == [q]
    tc = {"type": "text-classification", "model": "m", "dataset": {"path": "p"}}
    with pytest.raises(ConfigError, match="question-answering only"):
        TaskConfig.from_dict({**tc, "inferenceQuestions": [q]})
    assert TaskConfig.from_dict({**tc, "inferenceSamples": ["good"]}).inference_samples == ["good"]


# --- sshd keys / wait-for ---------------------------------------------------------------------------------


def test_install_keys_fixes_modes(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    for n in (
        "id_ed25519",
        "id_ed25519.pub",
        "known_hosts",
        "authorized_keys",
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
    ):
        (secret / n).write_text(n)
        (secret / n).chmod(0o400)
    home = tmp_path / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    env = {"HOME": str(home), "FTJOB_SSH_SECRET_DIR": str(secret), "FTJOB_SSH_PORT": "2022"}
    argv = prepare_sshd(env)
    d = home / ".ssh"  # without FTJOB_SSH_DIR: the image user's home, as in pods
    assert argv[-2:] == ["-f", str(d / "sshd_config")] and "Port 2022" in (d / "sshd_config").read_text()
    install_keys(secret, d, required=LAUNCHER_KEYS)  # idempotent over read-only copies
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in d.iterdir()}
    assert modes["id_ed25519"] == "0o600" and modes["authorized_keys"] == "0o600"
    assert modes["id_ed25519.pub"] == "0o644" and oct(d.stat().st_mode & 0o777) == "0o700"
    assert modes["known_hosts"] == "0o644"
    assert not home.stat().st_mode & 0o022  # sshd's StrictModes checks the directory above too
    assert "StrictModes yes" in (d / "sshd_config").read_text()
    assert f"AuthorizedKeysFile {d}/authorized_keys" in sshd_config(d, "2222")
    (secret / "authorized_keys").unlink()
    with pytest.raises(FileNotFoundError, match="authorized_keys"):
        prepare_sshd({**env, "HOME": str(tmp_path / "home2")})  # a worker's part of the Secret is incomplete
    (secret / "known_hosts").unlink()
    with pytest.raises(FileNotFoundError, match="known_hosts"):  # a launcher never trusts on first use
        install_keys(secret, tmp_path / "home3" / ".ssh", required=LAUNCHER_KEYS)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root to make a root-owned home and setpriv to run as uid 1000",
)
def test_sshd_in_a_root_owned_world_writable_home_runs_without_strict_modes() -> None:
    """A pod's HOME is an emptyDir the kubelet makes root-owned and 0777; the image user (uid 1000) may not chmod
    it, so sshd cannot have StrictModes there: prepare_sshd must still set up the keys (found by the e2e tier)."""
    base = Path(tempfile.mkdtemp(prefix="ftjob-sshd-", dir="/tmp"))
    try:
        base.chmod(0o755)
        secret, home = base / "secret", base / "home"
        secret.mkdir(mode=0o755)
        for n in ("authorized_keys", "ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"):
            (secret / n).write_text(n)
            (secret / n).chmod(0o444)
        home.mkdir()
        home.chmod(0o777)  # root-owned, world-writable: the kubelet's emptyDir
        env = {"HOME": str(home), "FTJOB_SSH_SECRET_DIR": str(secret), "FTJOB_SSH_PORT": "2022"}
        code = f"import json; from finetune_runtime.sshd import prepare_sshd; print(json.dumps(prepare_sshd({env!r})))"
        out = subprocess.run(
            ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        d = home / ".ssh"
        assert "StrictModes no" in (d / "sshd_config").read_text()
        assert "StrictModes off" in out.stderr  # said, not silent
        assert d.stat().st_uid == 1000 and oct(d.stat().st_mode & 0o777) == "0o700"
        assert oct((d / "ssh_host_ed25519_key").stat().st_mode & 0o777) == "0o600"
        assert home.stat().st_uid == 0 and home.stat().st_mode & 0o777 == 0o777  # untouched: it is not ours
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_ssh_dir_is_ftjob_ssh_dir_else_home() -> None:
    assert runtime_ssh_dir({"HOME": "/home/u", "FTJOB_SSH_DIR": "/w/ssh"}) == Path("/w/ssh")
    assert runtime_ssh_dir({"HOME": "/home/u"}) == Path("/home/u/.ssh")
    assert runtime_ssh_dir({}) == Path("/home/ftjob/.ssh")


def test_wait_for_reports_what_is_missing() -> None:
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert check(Probe("tcp", "127.0.0.1", port)) is None
    assert check(Probe("dns", "localhost")) is None
    assert "does not resolve" in (check(Probe("dns", "no-such-host.invalid")) or "")
    lines: list[str] = []
    ok = wait_for(
        [Probe("dns", "localhost"), Probe("dns", "no-such-host.invalid")],
        timeout_s=0.5,
        interval_s=0.1,
        log=lines.append,
    )
    assert not ok
    assert any("TIMEOUT" in ln and "no-such-host.invalid" in ln for ln in lines)
    assert any("dns:localhost ready" in ln for ln in lines)


# --- metrics / upload keys --------------------------------------------------------------------------------


def test_classification_metrics() -> None:
    import numpy as np

    from finetune_runtime.tasks.text_classification import classification_metrics

    logits = np.array([[2.0, 0], [0, 3.0], [0, 1.0], [1.0, 0]])
    m = classification_metrics(logits, np.array([0, 1, 0, 1]))
    assert m["accuracy"] == 0.5 and m["f1"] == pytest.approx(0.5)  # label 1: tp 1, fp 1, fn 1
    three = classification_metrics(np.eye(3), np.array([0, 1, 2]))
    assert three == {"accuracy": 1.0, "f1": 1.0}


def test_upload_outputs_copies_the_final_artefacts_only(tmp_path: Path) -> None:
    from finetune_runtime.location import DirLocation, upload_outputs

    src = tmp_path / "scratch"
    (src / "model").mkdir(parents=True)
    (src / "model" / "config.json").write_text("{}")
    (src / "metrics.json").write_text("{}")
    (src / "checkpoints").mkdir()
    (src / "checkpoints" / "x").write_text("")
    done = upload_outputs(src, DirLocation(tmp_path / "dst"), ["model", "model-merged", "metrics.json"])
    assert done == ["model/config.json", "metrics.json"]
    assert sorted(p.relative_to(tmp_path / "dst").as_posix() for p in (tmp_path / "dst").rglob("*")) == [
        "metrics.json",
        "model",
        "model/config.json",
    ]


def test_cli_missing_stack_exits_3_naming_the_image(tmp_path: Path) -> None:
    import subprocess

    from conftest import runtime_argv, runtime_env

    env = runtime_env(tmp_path, DEMO_CONFIG, FTJOB_BACKEND="neuron")
    worker = subprocess.run(runtime_argv("worker"), env=env, capture_output=True, text=True, check=False, timeout=300)
    assert worker.returncode == 3 and "use the finetune-operator/neuron image" in worker.stderr
    pre = subprocess.run(
        runtime_argv("launch", "--precompile"), env=env, capture_output=True, text=True, check=False, timeout=300
    )
    assert pre.returncode == 3 and "neuron_parallel_compile" in pre.stderr
    assert "finetune-operator/neuron" in pre.stderr


def test_training_arguments_per_backend_and_mode(tmp_path: Path) -> None:
    from finetune_runtime.distenv import DistInfo
    from finetune_runtime.train import training_arguments

    cfg = JobConfig.from_dict(json.loads(DEMO_CONFIG.read_text()))
    # In-process TrainingArguments with a gloo ddp_backend would start torch.distributed: one rank here (the
    # 2-rank arguments run for real in test_training.py).
    one = DistInfo(0, 1, 0, 1, "single")
    two = DistInfo(0, 2, 0, 2, "torchrun")
    cpu = plan_backend("cpu", "fp32")
    args = training_arguments(cfg, cpu, one, tmp_path, precompile=False, precompile_steps=16)
    assert args.ddp_backend is None and args.use_cpu and not args.torch_compile
    assert args.save_steps == cfg.training.checkpoint_every_steps and args.eval_strategy == "epoch"
    assert args.logging_steps == 10 and args.max_steps == -1 and args.num_train_epochs == 6
    assert args.get_warmup_steps(100) == 10  # warmupRatio 0.1, on transformers 4.57 and 5.x alike
    pre = training_arguments(cfg, cpu, one, tmp_path, precompile=True, precompile_steps=3)
    assert pre.torch_compile and pre.max_steps == 3 and pre.save_strategy == "no"
    assert pre.torch_compile_backend == "inductor"
    neuron = plan_backend("neuron", "bf16", importable=lambda m: m == "torch_xla")
    nargs = training_arguments(cfg, neuron, two, tmp_path, precompile=True, precompile_steps=3)
    assert nargs.ddp_backend is None and not nargs.torch_compile and not nargs.bf16
    # TorchNeuron (fake: its module's presence only): the trial compiles through torch.compile's neuron backend.
    # fp32 on one rank: bf16 or a "neuron" process group would need the device here.
    native = plan_backend("neuron-native", "fp32", importable=lambda m: m == "torch_neuronx")
    fake_native = training_arguments(cfg, native, one, tmp_path, precompile=True, precompile_steps=3)
    assert fake_native.torch_compile and fake_native.torch_compile_backend == "neuron" and not fake_native.use_cpu
    assert not training_arguments(cfg, native, one, tmp_path, precompile=False, precompile_steps=3).torch_compile


def test_mpirun_runs_a_jobs_own_command_instead_of_the_worker() -> None:
    env = {**MPI_ENV, "FTJOB_MPI_IMPLEMENTATION": "mpich"}
    cmd = launcher.mpirun_command(
        env, python="/py", which=_which({"mpirun.mpich"}), program=["python", "train.py", "--lr", "1"]
    )
    assert cmd[-4:] == ["python", "train.py", "--lr", "1"] and "finetune_runtime" not in cmd


def test_emitter_writes_each_line_in_one_write() -> None:
    # Under mpirun all ranks share the launcher's stdout: a line split over two writes can be torn apart.
    writes: list[str] = []

    class Recorder(io.StringIO):
        def write(self, s: str) -> int:
            writes.append(s)
            return super().write(s)

    progress.ProgressEmitter(True, stream=Recorder()).emit("train", step=3)
    assert writes == ['FTJOB_PROGRESS {"event":"train","step":3}\n']


def test_wait_for_accumulates_repeated_flags() -> None:
    """The MPI launcher's init command repeats --dns/--ssh per worker (builders/pods.py); found by
    tests/faults/test_kubeflow_complaints.py: each repeat replaced the last, so only the last worker was waited
    for."""
    from finetune_runtime.cli import parser

    ns = parser().parse_args(
        ["wait-for", "--dns", "w0", "--ssh", "w0", "--dns", "w1", "--ssh", "w1:22", "--tcp", "a:1", "b:2"]
    )
    assert (ns.dns, ns.ssh, ns.tcp) == (["w0", "w1"], ["w0", "w1:22"], ["a:1", "b:2"])


def test_torch_compile_toolchain_problem_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from finetune_runtime.compilecache import toolchain_problem

    assert toolchain_problem() is None  # this machine has g++ and Python.h, as the images do
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    problem = toolchain_problem()
    assert problem and "a C++ compiler (g++)" in problem and "finetune-operator image" in problem


def test_an_epoch_end_save_only_when_the_newest_checkpoint_is_a_minute_old() -> None:
    """Short epochs made a save per epoch the runtime's whole overhead over a bare Trainer; a restart still
    loses at most max(one epoch, EPOCH_SAVE_MIN_SECONDS) of work beyond the step schedule."""
    from types import SimpleNamespace

    from finetune_runtime.callbacks import EPOCH_SAVE_MIN_SECONDS, ProgressCallback

    now = [1000.0]
    cb = ProgressCallback(
        progress.ProgressEmitter(False), precompile=False, save_each_epoch=True, uid="u", clock=lambda: now[0]
    )
    state = SimpleNamespace(global_step=0, is_world_process_zero=False)
    cb.on_train_begin(None, state, None)

    def epoch_end(at: float, step: int) -> bool:
        now[0], state.global_step = 1000.0 + at, step
        return bool(cb.on_epoch_end(None, state, SimpleNamespace(should_save=False)).should_save)

    assert not epoch_end(10, 13), "a young run is not saved at its first epoch end"
    assert epoch_end(EPOCH_SAVE_MIN_SECONDS + 1, 26)
    cb.on_save(SimpleNamespace(output_dir="/nonexistent"), state, None)  # the save that epoch end asked for
    assert not epoch_end(EPOCH_SAVE_MIN_SECONDS + 20, 39), "the newest checkpoint is 19 s old"
    assert epoch_end(2 * EPOCH_SAVE_MIN_SECONDS + 2, 52)
    cb.on_save(SimpleNamespace(output_dir="/nonexistent"), state, None)
    now[0] += 2 * EPOCH_SAVE_MIN_SECONDS
    assert not epoch_end(4 * EPOCH_SAVE_MIN_SECONDS + 5, 52), "this very step was just saved"


def test_dataset_from_rows_matches_from_list_without_pickling_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import datasets.arrow_dataset

    rows = [
        {"id": "a", "answers": {"text": ["x"], "answer_start": [3]}},
        {"id": "b", "answers": {"text": [], "answer_start": []}},
    ]
    reference = datasets.Dataset.from_list(rows)

    def no_dill_hash(_: object) -> str:
        raise AssertionError("the in-memory table was fingerprinted by pickling it")

    monkeypatch.setattr(datasets.arrow_dataset, "generate_fingerprint", no_dill_hash)
    built = data.dataset_from_rows(rows)
    assert built.features == reference.features and built.to_list() == reference.to_list()
    assert built._fingerprint == data.dataset_from_rows(list(rows))._fingerprint
    assert built._fingerprint != data.dataset_from_rows(rows[:1])._fingerprint
