"""The data and tiny models we ship under examples/: shape, balance, reproducibility, tokenizers."""

from __future__ import annotations

import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from conftest import EXAMPLES

REVIEWS = EXAMPLES / "data" / "ja-reviews"
SQUAD = EXAMPLES / "data" / "squad-mini"


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(name: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in (REVIEWS / name).read_text(encoding="utf-8").splitlines() if x.strip()]


def test_reviews_are_balanced_varied_and_unique() -> None:
    train, val = _rows("train.jsonl"), _rows("validation.jsonl")
    assert len(train) + len(val) >= 300
    for rows in (train, val):
        stars = collections.Counter(r["stars"] for r in rows)
        assert sorted(stars) == [1, 2, 3, 4, 5] and len(set(stars.values())) == 1, stars
        assert set(rows[0]) >= {"review_body", "stars", "product_category"}
    cats = collections.Counter(r["product_category"] for r in train + val)
    assert len(cats) >= 8
    bodies = [str(r["review_body"]) for r in train + val]
    assert len(set(bodies)) == len(bodies), "every review text is unique"
    assert not set(map(str, (r["review_body"] for r in train))) & set(map(str, (r["review_body"] for r in val)))
    lengths = sorted(len(b) for b in bodies)
    assert lengths[0] >= 10 and lengths[-1] > 2 * lengths[0], "reviews vary in length"


def test_review_files_match_their_generator() -> None:
    mod = _module(REVIEWS / "compose_reviews.py")
    train, val = mod.compose()
    assert mod.render(train) == (REVIEWS / "train.jsonl").read_text(encoding="utf-8")
    assert mod.render(val) == (REVIEWS / "validation.jsonl").read_text(encoding="utf-8")


def test_squad_spans_are_verified() -> None:
    n_q = n_ctx = 0
    ids: set[str] = set()
    for name in ("train.json", "validation.json"):
        doc = json.loads((SQUAD / name).read_text(encoding="utf-8"))
        for art in doc["data"]:
            for para in art["paragraphs"]:
                n_ctx += 1
                for qa in para["qas"]:
                    n_q += 1
                    ids.add(qa["id"])
                    for a in qa["answers"]:
                        s = a["answer_start"]
                        assert para["context"][s : s + len(a["text"])] == a["text"], qa
    assert n_ctx >= 24 and n_q >= 100 and len(ids) == n_q


def test_squad_files_match_their_generator(tmp_path: Path) -> None:
    mod = _module(SQUAD / "compose_squad.py")
    doc = mod.to_squad(mod.ARTICLES[-mod.VALIDATION_TITLES :], "va")
    assert json.dumps(doc, ensure_ascii=False, indent=1) + "\n" == (SQUAD / "validation.json").read_text("utf-8")


def test_tiny_tokenizers_load_and_cover_the_samples() -> None:
    from finetune_runtime.tokenization import load_tokenizer

    ja = load_tokenizer(str(EXAMPLES / "models" / "tiny-bert-ja"))
    assert type(ja).__name__ == "BertJapaneseTokenizer"
    toks = ja.tokenize(str(_rows("validation.jsonl")[0]["review_body"]))
    assert toks and toks.count("[UNK]") <= len(toks) // 5
    en = load_tokenizer(str(EXAMPLES / "models" / "tiny-distilbert-en"))
    assert en.tokenize("When was the lighthouse built?") == ["when", "was", "the", "lighthouse", "built", "?"]
    enc = en("When?", "In 1872.", return_offsets_mapping=True)
    assert "offset_mapping" in enc  # QA needs a fast tokenizer
    for d, tok in (("tiny-bert-ja", ja), ("tiny-distilbert-en", en)):
        cfg = json.loads((EXAMPLES / "models" / d / "config.json").read_text())
        assert cfg["vocab_size"] == len(tok)
        assert not list((EXAMPLES / "models" / d).glob("*.safetensors")), "no weights are committed"


def test_build_vocab_command(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text('{"vocab_size": 0}')
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "finetune_runtime",
            "build-vocab",
            "--lang",
            "ja",
            "--input",
            str(REVIEWS / "validation.jsonl"),
            "--field",
            "review_body",
            "--vocab-size",
            "1200",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "満足" in vocab and any(v.startswith("##") for v in vocab)
    assert json.loads((out / "config.json").read_text())["vocab_size"] == len(vocab)


def test_selfcheck_reports_versions_and_mecab() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "finetune_runtime", "selfcheck"],
        capture_output=True,
        text=True,
        check=False,
        env={**__import__("os").environ, "FTJOB_BACKEND": "cpu"},
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["ok"] and report["versions"]["torch"] and report["backend"]["ddp"] == "gloo"
    assert "満足" in report["tokenizer"]["mecab_unidic_lite"] or report["tokenizer"]["mecab_unidic_lite"]
    bad = subprocess.run(
        [sys.executable, "-m", "finetune_runtime", "selfcheck"],
        capture_output=True,
        text=True,
        check=False,
        env={**__import__("os").environ, "FTJOB_BACKEND": "neuron"},
    )
    assert bad.returncode == 1 and "finetune-operator/neuron" in json.loads(bad.stdout)["backend"]["error"]


INSTRUCT = EXAMPLES / "data" / "instruct-mini"


def test_instruct_files_match_their_generator() -> None:
    mod = _module(INSTRUCT / "compose_instruct.py")
    train, val = mod.split(mod.examples())
    assert mod.render(train) == (INSTRUCT / "train.jsonl").read_text(encoding="utf-8")
    assert mod.render(val) == (INSTRUCT / "validation.jsonl").read_text(encoding="utf-8")
    users = [json.dumps(r["messages"]) for r in train]
    assert len(set(users)) == len(users) and not {json.dumps(r["messages"]) for r in val} & set(users)
    for r in train + val:
        roles = [m["role"] for m in r["messages"]]
        assert roles[-1] == "assistant" and "user" in roles


def test_tiny_llama_tokenizer_has_the_chat_template_and_covers_the_data() -> None:
    from finetune_runtime.tokenization import load_tokenizer

    tok = load_tokenizer(str(EXAMPLES / "models" / "tiny-llama"))
    cfg = json.loads((EXAMPLES / "models" / "tiny-llama" / "config.json").read_text())
    assert cfg["vocab_size"] == len(tok) and cfg["model_type"] == "llama"
    assert (cfg["pad_token_id"], cfg["bos_token_id"], cfg["eos_token_id"]) == (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    assert tok.eos_token == "<|end|>" and tok.chat_template
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the plural of cat?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<s><|user|>\nWhat is the plural of cat?<|end|>\n<|assistant|>\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text  # byte-level: lossless
    assert not list((EXAMPLES / "models" / "tiny-llama").glob("*.safetensors")), "no weights are committed"


def test_build_vocab_bpe_command(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text('{"vocab_size": 0}')
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "finetune_runtime",
            "build-vocab",
            "--lang",
            "en",
            "--kind",
            "bpe",
            "--input",
            str(INSTRUCT / "validation.jsonl"),
            "--field",
            "messages",
            "--vocab-size",
            "400",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == {"vocab_size": tok.get_vocab_size(), "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    assert tok.decode(tok.encode("The opposite of hot is cold.").ids) == "The opposite of hot is cold."
