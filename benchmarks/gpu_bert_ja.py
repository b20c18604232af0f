"""BERT-base-sized Japanese classification training on one NVIDIA GPU: samples/s and MFU across batch sizes.

    python benchmarks/gpu_bert_ja.py [--batch-sizes 8,16,32,64,128,256] [--peak-tflops N] [--compile] [--json OUT]
    python benchmarks/gpu_bert_ja.py --device cpu --tiny      # smoke test of the script itself (the unit tests)
    python benchmarks/gpu_bert_ja.py --save-tokens ids.json   # tokenise here, then on a GPU machine that lacks
    python benchmarks/gpu_bert_ja.py --tokens ids.json        # MeCab's dictionary (unidic-lite is 249 MB)

The model is BertForSequenceClassification at BERT-base size (12 layers, hidden 768, 12 heads, FFN 3072,
vocabulary 32,000 as in cl-tohoku/bert-base-japanese), randomly initialised from that config: hub weights
cannot be downloaded here, and the step time does not depend on the weights' values. The data are the
Japanese sample reviews (examples/data/ja-reviews) tokenised with the repository's tiny MeCab + WordPiece
tokenizer (examples/models/tiny-bert-ja; its ids are a subset of the vocabulary), padded to --seq-len.
Each step is forward + backward + AdamW in bf16 autocast with fp32 weights (what HF Trainer's bf16=True and the
runtime's nvidia backend do). Per batch size: --warmup untimed steps, then --steps timed between CUDA syncs.

MFU = samples/s x training FLOPs per sample / the GPU's peak dense bf16 FLOP/s, with
    FLOPs per sample = 6 x S x N + 12 x L x H x S^2
(S sequence length, L layers, H hidden size, N = L x (4 H^2 + 2 H F) the encoder's matmul weights, F the FFN
size): 2 FLOPs per weight per token forward and 4 backward, plus the attention scores and their weighted sum
(2 x 2 x S^2 x H per layer forward, x3 with backward). Embeddings, biases, layer norms, softmax and the
pooler/classifier head are left out (under 1% at BERT-base). The peak comes from PEAK_BF16_TFLOPS by device
name, or --peak-tflops; with neither, MFU is not reported.

The Trainium figures printed beside the results are the reference for this job (trn1): 68 samples/s in fp32
on one NeuronCore, 149 samples/s in bf16 on two.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchio import write_json

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "examples" / "models" / "tiny-bert-ja"
DATA = ROOT / "examples" / "data" / "ja-reviews"

# Peak dense (no sparsity) bf16 tensor-core TFLOP/s per GPU, from NVIDIA's data sheets; the first name that
# occurs in torch.cuda.get_device_name() wins, so the more specific names come first. Read by peak_flops().
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H200", 989.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
)
# Reference throughput of this job on Trainium (trn1), samples/s: printed beside the GPU's numbers.
TRAINIUM_REFERENCE = {"trn1 fp32, 1 NeuronCore": 68.0, "trn1 bf16, 2 NeuronCores": 149.0}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int

    @staticmethod
    def base(vocab: int) -> ModelShape:
        return ModelShape(layers=12, hidden=768, heads=12, ffn=3072, vocab=vocab)

    @staticmethod
    def tiny(vocab: int) -> ModelShape:
        """examples/models/tiny-bert-ja's shape: for the CPU smoke test only."""
        return ModelShape(layers=2, hidden=64, heads=2, ffn=128, vocab=vocab)


def encoder_matmul_params(m: ModelShape) -> int:
    """Weights that take part in a matmul per token: Q, K, V, output projection and the two FFN layers."""
    return m.layers * (4 * m.hidden * m.hidden + 2 * m.hidden * m.ffn)


def train_flops_per_sample(m: ModelShape, seq_len: int) -> float:
    """6 x S x N + 12 x L x H x S^2 (see the module docstring)."""
    return 6.0 * seq_len * encoder_matmul_params(m) + 12.0 * m.layers * m.hidden * seq_len * seq_len


def peak_flops(device_name: str, override_tflops: float | None) -> tuple[float | None, str]:
    """(peak FLOP/s, where it came from). The override wins; an unknown device gives (None, reason)."""
    if override_tflops is not None:
        return override_tflops * 1e12, "--peak-tflops"
    for name, tflops in PEAK_BF16_TFLOPS:
        if name.lower() in device_name.lower():
            return tflops * 1e12, f"table: {name} {tflops:g} TFLOP/s dense bf16"
    return None, f"no peak known for {device_name!r}: pass --peak-tflops to get MFU"


