"""The hardware-profile list has one source, operator/finetune_operator/profiles/*.yaml. Every place that names
the profiles either derives the list or is checked against it here (the rendered ConfigMap and NOTES.txt: in
test_render.py, against the same profiles)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from chartlib import CHART

from finetune_operator import profiles
from finetune_operator.api.schema import PROFILES, SPEC

ROOT = Path(__file__).resolve().parents[2]
PROFILE_FILES = sorted(f.stem for f in (ROOT / "operator" / "finetune_operator" / "profiles").glob("*.yaml"))


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("profile_lists", ROOT / "hack" / "profile_lists.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_api_lists_exactly_the_profile_files() -> None:
    assert list(PROFILES) == PROFILE_FILES
    assert sorted(profiles.load_all()) == PROFILE_FILES
    assert all(profiles.get(name).name == name for name in PROFILE_FILES), "a profile's name: differs from its file"


def test_values_schema_is_generated_from_the_profiles() -> None:
    gen = generator()
    current = gen.VALUES_SCHEMA.read_text()
    assert gen.values_schema(current) == current, "values.schema.json is stale: run `make generate`"
    images = yaml.safe_load(current)["properties"]["runtimeImages"]
    assert images["required"] == PROFILE_FILES


def test_a_new_profile_file_makes_the_generated_schema_stale() -> None:
    """What the test above catches when someone adds profiles/tpu.yaml and forgets `make generate`."""
    gen = generator()
    current = gen.VALUES_SCHEMA.read_text()
    with_tpu = gen.values_schema(current, [*PROFILES, "tpu"])
    assert with_tpu != current
    assert "tpu" in yaml.safe_load(with_tpu)["properties"]["runtimeImages"]["required"]


def test_chart_values_name_an_image_for_every_profile() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert sorted(k for k in values["runtimeImages"] if k != "tag") == PROFILE_FILES
    for name, image in values["runtimeImages"].items():
        if name != "tag":
            assert profiles.get(name).image.split(":")[0] == image, f"runtimeImages.{name} is not the profile's image"


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
