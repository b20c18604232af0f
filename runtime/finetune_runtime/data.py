"""Datasets, the part every task shares: load (hub name, data files per split, local file or directory),
split, sample, cache. Selecting columns and tokenising is each task plugin's (finetune_runtime/tasks/).

The tokenised dataset is written once under `$FTJOB_CACHE_DIR/datasets/<key>` (key = dataset + tokenizer +
lengths + options) by global rank 0 while the other ranks wait at a barrier; they, and later runs, load it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from finetune_runtime.config import ConfigError, DatasetConfig, TaskConfig

log = logging.getLogger(__name__)

# Bump when the tokenised layout changes so old cache entries are not reused.
CACHE_FORMAT_VERSION = 3
_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
# Compression suffixes datasets decompresses by itself (the operator's schema lists the same ones).
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


# --- loading ----------------------------------------------------------------------------------------------


def _files_in(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in _LOCAL_FORMATS)


def _split_files(ds: DatasetConfig) -> dict[str, list[Path]]:
    """Local path -> {split: files}. A directory maps each file stem to a split (train.jsonl -> "train");
    a single file is the train split."""
    assert ds.path is not None
    p = Path(ds.path)
    if not p.exists():
        raise FileNotFoundError(f"task.dataset.path {p} does not exist")
    files = _files_in(p) if p.is_dir() else [p]
    if not files:
        raise FileNotFoundError(f"no .jsonl/.json/.csv/.parquet files in {p}")
    if p.is_file():
        return {ds.train_split: files}
    splits: dict[str, list[Path]] = {}
    for f in files:
        splits.setdefault(f.stem.split(".")[0].split("-")[0], []).append(f)
    return splits


def _is_squad_json(path: Path) -> bool:
    """SQuAD's nested layout ({"data": [{"paragraphs": ...}]}) rather than records or JSON lines."""
    if path.suffix != ".json":
        return False
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return False
    data = doc.get("data") if isinstance(doc, dict) else None
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "paragraphs" in data[0]


def flatten_squad(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """SQuAD nested JSON -> rows {id, title, context, question, answers: {text: [...], answer_start: [...]}}."""
    rows = []
    for article in doc["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                rows.append(
                    {
                        "id": str(qa["id"]),
                        "title": article.get("title", ""),
                        "context": para["context"],
                        "question": qa["question"],
                        "answers": {
                            "text": [a["text"] for a in qa.get("answers", [])],
                            "answer_start": [int(a["answer_start"]) for a in qa.get("answers", [])],
                        },
                    }
                )
    return rows


def _format_of(name: str) -> str | None:
    for comp in _COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
    return next((fmt for suffix, fmt in _LOCAL_FORMATS.items() if name.endswith(suffix)), None)


def data_files_format(ds: DatasetConfig) -> str:
    """The datasets builder (json, csv, parquet) for `dataFiles`: `format`, else told from the file names."""
    assert ds.data_files is not None
    if ds.format:
        return ds.format
    formats = {_format_of(f) for f in ds.data_files.values()}
    if len(formats) != 1 or None in formats:
        raise ConfigError(
            f"task.dataset.format cannot be told from the names in task.dataset.dataFiles "
            f"{ds.data_files}: set format to json, csv or parquet"
        )
    return str(formats.pop())


def _check_protocols(data_files: dict[str, str]) -> None:
    """Fail before any download when a URL's fsspec protocol is not installed (s3:// needs s3fs)."""
    import fsspec  # type: ignore[import-untyped,unused-ignore]

    for split, url in data_files.items():
        if "://" not in url:
            continue
        protocol = url.split("://", 1)[0]
        try:
            fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as e:
            raise ConfigError(
                f"task.dataset.dataFiles.{split}: {url} needs the fsspec protocol {protocol!r} "
                f"({e}); install its package in the image, or copy the files to a volume and "
                f"name them by path"
            ) from e


def dataset_from_rows(rows: list[dict[str, Any]]) -> Any:
    """`datasets.Dataset.from_list(rows)`, fingerprinted by the rows' JSON. from_list fingerprints an in-memory
    table by pickling all of it with dill: slower than hashing the JSON, and it fails outright under Python 3.12
    (seen with datasets 5.2, dill 0.4.1, pyarrow 26 on a GPU machine: "Can't pickle <class 'MonthDayNano'>")."""
    import datasets  # type: ignore[import-untyped,unused-ignore]
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]
    table = datasets.table.InMemoryTable(pa.Table.from_pylist(rows))
    return datasets.Dataset(table, fingerprint=f"rows-{digest}")


