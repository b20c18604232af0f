"""Tokenizer loading, with the MeCab dictionary fallback our images need.

Japanese BERT tokenizers (BertJapaneseTokenizer, word_tokenizer_type="mecab") name a MeCab dictionary:
`ipadic` by default (cl-tohoku/bert-base-japanese), `unidic_lite` or `unidic` in later models. Only
unidic-lite ships in our images (the full `unidic` needs a separate 500 MB download), so when the named
dictionary package cannot be imported we load the tokenizer with `mecab_dic="unidic_lite"` instead and say so.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FALLBACK_MECAB_DIC = "unidic_lite"


def read_tokenizer_config(name_or_path: str) -> dict[str, Any]:
    """tokenizer_config.json of a local dir or a hub repo ({} when it has none or the hub is unreachable)."""
    p = Path(name_or_path)
    if p.is_dir():
        f = p / "tokenizer_config.json"
        doc: dict[str, Any] = json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}
        return doc
    try:
        from huggingface_hub import hf_hub_download

        hub: dict[str, Any] = json.loads(
            Path(hf_hub_download(name_or_path, "tokenizer_config.json")).read_text("utf-8")
        )
        return hub
    except Exception as e:  # the tokenizer load below reports the real problem
        log.debug("no tokenizer_config.json for %s: %s", name_or_path, e)
        return {}


def mecab_override(tok_config: dict[str, Any]) -> dict[str, Any] | None:
    """mecab_kwargs to pass when the configured MeCab dictionary is not importable, else None."""
    if tok_config.get("word_tokenizer_type") != "mecab":
        return None
    kwargs = dict(tok_config.get("mecab_kwargs") or {})
    dic = kwargs.get("mecab_dic", "ipadic")
    if kwargs.get("mecab_option") and not kwargs.get("mecab_dic"):
        return None  # an explicit MeCab option string is the model author's choice: keep it
    if dic and importlib.util.find_spec(dic) is not None:
        return None
    return {**kwargs, "mecab_dic": FALLBACK_MECAB_DIC}


def load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    override = mecab_override(read_tokenizer_config(name_or_path))
    if override is not None:
        log.info("MeCab dictionary of %s is not installed here; using %s", name_or_path, FALLBACK_MECAB_DIC)
        return AutoTokenizer.from_pretrained(name_or_path, mecab_kwargs=override)
    return AutoTokenizer.from_pretrained(name_or_path)


def mecab_words(text: str) -> list[str]:
    """MeCab (unidic-lite) surface forms, the word level BertJapaneseTokenizer works on."""
    from transformers.models.bert_japanese.tokenization_bert_japanese import MecabTokenizer

    mecab = MecabTokenizer(do_lower_case=False, mecab_dic=FALLBACK_MECAB_DIC)
    return list(mecab.tokenize(text))  # type: ignore[no-untyped-call,unused-ignore]
