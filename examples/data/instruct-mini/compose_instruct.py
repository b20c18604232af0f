"""Writes train.jsonl / validation.jsonl: short instruction chats we wrote ourselves, for the causal-lm task.

Each row is {"messages": [{"role", "content"}, ...]}: a user instruction and the assistant's answer, some with a
system turn, some with two exchanges. The answers follow fixed patterns (arithmetic, opposites, invented capitals,
plurals) so a tiny model can learn them in a few steps. Validation rows are combinations train never shows.
Deterministic: running it again rewrites the same bytes (tests/runtime/test_samples.py checks).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
           "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("light", "dark"),
             ("early", "late"), ("open", "closed"), ("full", "empty"), ("old", "new"), ("high", "low"),
             ("wet", "dry"), ("loud", "quiet"), ("hard", "soft"), ("near", "far"), ("rich", "poor"),
             ("strong", "weak")]
# Invented countries and capitals: nothing a pretrained model could already know.
CAPITALS = [("Norland", "Vesk"), ("Ostria", "Palen"), ("Caldera", "Mirro"), ("Tembia", "Oskar"),
            ("Velmar", "Durn"), ("Quessa", "Lotha"), ("Brannic", "Fell"), ("Sorvia", "Ament"),
            ("Ketland", "Rusk"), ("Ameda", "Tolle"), ("Pirell", "Hanse"), ("Zunder", "Corra")]
PLURALS = [("cat", "cats"), ("box", "boxes"), ("child", "children"), ("mouse", "mice"), ("city", "cities"),
           ("leaf", "leaves"), ("tooth", "teeth"), ("bus", "buses"), ("foot", "feet"), ("baby", "babies"),
           ("knife", "knives"), ("goose", "geese"), ("dish", "dishes"), ("person", "people")]


def _chat(user: str, answer: str, system: bool) -> list[dict[str, str]]:
    turns = [{"role": "system", "content": SYSTEM}] if system else []
    return [*turns, {"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def examples() -> list[tuple[str, list[dict[str, str]]]]:
    """(kind, messages) for every row, train and validation together, in a fixed order."""
    out: list[tuple[str, list[dict[str, str]]]] = []
    for a in range(10):
        for b in range(10):
            if a + b < len(NUMBERS) and (a * 7 + b) % 3 == 0:
                out.append(("add", _chat(f"What is {NUMBERS[a]} plus {NUMBERS[b]}?",
                                         f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is {NUMBERS[a + b]}.",
                                         system=(a + b) % 2 == 0)))
    for i, (w, o) in enumerate(OPPOSITES):
        out.append(("opposite", _chat(f"What is the opposite of {w}?", f"The opposite of {w} is {o}.", i % 3 == 0)))
        out.append(("opposite", _chat(f"What is the opposite of {o}?", f"The opposite of {o} is {w}.", i % 3 == 1)))
    for i, (c, cap) in enumerate(CAPITALS):
        out.append(("capital", _chat(f"What is the capital of {c}?", f"The capital of {c} is {cap}.", i % 2 == 0)))
        out.append(("capital", _chat(f"Which country has {cap} as its capital?", f"{cap} is the capital of {c}.",
                                     i % 2 == 1)))
    for i, (s, p) in enumerate(PLURALS):
        out.append(("plural", _chat(f"What is the plural of {s}?", f"The plural of {s} is {p}.", i % 2 == 0)))
    # Two exchanges in one conversation: both assistant turns are trained on.
    for i, ((w, o), (c, cap)) in enumerate(zip(OPPOSITES, CAPITALS, strict=False)):
        out.append(("two-turns", [
            {"role": "user", "content": f"What is the opposite of {w}?"},
            {"role": "assistant", "content": f"The opposite of {w} is {o}."},
            {"role": "user", "content": f"What is the capital of {c}?"},
            {"role": "assistant", "content": f"The capital of {c} is {cap}."},
        ] if i % 2 == 0 else [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is the capital of {c}?"},
            {"role": "assistant", "content": f"The capital of {c} is {cap}."},
            {"role": "user", "content": f"And the opposite of {w}?"},
            {"role": "assistant", "content": f"The opposite of {w} is {o}."},
        ]))
    return out


def split(rows: list[tuple[str, list[dict[str, str]]]]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Every seventh row of each kind is held out for validation."""
    train: list[dict[str, object]] = []
    val: list[dict[str, object]] = []
    seen: dict[str, int] = {}
    for kind, messages in rows:
        n = seen[kind] = seen.get(kind, -1) + 1
        (val if n % 7 == 3 else train).append({"kind": kind, "messages": messages})
    return train, val


def render(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main() -> None:
    train, val = split(examples())
    (HERE / "train.jsonl").write_text(render(train), encoding="utf-8")
    (HERE / "validation.jsonl").write_text(render(val), encoding="utf-8")
    print(f"wrote {len(train)} train and {len(val)} validation conversations to {HERE}")


if __name__ == "__main__":
    main()