def mfu(samples_per_second: float, flops_per_sample: float, peak: float | None) -> float | None:
    return None if peak is None else samples_per_second * flops_per_sample / peak


def batch_sizes(text: str) -> list[int]:
    """argparse type for --batch-sizes: comma-separated positive integers."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--batch-sizes takes comma-separated integers, e.g. 8,16,32; got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--batch-sizes takes positive integers, e.g. 8,16,32; got {text!r}")
    return values


def positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def device_problem(device: str, tiny: bool, cuda_available: bool) -> str | None:
    """Why this run must not start (None when it may)."""
    if device == "cuda" and not cuda_available:
        return (
            "no CUDA GPU is visible (torch.cuda.is_available() is False): this benchmark runs on one NVIDIA "
            "GPU. For a smoke test of the script on CPU: --device cpu --tiny"
        )
    if device == "cpu" and not tiny:
        return (
            "--device cpu runs only with --tiny (a smoke test): BERT-base training on CPU says nothing "
            "about the GPU figures this benchmark is for"
        )
    return None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        default=[8, 16, 32, 64, 128, 256],
        help="comma-separated per-GPU batch sizes (default 8,16,32,64,128,256)",
    )
    ap.add_argument("--seq-len", type=int, default=128, help="tokens per sample, padded (default 128)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per batch size (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--vocab-size", type=int, default=32000, help="embedding rows (default 32000)")
    ap.add_argument(
        "--precision",
        choices=["bf16", "fp32"],
        default="bf16",
        help="bf16 autocast with fp32 weights (default), or fp32 throughout (TF32 matmuls off)",
    )
    ap.add_argument(
        "--peak-tflops",
        type=positive_float,
        help="the GPU's peak dense TFLOP/s for MFU (default: PEAK_BF16_TFLOPS by device name)",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (what training.compile: true does); the warm-up steps include the "
        "compilation, reported as warmupSeconds",
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the tiny model (2 layers, hidden 64): smoke tests only")
    ap.add_argument(
        "--max-minutes",
        type=positive_float,
        default=9.0,
        help="skip the remaining batch sizes once this much time has passed (default 9)",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--save-tokens",
        type=Path,
        metavar="FILE",
        help="tokenise the sample reviews at --seq-len, write the ids to FILE and exit (no torch needed)",
    )
    ap.add_argument(
        "--tokens",
        type=Path,
        metavar="FILE",
        help="read the ids from a --save-tokens FILE instead of tokenising (no MeCab needed)",
    )
    return ap


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag, value, low in (
        ("--seq-len", args.seq_len, 8),
        ("--steps", args.steps, 1),
        ("--warmup", args.warmup, 0),
        ("--vocab-size", args.vocab_size, 2),
    ):
        if value < low:
            ap.error(f"{flag} must be at least {low}, got {value}")


def token_batches(seq_len: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The sample reviews, tokenised and padded to seq_len: (input_ids, attention_mask, labels)."""
    from finetune_runtime.tokenization import load_tokenizer

    rows = [
        json.loads(line)
        for f in ("train.jsonl", "validation.jsonl")
        for line in (DATA / f).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    rows = [r for r in rows if r["stars"] != 3]
    tok = load_tokenizer(str(TOKENIZER))
    enc = tok([r["review_body"] for r in rows], truncation=True, max_length=seq_len, padding="max_length")
    return enc["input_ids"], enc["attention_mask"], [int(r["stars"] >= 4) for r in rows]


def save_tokens(path: Path, seq_len: int) -> None:
    ids, mask, labels = token_batches(seq_len)
    doc = {"seqLen": seq_len, "tokenizer": TOKENIZER.name, "inputIds": ids, "attentionMask": mask, "labels": labels}
    path.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")


def load_tokens(path: Path, seq_len: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The ids a --save-tokens run wrote; refused (ValueError naming the fix) if made at another length."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("seqLen") != seq_len:
        raise ValueError(
            f"--tokens {path} was written at --seq-len {doc.get('seqLen')}, not {seq_len}: "
            f"pass --seq-len {doc.get('seqLen')} or write it again with --save-tokens"
        )
    return doc["inputIds"], doc["attentionMask"], doc["labels"]


def measure(args: argparse.Namespace, shape: ModelShape, batch: int, data: Any) -> dict[str, Any]:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    device = torch.device(args.device)
    config = BertConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.ffn,
        max_position_embeddings=max(512, args.seq_len),
        num_labels=2,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).to(device).train()
    forward = torch.compile(model, dynamic=False) if args.compile else model  # one static graph per batch size
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, **({"fused": True} if args.device == "cuda" else {}))
    ids, mask, labels = data
    n = ids.shape[0]
    gen = torch.Generator(device="cpu").manual_seed(0)

    def step() -> None:
        idx = torch.randint(0, n, (batch,), generator=gen).to(device)
        with torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = forward(input_ids=ids[idx], attention_mask=mask[idx], labels=labels[idx]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        start = time.perf_counter()
        for _ in range(args.warmup):
            step()
        sync()
        warm_secs = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        secs = time.perf_counter() - start
    except torch.OutOfMemoryError:
        return {"batchSize": batch, "error": "out of memory"}
    mem = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    return {
        "batchSize": batch,
        "samplesPerSecond": round(batch * args.steps / secs, 1),
        "stepMilliseconds": round(secs / args.steps * 1e3, 2),
        "warmupSeconds": round(warm_secs, 2),
        "peakMemoryGiB": round(mem, 2) if mem is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    check_args(ap, args)
    if args.save_tokens:
        save_tokens(args.save_tokens, args.seq_len)
        print(f"gpu_bert_ja: wrote the sample reviews' ids at --seq-len {args.seq_len} to {args.save_tokens}")
        return 0
    if args.tokens:
        try:
            tokens = load_tokens(args.tokens, args.seq_len)
        except (OSError, ValueError, KeyError) as err:
            ap.error(f"--tokens: {err}")
    import torch

    problem = device_problem(args.device, args.tiny, torch.cuda.is_available())
    if problem:
        print(f"gpu_bert_ja: {problem}", file=sys.stderr)
        return 2
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32; bf16 autocast is unaffected
        device_name = torch.cuda.get_device_name(0)
    else:
        device_name = f"cpu ({os.cpu_count()} cores)"
    shape = (ModelShape.tiny if args.tiny else ModelShape.base)(args.vocab_size)
    flops = train_flops_per_sample(shape, args.seq_len)
    peak, peak_source = peak_flops(device_name, args.peak_tflops)
    ids, mask, labels = tokens if args.tokens else token_batches(args.seq_len)
    top = max(max(r) for r in ids)
    if top >= shape.vocab:
        ap.error(f"--vocab-size {shape.vocab} is smaller than the tokenizer's ids: use at least {top + 1}")
    data = tuple(torch.tensor(x, device=args.device) for x in (ids, mask, labels))
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for batch in args.batch_sizes:
        if time.monotonic() - started > args.max_minutes * 60:
            rows.append({"batchSize": batch, "error": f"skipped: past --max-minutes {args.max_minutes:g}"})
            continue
        row = measure(args, shape, batch, data)
        if args.device == "cuda":
            torch.cuda.empty_cache()  # the previous batch size's model and optimizer state are gone
        if "samplesPerSecond" in row:
            sps = row["samplesPerSecond"]
            u = mfu(sps, flops, peak)
            row |= {
                "achievedTflops": round(sps * flops / 1e12, 3),
                "mfu": round(u, 4) if u is not None else None,
                **{f"x {k}": round(sps / v, 2) for k, v in TRAINIUM_REFERENCE.items()},
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {
        "device": device_name,
        "precision": args.precision,
        "compile": args.compile,
        "seqLen": args.seq_len,
        "model": asdict(shape),
        "flopsPerSample": flops,
        "flopsFormula": "6*S*N + 12*L*H*S^2, N = L*(4*H^2 + 2*H*F)",
        "peakFlops": peak,
        "peakSource": peak_source,
        "trainiumReference": TRAINIUM_REFERENCE,
        "seconds": round(time.monotonic() - started, 1),
        "results": rows,
    }
    mode = f"{args.precision}{', torch.compile' if args.compile else ''}"
    print(f"\n{device_name}, {mode}, seq {args.seq_len}, {flops / 1e9:.1f} GFLOPs/sample; peak: {peak_source}")
    print("| batch | samples/s | step ms | TFLOP/s | MFU | vs trn1 fp32 (68) | vs trn1 bf16 x2 (149) | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['batchSize']} | {r['error']} | | | | | | |")
            continue
        u = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(
            f"| {r['batchSize']} | {r['samplesPerSecond']} | {r['stepMilliseconds']} | {r['achievedTflops']} "
            f"| {u} | {r['x trn1 fp32, 1 NeuronCore']}x | {r['x trn1 bf16, 2 NeuronCores']}x "
            f"| {r['peakMemoryGiB'] if r['peakMemoryGiB'] is not None else '-'} |"
        )
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
