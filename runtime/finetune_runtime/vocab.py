"""`build-vocab`: a tokenizer trained on our own sample text: a WordPiece vocab.txt for the BERT-style models, or
a byte-level BPE tokenizer.json for the Llama-style decoder (`--kind bpe`).

The text is first split into words the same way the model's tokenizer will split it (MeCab + unidic-lite for
Japanese, BERT's BasicTokenizer for English), then WordPiece is trained on those words, so the resulting
vocab.txt fits BertJapaneseTokenizer (mecab + wordpiece) and BertTokenizer/DistilBertTokenizer respectively. The BPE
tokenizer is byte-level (any text encodes, no unknown token) with the chat markers as special tokens; the
model directory's hand-written tokenizer_config.json names them and holds the chat template.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from finetune_runtime.tokenization import mecab_words

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The decoder's special tokens, in id order (pad 0, bos 1, eos 2): examples/models/tiny-llama's chat template
# writes <|role|> before each turn and <|end|> (the eos, where generation stops) after it.
BPE_SPECIAL_TOKENS = ["<pad>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


def texts_from_files(files: Iterable[Path], fields: list[str]) -> Iterator[str]:
    """Text fields of jsonl rows, or of SQuAD JSON (contexts, questions, answers)."""
    for f in files:
        if f.suffix == ".jsonl":
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    for k in fields:
                        if isinstance(row.get(k), list):  # chat messages: [{"role", "content"}, ...]
                            yield from (str(m["content"]) for m in row[k])
                        elif row.get(k):
                            yield str(row[k])
        else:
            doc = json.loads(f.read_text(encoding="utf-8"))
            for art in doc["data"]:
                for para in art["paragraphs"]:
                    yield para["context"]
                    for qa in para["qas"]:
                        yield qa["question"]


def build_vocab(texts: Iterable[str], lang: str, vocab_size: int) -> list[str]:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    if lang == "ja":
        # BertJapaneseTokenizer runs MeCab first and WordPiece on its words; do the same here.
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        corpus: Iterable[str] = (" ".join(mecab_words(t)) for t in texts)
    else:
        # What BertTokenizer does before WordPiece: lower-case, strip accents, split on space/punctuation.
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        corpus = texts
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=1, continuing_subword_prefix="##"
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    vocab = tok.get_vocab()
    return [w for w, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def write_vocab(tokens: list[str], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")


def build_bpe(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` (GPT-2/Llama 3 style pre-tokenisation) with BPE_SPECIAL_TOKENS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BPE_SPECIAL_TOKENS,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok
