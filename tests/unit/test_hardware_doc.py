"""Hardware facts have one public home, docs/hardware.md, and every file cites only what a reader of this
repository has: its own files and public URLs, never a path outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "hardware.md"
PROFILES = sorted((ROOT / "operator" / "finetune_operator" / "profiles").glob("*.yaml"))
# Paths of the machines the repository was written on. Spelt in pieces so that this file does not match itself.
OUTSIDE = re.compile("|".join(["/" + "work/", r"\.\./" + "shared/", "shared/" + "notes/"]))
CITATION = re.compile(r"\[(\d+)(?:-(\d+))?\]")


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def text_of(path: Path) -> str | None:
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def sources() -> set[int]:
    text = DOC.read_text()
    listed = text[text.index("## Sources") :]
    return {int(n) for n in re.findall(r"^(\d+)\. https://", listed, re.M)}


def cited(text: str) -> set[int]:
    out: set[int] = set()
    for m in CITATION.finditer(text):
        first, last = int(m[1]), int(m[2] or m[1])
        out |= set(range(first, last + 1))
    return out


def test_no_file_cites_a_path_outside_the_repository() -> None:
    found = []
    for path in tracked():
        text = text_of(path)
        if text is not None:
            found += [
                f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)
            ]
    assert found == [], "cite docs/hardware.md or a public URL instead"


def test_relative_links_in_docs_stay_inside_the_repository() -> None:
    broken = []
    for path in tracked():
        if path.suffix != ".md" or (text := text_of(path)) is None:
            continue
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_source_is_a_public_url() -> None:
    text = DOC.read_text()
    listed = text[text.index("## Sources") :]
    numbered = re.findall(r"^(\d+)\. (.*)$", listed, re.M)
    assert [int(n) for n, _ in numbered] == list(range(1, len(numbered) + 1)), "sources are numbered 1..n"
    for n, line in numbered:
        assert line.startswith("https://"), f"[{n}] {line}"


def test_the_doc_cites_only_listed_sources() -> None:
    text = DOC.read_text()
    assert cited(text[: text.index("## Sources")]) <= sources()


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_profile_citations_resolve_in_the_doc(profile: Path) -> None:
    text = profile.read_text()
    numbers = cited(text)
    if numbers:
        assert "docs/hardware.md" in text, f"{profile.name} cites [n] without naming docs/hardware.md"
    assert numbers <= sources(), f"{profile.name} cites {sorted(numbers - sources())}, not in docs/hardware.md"


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_every_instance_type_is_in_the_doc(profile: Path) -> None:
    """A profile's instance table is the doc's (the doc may list more); cpu's plain instances need no facts."""
    if profile.stem == "cpu":
        return
    names = re.findall(r"^  ([a-z0-9]+\.[a-z0-9-]+):\s*\{", profile.read_text(), re.M)
    doc = DOC.read_text()
    missing = [n for n in names if not re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w.-])", doc)]
    assert missing == [], f"{profile.name}: {missing} not in docs/hardware.md"
