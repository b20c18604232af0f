"""Data preparation on the Japanese sample: MeCab tokenisation throughput, and the runtime's tokenised-dataset
cache (first run builds it, the second loads it).

    python benchmarks/data_prep.py [--scale 25] [--quick] [--json OUT]

The data are examples/data/ja-reviews (400 reviews) repeated `--scale` times into a temporary folder. The
tokenizer is examples/models/tiny-bert-ja (BertJapaneseTokenizer: MeCab with unidic-lite, then WordPiece).
1. MeCab alone (fugashi through transformers' MecabTokenizer): texts/s, characters/s, words/s.
2. The whole tokenizer (MeCab + WordPiece, truncation at maxLength), one batched call: texts/s, tokens/s.
3. The runtime's own path (finetune_runtime.data.load_or_build with the text-classification task plugin's
   build_dataset, as the worker calls it, under a fresh FTJOB_CACHE_DIR): the first call loads the JSON, maps
   labels, tokenises and saves; the second finds the entry and loads it. Reported: both times and first / second.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchio import write_json

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "jobs" / "demo-ja-config.json"
DATA = ROOT / "examples" / "data" / "ja-reviews"


def write_scaled(dest: Path, scale: int) -> list[str]:
    """Copy train/validation.jsonl `scale` times over (ids made unique); returns the training texts."""
    dest.mkdir(parents=True, exist_ok=True)
    texts: list[str] = []
    for split in ("train", "validation"):
        rows = [
            json.loads(line)
            for line in (DATA / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        with (dest / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for k in range(scale):
                for r in rows:
                    f.write(json.dumps({**r, "review_id": f"{r['review_id']}-{k}"}, ensure_ascii=False) + "\n")
                    if split == "train":
                        texts.append(r["review_body"])
    return texts


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def mecab_throughput(texts: list[str]) -> dict[str, float]:
    from transformers.models.bert_japanese.tokenization_bert_japanese import MecabTokenizer

    mecab = MecabTokenizer(do_lower_case=False, mecab_dic="unidic_lite")
    mecab.tokenize(texts[0])  # dictionary load outside the clock
    secs, words = timed(lambda: sum(len(mecab.tokenize(t)) for t in texts))
    chars = sum(len(t) for t in texts)
    return {
        "texts": len(texts),
        "seconds": round(secs, 3),
        "textsPerSecond": round(len(texts) / secs, 1),
        "charsPerSecond": round(chars / secs),
        "wordsPerSecond": round(words / secs),
    }


def tokenizer_throughput(texts: list[str], max_length: int) -> dict[str, float]:
    from finetune_runtime.tokenization import load_tokenizer

    load_secs, tok = timed(lambda: load_tokenizer(str(ROOT / "examples" / "models" / "tiny-bert-ja")))
    tok(texts[:1])
    secs, enc = timed(lambda: tok(texts, truncation=True, max_length=max_length))
    tokens = sum(len(ids) for ids in enc["input_ids"])
    return {
        "loadSeconds": round(load_secs, 3),
        "seconds": round(secs, 3),
        "textsPerSecond": round(len(texts) / secs, 1),
        "tokensPerSecond": round(tokens / secs),
    }


def cache_first_vs_second(data_dir: Path, work: Path, repeats: int) -> dict[str, Any]:
    import datasets  # type: ignore[import-untyped,unused-ignore]

    from finetune_runtime import data, tasks
    from finetune_runtime.config import JobConfig
    from finetune_runtime.tokenization import load_tokenizer

    doc = json.loads(CONFIG.read_text(encoding="utf-8"))
    doc["task"]["dataset"]["path"] = str(data_dir)
    doc["task"]["model"] = str(ROOT / "examples" / "models" / "tiny-bert-ja")
    cfg = JobConfig.from_dict(doc)
    task = cfg.task
    assert task is not None
    datasets.disable_caching()  # as the worker does: our cache is the only one
    datasets.disable_progress_bars()
    seed = cfg.training.seed
    tokenizer = load_tokenizer(task.tokenizer_name)
    key = data.cache_key(data.key_inputs(task, seed))
    plugin = tasks.get(task.type)  # the worker's own path (train.py)

    def build() -> Any:
        raw = data.load_raw(task.dataset, cache_dir=str(work / "hf-datasets"))
        return plugin.build_dataset(raw, task, tokenizer, seed, False)

    cache_root = work / "ftjob-cache" / "datasets"
    first_secs, (dsets, hit) = timed(lambda: data.load_or_build(cache_root, key, build, contextlib.nullcontext))
    assert not hit, "the cache folder is new: the first call must build"
    seconds = []
    for _ in range(repeats):
        secs, (again, hit) = timed(lambda: data.load_or_build(cache_root, key, build, contextlib.nullcontext))
        assert hit and len(again["train"]) == len(dsets["train"])
        seconds.append(secs)
    second = statistics.median(seconds)
    return {
        "trainRows": len(dsets["train"]),
        "evalRows": len(dsets["validation"]),
        "firstSeconds": round(first_secs, 3),
        "secondSeconds": round(second, 4),
        "speedup": round(first_secs / second, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=25, help="copies of the 400-review sample (default 25)")
    ap.add_argument("--repeats", type=int, default=3, help="cached loads timed (median reported)")
    ap.add_argument("--quick", action="store_true", help="--scale 5 (make bench QUICK=1)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    scale = 5 if args.quick else args.scale
    if scale < 1:
        ap.error("--scale must be at least 1")
    max_length = int(json.loads(CONFIG.read_text(encoding="utf-8"))["task"]["maxLength"])
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        work = Path(tmp)
        texts = write_scaled(work / "ja-reviews", scale)
        mecab = mecab_throughput(texts)
        tok = tokenizer_throughput(texts, max_length)
        cache = cache_first_vs_second(work / "ja-reviews", work, args.repeats)
    doc = {
        "config": {"scale": scale, "trainTexts": len(texts), "cpus": os.cpu_count(), "loadAverage": os.getloadavg()},
        "mecab": mecab,
        "tokenizer": tok,
        "cache": cache,
    }
    print(f"| {len(texts)} training reviews | value |\n|---|---|")
    print(
        f"| MeCab (unidic-lite) alone | {mecab['textsPerSecond']} texts/s, {mecab['charsPerSecond']} chars/s, "
        f"{mecab['wordsPerSecond']} words/s |"
    )
    print(f"| tokenizer (MeCab + WordPiece) | {tok['textsPerSecond']} texts/s, {tok['tokensPerSecond']} tokens/s |")
    print(f"| runtime dataset prep, first run (build + save) | {cache['firstSeconds']} s |")
    print(f"| runtime dataset prep, second run (cache hit) | {cache['secondSeconds']} s ({cache['speedup']}x faster) |")
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
