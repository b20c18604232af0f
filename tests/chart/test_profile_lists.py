"""The hardware-profile list has one source, operator/finetune_operator/profiles/*.yaml. Every place that names
the profiles either derives the list or is checked against it here. The chart names none: its runtimeImages are
one registry and one tag for every profile (test_render.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import CHART

from finetune_operator import profiles
from finetune_operator.api.schema import PROFILES, SPEC

ROOT = Path(__file__).resolve().parents[2]
PROFILE_FILES = sorted(f.stem for f in (ROOT / "operator" / "finetune_operator" / "profiles").glob("*.yaml"))


def test_the_api_lists_exactly_the_profile_files() -> None:
    assert list(PROFILES) == PROFILE_FILES
    assert sorted(profiles.load_all()) == PROFILE_FILES
    assert all(profiles.get(name).name == name for name in PROFILE_FILES), "a profile's name: differs from its file"


def test_chart_values_name_no_profile() -> None:
    """One registry and one tag for every profile; the digests map is empty here and filled only in a released
    chart, by image repository (hack/release.py), never by profile."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["runtimeImages"] == {"registry": "", "tag": "", "digests": {}}


def test_templates_do_not_spell_the_list_out() -> None:
    for template in (CHART / "templates").glob("*"):
        text = template.read_text()
        assert not re.search(r'list\s+"(' + "|".join(map(re.escape, PROFILES)) + ')"', text), template


def test_crd_enum_and_description_name_every_profile() -> None:
    profile_field: dict[str, Any] = SPEC["properties"]["hardware"]["properties"]["profile"]
    assert profile_field["enum"] == PROFILE_FILES
    for name in PROFILE_FILES:
        assert name in profile_field["description"], f"spec.hardware.profile's description omits {name}"


@pytest.mark.parametrize("doc", ["README.md"])
def test_profile_tables_have_a_row_for_every_profile(doc: str) -> None:
    text = (ROOT / doc).read_text()
    table = text[text.index("## What it derives, per profile") :]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {m for row in rows for m in re.findall(r"`([a-z0-9-]+)`", row.split("|")[1])}
    assert named >= set(PROFILE_FILES), f"{doc}: no row for {sorted(set(PROFILE_FILES) - named)}"