def load_raw(ds: DatasetConfig, cache_dir: str | None = None) -> Any:
    """A `datasets.DatasetDict` with at least the train split."""
    import datasets  # type: ignore[import-untyped,unused-ignore]

    if ds.data_files:
        # One code path for hf://datasets/... URLs, local files and other fsspec URLs: the packaged json/csv/
        # parquet builders, which also serve hub datasets whose loading script datasets >= 4 no longer runs.
        _check_protocols(ds.data_files)
        return datasets.load_dataset(data_files_format(ds), data_files=dict(ds.data_files), cache_dir=cache_dir)
    if ds.path:
        splits: dict[str, Any] = {}
        for split, files in _split_files(ds).items():
            if all(_is_squad_json(f) for f in files):
                rows = [r for f in files for r in flatten_squad(json.loads(f.read_text(encoding="utf-8")))]
                splits[split] = dataset_from_rows(rows)
            else:
                fmt = _LOCAL_FORMATS[files[0].suffix]
                splits[split] = datasets.load_dataset(
                    fmt, data_files=[str(f) for f in files], split="train", cache_dir=cache_dir
                )
        return datasets.DatasetDict(splits)
    # The real hub path: unreachable in our test environment, kept as the production code path.
    return datasets.load_dataset(ds.name, ds.config, cache_dir=cache_dir)


# --- splits and sampling ---------------------------------------------------------------------------------


def sample(dsplit: Any, n: int | None, seed: int) -> Any:
    """Seeded sample of n rows (all rows, shuffled, when n is None or larger than the split)."""
    shuffled = dsplit.shuffle(seed=seed)
    return shuffled if n is None or n >= len(shuffled) else shuffled.select(range(n))


def train_eval_splits(raw: Any, ds: DatasetConfig, seed: int) -> tuple[Any, Any]:
    if ds.train_split not in raw:
        raise KeyError(f"train split {ds.train_split!r} not in dataset (has {list(raw)})")
    train = raw[ds.train_split]
    if ds.eval_split and ds.eval_split in raw:
        return train, raw[ds.eval_split]
    # No eval split: hold out a seeded tenth of train (at least one row) so eval never sees training rows.
    size = ds.eval_samples or max(1, len(train) // 10)
    parts = train.train_test_split(test_size=min(size, len(train) - 1), seed=seed)
    return parts["train"], parts["test"]


# --- cache ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheKeyInputs:
    task_type: str
    dataset: dict[str, Any]
    data_fingerprint: str
    tokenizer: str
    tokenizer_fingerprint: str
    max_length: int
    # the task plugin's options that change the tokens (TaskPlugin.cache_inputs)
    task_options: dict[str, Any]
    seed: int
    version: int = CACHE_FORMAT_VERSION


def path_fingerprint(path: str | None) -> str:
    """Size+mtime of the files under a local path (cheap; changes whenever the files are rewritten)."""
    if not path or not Path(path).exists():
        return ""
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(p) if p.is_dir() else f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _source_label(dataset: dict[str, Any]) -> str:
    """Readable part of a cache key: the hub name, the local path's name, or the train file's folder (ja)."""
    if dataset.get("name"):
        return str(dataset["name"])
    if dataset.get("path"):
        return Path(str(dataset["path"])).name
    files = dataset.get("data_files") or {}
    train = files.get(dataset.get("train_split") or "train") or next(iter(files.values()), "")
    return Path(str(train)).parent.name or "data"


def data_fingerprint(ds: DatasetConfig) -> str:
    """path_fingerprint of the local data: `path`, or every `dataFiles` entry that is a local file."""
    if ds.data_files:
        return "|".join(path_fingerprint(ds.data_files[split]) for split in sorted(ds.data_files))
    return path_fingerprint(ds.path)


def cache_key(inputs: CacheKeyInputs) -> str:
    """Human-readable prefix + hash of everything that changes the tokenised result."""
    blob = json.dumps(asdict(inputs), sort_keys=True, ensure_ascii=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
    src = _source_label(inputs.dataset)
    tok = Path(inputs.tokenizer.rstrip("/")).name
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{src}-{tok}-{inputs.max_length}")
    return f"{safe}-{digest}"


def key_inputs(task: TaskConfig, seed: int) -> CacheKeyInputs:
    from finetune_runtime import tasks

    ds = task.dataset
    tok = task.tokenizer_name
    return CacheKeyInputs(
        task_type=task.type,
        dataset=asdict(ds),
        data_fingerprint=data_fingerprint(ds),
        tokenizer=tok,
        tokenizer_fingerprint=path_fingerprint(tok) if Path(tok).is_dir() else "",
        max_length=task.max_length,
        task_options=tasks.get(task.type).cache_inputs(task),
        seed=seed,
    )


def load_or_build(
    cache_root: Path, key: str, build: Callable[[], Any], barrier_first: Callable[[], Any]
) -> tuple[Any, bool]:
    """Load `cache_root/key` or build it. `barrier_first` is a context manager factory that lets rank 0 run
    its body first (HF TrainingArguments.main_process_first). Returns (DatasetDict, hit)."""
    import datasets  # type: ignore[import-untyped,unused-ignore]

    target = cache_root / key
    with barrier_first():
        if (target / "dataset_dict.json").exists():
            log.info("tokenised dataset cache hit: %s", target)
            return datasets.load_from_disk(str(target)), True
        log.info("tokenised dataset cache miss: building %s", target)
        built = build()
        # Write beside the target and rename: a crash or a concurrent builder (a node without a shared cache)
        # never leaves a half-written entry under the final name.
        tmp = cache_root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
        cache_root.mkdir(parents=True, exist_ok=True)
        built.save_to_disk(str(tmp))
        try:
            os.rename(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # someone else published the same key first
        return datasets.load_from_disk(str(target)), False
