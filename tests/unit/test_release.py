"""hack/release.py's pure parts: which flavors a release builds, the released chart's values, what it refuses.
The release itself (build, push, chart by digest) runs against a real registry in tests/registry/test_release.py."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from finetune_operator.builders import images

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def release_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", ROOT / "hack" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_registry_pattern_is_the_operators() -> None:
    """A registry the release accepts is one the chart's runtimeImages.registry and the operator's config take."""
    assert release_module().REGISTRY_PATTERN == images.REGISTRY_PATTERN


def test_vendor_flavors_are_skipped_unless_asked_and_the_operator_is_always_released() -> None:
    release = release_module()
    flavors, skipped = release.plan_flavors(list(release.FLAVORS), False)
    assert flavors == ["operator", "cpu", "nvidia", "xeon-upstream"]
    assert sorted(skipped) == ["neuron", "neuron-native", "xeon"]
    assert release.plan_flavors(["cpu", "operator"], True) == (["operator", "cpu"], {})
    with pytest.raises(SystemExit, match="the operator image is part of every release"):
        release.plan_flavors(["cpu"], False)
    with pytest.raises(SystemExit, match=r"unknown flavor\(s\) gpu"):
        release.plan_flavors(["operator", "gpu"], False)


def test_released_values_name_every_pushed_image_by_digest_and_keep_the_comments() -> None:
    release = release_module()
    text = (ROOT / "charts" / "finetune-operator" / "values.yaml").read_text()
    out = release.set_values(
        text,
        "reg.example:5000/ml/finetune-operator/operator",
        DIGEST,
        "reg.example:5000/ml",
        {"finetune-operator/cpu": DIGEST},
    )
    values, original = yaml.safe_load(out), yaml.safe_load(text)
    assert values["operator"]["image"] == {
        **original["operator"]["image"],
        "repository": "reg.example:5000/ml/finetune-operator/operator",
        "digest": DIGEST,
    }
    assert values["runtimeImages"] == {
        "registry": "reg.example:5000/ml",
        "tag": "",
        "digests": {"finetune-operator/cpu": DIGEST},
    }
    # Everything else is the chart's own, comments included.
    assert {k: v for k, v in values.items() if k not in ("operator", "runtimeImages")} == {
        k: v for k, v in original.items() if k not in ("operator", "runtimeImages")
    }
    assert out.count("\n#") == text.count("\n#") and out.count("# --") == text.count("# --")
    with pytest.raises(SystemExit, match="expected one line matching"):
        release.set_values(text.replace("  digests: {}\n", ""), "r/o", DIGEST, "r", {})


@pytest.mark.parametrize(
    ("registry", "platform", "message"),
    [
        ("https://reg.example", "linux/amd64", "expected host[:port][/prefix]"),
        ("Reg.Example", "linux/amd64", "expected host[:port][/prefix]"),
        ("reg.example:5000", "linux/arm64", "PLATFORM=linux/arm64: a release publishes linux/amd64 only"),
    ],
)
def test_release_refuses_before_building(registry: str, platform: str, message: str, tmp_path: Path) -> None:
    args = argparse.Namespace(
        registry=registry, platform=platform, images="operator", all=False, out=str(tmp_path), no_build=True
    )
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        release_module().release(args)
    assert not list(tmp_path.iterdir())


def test_every_stacks_image_is_a_released_flavor_and_can_be_pinned_by_digest() -> None:
    """A non-default stack's repository (xeon-amx ipex, trn2 native) is released and pinned like a default's."""
    from finetune_operator import profiles

    flavors = release_module().FLAVORS
    for profile in profiles.load_all().values():
        for stack in profile.stacks.values():
            repository = stack.image_repository
            assert repository.removeprefix("finetune-operator/") in flavors, f"{profile.name}/{stack.name}"
            config = {"images": {"digests": {repository: DIGEST}}}
            assert images.check_images_config(config) == [], f"{profile.name}/{stack.name}"
