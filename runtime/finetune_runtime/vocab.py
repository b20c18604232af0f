"""`build-vocab`: a WordPiece vocab.txt trained on our own sample text.

The text is first split into words the same way the model's tokenizer will split it (MeCab + unidic-lite for
Japanese, BERT's BasicTokenizer for English), then WordPiece is trained on those words, so the resulting
vocab.txt fits BertJapaneseTokenizer (mecab + wordpiece) and BertTokenizer/DistilBertTokenizer respectively.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from finetune_runtime.tokenization import mecab_words

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def texts_from_files(files: Iterable[Path], fields: list[str]) -> Iterator[str]:
    """Text fields of jsonl rows, or of SQuAD JSON (contexts, questions, answers)."""
    for f in files:
        if f.suffix == ".jsonl":
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    yield from (str(row[k]) for k in fields if row.get(k))
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
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=1,
                                        continuing_subword_prefix="##")
    tok.train_from_iterator(corpus, trainer=trainer)
    vocab = tok.get_vocab()
    return [w for w, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def write_vocab(tokens: list[str], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
