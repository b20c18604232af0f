"""SQuAD: the v1.1 metric (exact match / F1), feature preparation with doc stride, logits -> answer text.

The metric follows the definition of the official SQuAD v1.1 evaluation (normalise: lower case, strip
punctuation and English articles, collapse whitespace; token-overlap F1; max over gold answers). It is
implemented here so nothing is downloaded at run time.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1(prediction: str, truth: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(truth).split()
    if not pred_tokens or not truth_tokens:
        # Both empty is a match; one empty is not (matters for answers made only of articles/punctuation).
        return float(pred_tokens == truth_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(truth_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: dict[str, str], references: dict[str, Sequence[str]]) -> dict[str, float]:
    """Percentages (0-100) like the official script; an id without prediction scores 0."""
    if not references:
        raise ValueError("no references to score against")
    em_total = f1_total = 0.0
    for qid, golds in references.items():
        pred = predictions.get(qid, "")
        em_total += max(exact_match(pred, g) for g in golds)
        f1_total += max(f1(pred, g) for g in golds)
    n = len(references)
    return {"exact_match": 100.0 * em_total / n, "f1": 100.0 * f1_total / n}


# --- features ---------------------------------------------------------------------------------------------


def _pad_right(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "padding_side", "right") == "right")


def _windows(
    examples: dict[str, list[Any]],
    tokenizer: Any,
    max_length: int,
    doc_stride: int,
    question_col: str,
    context_col: str,
) -> tuple[bool, Any]:
    """(question, context) pairs tokenised into overlapping windows of the context, with offsets; the context
    goes second unless the tokenizer pads on the left."""
    pad_right = _pad_right(tokenizer)
    questions = [q.lstrip() for q in examples[question_col]]
    contexts = examples[context_col]
    enc = tokenizer(
        questions if pad_right else contexts,
        contexts if pad_right else questions,
        truncation="only_second" if pad_right else "only_first",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )
    return pad_right, enc


def prepare_train_features(
    examples: dict[str, list[Any]],
    tokenizer: Any,
    max_length: int,
    doc_stride: int,
    question_col: str,
    context_col: str,
    answers_col: str,
) -> dict[str, Any]:
    """Tokenise (question, context) with overflow windows; label each window with token start/end positions
    of the first answer, or the CLS position when the answer is not inside the window."""
    pad_right, enc = _windows(examples, tokenizer, max_length, doc_stride, question_col, context_col)
    sample_map = enc.pop("overflow_to_sample_mapping")
    offsets_all = enc.pop("offset_mapping")
    starts: list[int] = []
    ends: list[int] = []
    ctx_id = 1 if pad_right else 0
    for i, offsets in enumerate(offsets_all):
        input_ids = enc["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
        seq_ids = enc.sequence_ids(i)
        answers = examples[answers_col][sample_map[i]]
        if not answers["answer_start"]:
            starts.append(cls_index)
            ends.append(cls_index)
            continue
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        tok_start = 0
        while seq_ids[tok_start] != ctx_id:
            tok_start += 1
        tok_end = len(input_ids) - 1
        while seq_ids[tok_end] != ctx_id:
            tok_end -= 1
        if not (offsets[tok_start][0] <= start_char and offsets[tok_end][1] >= end_char):
            starts.append(cls_index)
            ends.append(cls_index)
            continue
        while tok_start < len(offsets) and offsets[tok_start][0] <= start_char:
            tok_start += 1
        starts.append(tok_start - 1)
        while offsets[tok_end][1] >= end_char:
            tok_end -= 1
        ends.append(tok_end + 1)
    enc["start_positions"] = starts
    enc["end_positions"] = ends
    return dict(enc)


def prepare_eval_features(
    examples: dict[str, list[Any]],
    tokenizer: Any,
    max_length: int,
    doc_stride: int,
    question_col: str,
    context_col: str,
    id_col: str = "id",
) -> dict[str, Any]:
    """Like the train features, but keep for each window its example id and the offsets of context tokens
    only (None elsewhere) so post-processing can map logits back to character spans."""
    pad_right, enc = _windows(examples, tokenizer, max_length, doc_stride, question_col, context_col)
    sample_map = enc.pop("overflow_to_sample_mapping")
    ctx_id = 1 if pad_right else 0
    example_ids = []
    offset_maps = []
    for i in range(len(enc["input_ids"])):
        seq_ids = enc.sequence_ids(i)
        example_ids.append(examples[id_col][sample_map[i]])
        offset_maps.append([o if seq_ids[k] == ctx_id else None for k, o in enumerate(enc["offset_mapping"][i])])
    enc["offset_mapping"] = offset_maps
    enc["example_id"] = example_ids
    return dict(enc)


def postprocess_predictions(
    examples: Iterable[dict[str, Any]],
    features: Sequence[dict[str, Any]],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    context_col: str,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> dict[str, str]:
    """Best valid span per example over all of its windows (score = start logit + end logit)."""
    if len(features) != len(start_logits):
        raise ValueError(f"{len(features)} features but {len(start_logits)} logit rows")
    by_example: dict[str, list[int]] = collections.defaultdict(list)
    for i, feat in enumerate(features):
        by_example[feat["example_id"]].append(i)
    out: dict[str, str] = {}
    for ex in examples:
        context = ex[context_col]
        best_text, best_score = "", -np.inf
        for fi in by_example.get(ex["id"], []):
            offsets = features[fi]["offset_mapping"]
            s_log, e_log = start_logits[fi], end_logits[fi]
            s_idx = np.argsort(s_log)[-1 : -n_best - 1 : -1]
            e_idx = np.argsort(e_log)[-1 : -n_best - 1 : -1]
            for s in s_idx:
                for e in e_idx:
                    if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    score = float(s_log[s] + e_log[e])
                    if score > best_score:
                        best_score = score
                        best_text = context[offsets[s][0] : offsets[e][1]]
        out[ex["id"]] = best_text
    return out
