"""benchmarks/gpu_bert_ja.py: its argument handling, device refusal and MFU math. The GPU run itself is a
benchmark (numbers, on a GPU machine); here it runs only as a CPU smoke test with the tiny model."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import gpu_bert_ja as g
import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = ROOT / "benchmarks" / "gpu_bert_ja.py"


def test_bert_base_training_flops_per_sample_at_seq_128() -> None:
    base = g.ModelShape.base(vocab=32000)
    # 12 layers x (4 x 768^2 attention projections + 2 x 768 x 3072 FFN) = 84,934,656 matmul weights
    assert g.encoder_matmul_params(base) == 84_934_656
    # 6 x 128 x 84,934,656 + 12 x 12 x 768 x 128^2 = 65,229,815,808 + 1,811,939,328
    assert g.train_flops_per_sample(base, 128) == 67_041_755_136
    # the vocabulary is not in the formula: embedding lookups are not matmuls and the head is per sample
    assert g.train_flops_per_sample(g.ModelShape.base(vocab=1563), 128) == 67_041_755_136


def test_attention_term_grows_with_the_square_of_the_sequence() -> None:
    base = g.ModelShape.base(vocab=32000)
    dense = 6 * g.encoder_matmul_params(base)
    attn_128 = g.train_flops_per_sample(base, 128) - 128 * dense
    attn_256 = g.train_flops_per_sample(base, 256) - 256 * dense
    assert attn_256 == 4 * attn_128


def test_mfu_is_achieved_flops_over_peak() -> None:
    flops = g.train_flops_per_sample(g.ModelShape.base(32000), 128)
    peak, _ = g.peak_flops("NVIDIA H200", None)
    assert peak == 989e12
    assert g.mfu(1000.0, flops, peak) == pytest.approx(1000 * 67_041_755_136 / 989e12)
    assert g.mfu(1000.0, flops, None) is None


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40S", 362.0),
    ],
)
def test_peak_by_device_name(name: str, tflops: float) -> None:
    peak, source = g.peak_flops(name, None)
    assert peak == tflops * 1e12
    assert "table" in source


def test_peak_override_wins_and_unknown_devices_ask_for_it() -> None:
    assert g.peak_flops("NVIDIA H200", 500.0) == (500e12, "--peak-tflops")
    peak, source = g.peak_flops("NVIDIA GeForce RTX 9090", None)
    assert peak is None and "--peak-tflops" in source


def test_batch_sizes_parse_and_reject_with_the_flag_named() -> None:
    assert g.batch_sizes("8,16, 32") == [8, 16, 32]
    for bad in ("", "0,8", "8,x", "-4"):
        with pytest.raises(argparse.ArgumentTypeError, match="--batch-sizes"):
            g.batch_sizes(bad)


def test_parser_defaults_and_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    args = g.parser().parse_args([])
    assert (args.batch_sizes, args.seq_len, args.precision, args.device) == (
        [8, 16, 32, 64, 128, 256],
        128,
        "bf16",
        "cuda",
    )
    with pytest.raises(SystemExit):
        g.parser().parse_args(["--peak-tflops", "0"])
    ap = g.parser()
    with pytest.raises(SystemExit):
        g.check_args(ap, ap.parse_args(["--steps", "0"]))
    assert "--steps must be at least 1" in capsys.readouterr().err


def test_device_refusals_say_what_to_do() -> None:
    no_gpu = g.device_problem("cuda", tiny=False, cuda_available=False)
    assert no_gpu is not None and "--device cpu --tiny" in no_gpu
    cpu_full = g.device_problem("cpu", tiny=False, cuda_available=False)
    assert cpu_full is not None and "--tiny" in cpu_full
    assert g.device_problem("cuda", tiny=False, cuda_available=True) is None
    assert g.device_problem("cpu", tiny=True, cuda_available=False) is None


def test_cpu_without_tiny_exits_2_with_the_reason() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "--device cpu runs only with --tiny" in out.stderr


def test_cpu_tiny_smoke_run_reports_every_batch_size(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--tiny",
            "--batch-sizes",
            "2,4",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--peak-tflops",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [r["batchSize"] for r in doc["results"]] == [2, 4]
    tiny_flops = g.train_flops_per_sample(g.ModelShape.tiny(32000), 128)
    assert doc["flopsPerSample"] == tiny_flops and doc["peakSource"] == "--peak-tflops"
    for r in doc["results"]:
        assert r["samplesPerSecond"] > 0
        assert r["mfu"] == pytest.approx(r["samplesPerSecond"] * tiny_flops / 1e12, rel=0.01, abs=1e-4)
    assert "| 4 |" in proc.stdout


def test_saved_tokens_feed_a_run_without_the_tokenizer(tmp_path: Path) -> None:
    ids = tmp_path / "ids.json"
    saved = subprocess.run(
        [sys.executable, str(SCRIPT), "--save-tokens", str(ids), "--seq-len", "32"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    doc = json.loads(ids.read_text())
    assert doc["seqLen"] == 32 and {len(row) for row in doc["inputIds"]} == {32}
    assert len(doc["inputIds"]) == len(doc["attentionMask"]) == len(doc["labels"]) > 0
    assert g.load_tokens(ids, 32) == g.token_batches(32)
    with pytest.raises(ValueError, match="--seq-len 32"):
        g.load_tokens(ids, 128)
    out = tmp_path / "gpu.json"
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--tiny",
            "--tokens",
            str(ids),
            "--seq-len",
            "32",
            "--batch-sizes",
            "2",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(out.read_text())["results"][0]["samplesPerSecond"] > 0
    wrong = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--tokens", str(ids)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert wrong.returncode == 2 and "--tokens" in wrong.stderr and "--seq-len 32" in wrong.stderr
