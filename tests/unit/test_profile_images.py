"""A stack's image has one home: its profile's `stacks.<name>.imageRepository`. The operator's config adds the
registry and the tag for every profile at once (builders/images.py); the chart, the manifests and the runtime name
no profile's image. Each stack names a runtime backend whose own facts (image, compile cache) agree with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from finetune_operator import __version__, profiles
from finetune_operator.builders.images import check_images_config, default_image
from finetune_runtime.backends import BACKENDS, IMAGES

ROOT = Path(__file__).resolve().parents[2]
# What images/scripts/build.sh tags each flavour's image with: finetune-operator/FLAVOR, for the flavours of its
# `case "$flavor"` (images/<flavour>/Dockerfile, or a build ARG of another's: xeon-upstream).
_BUILD_SH = (ROOT / "images" / "scripts" / "build.sh").read_text()
_CASE = _BUILD_SH[_BUILD_SH.index('case "$flavor" in') : _BUILD_SH.index("esac")]
BUILT = {f"finetune-operator/{f}" for arm in re.findall(r"^  ([a-z|-]+)\)", _CASE, re.M) for f in arm.split("|")}
STACKS = [(p.name, s.name) for p in profiles.load_all().values() for s in p.stacks.values()]


def test_build_sh_flavours_are_read() -> None:
    assert {"finetune-operator/xeon-upstream", "finetune-operator/neuron-native", "finetune-operator/cpu"} <= BUILT


@pytest.mark.parametrize(("name", "stack"), STACKS, ids=lambda x: str(x))
def test_each_stack_names_a_repository_the_images_build(name: str, stack: str) -> None:
    s = profiles.get(name).stacks[stack]
    assert s.image_repository in BUILT, f"{name}/{stack}: images/scripts/build.sh builds no {s.image_repository}"
    assert ":" not in s.image_repository and "@" not in s.image_repository, "the config sets the tag"
    # The runtime backend exists, and its "use the ... image" messages name the stack's repository.
    assert s.backend in BACKENDS, f"{name}/{stack}: no runtime backend {s.backend!r} (finetune_runtime/backends.py)"
    assert IMAGES[s.backend] == s.image_repository
    # The operator sets the compile cache variable the runtime backend reads (its precompile probe, status).
    if s.compile_cache:
        assert s.compile_cache.variable == BACKENDS[s.backend].compile_cache_var


def test_every_runtime_backend_is_some_stacks() -> None:
    used = {profiles.get(p).stacks[s].backend for p, s in STACKS}
    assert used == set(BACKENDS)


@pytest.mark.parametrize("name", sorted(profiles.load_all()))
def test_the_profiles_default_image_is_its_default_stacks(name: str) -> None:
    p = profiles.get(name)
    assert p.image_repository == p.stacks[p.default_stack].image_repository
    assert next(iter(p.stacks)) == p.default_stack  # listed first, as `kubectl explain` and the docs show them


def test_chart_and_manifests_name_no_profile_image() -> None:
    repositories = {s.image_repository for p in profiles.load_all().values() for s in p.stacks.values()}
    pattern = re.compile("|".join(re.escape(r) for r in sorted(repositories)))
    places = [ROOT / "charts" / "finetune-operator" / "values.yaml", *sorted((ROOT / "manifests").rglob("*.yaml"))]
    for place in places:
        assert not pattern.search(place.read_text()), f"{place.relative_to(ROOT)} names a profile's image"


def test_default_image_composes_registry_repository_and_tag() -> None:
    assert default_image("finetune-operator/neuron", None) == f"finetune-operator/neuron:{__version__}"
    assert default_image("finetune-operator/neuron", {"registry": "", "tag": ""}) == (
        f"finetune-operator/neuron:{__version__}"
    )
    ecr = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
    assert default_image("finetune-operator/neuron", {"registry": ecr, "tag": "sdk2.31"}) == (
        f"{ecr}/finetune-operator/neuron:sdk2.31"
    )


def test_config_check_refuses_a_per_profile_image_and_names_the_fix() -> None:
    (problem,) = check_images_config({"images": {"cpu": "registry.local/cpu:9"}})
    assert problem.startswith("images.cpu: unknown key (known: registry, tag, digests)")
    assert "imageRepository" in problem and "spec.image" in problem


DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_a_digest_pins_its_repository_and_the_others_keep_the_tag() -> None:
    images = {"registry": "registry.example:5000/ft", "tag": "handbuilt", "digests": {"finetune-operator/cpu": DIGEST}}
    assert default_image("finetune-operator/cpu", images) == f"registry.example:5000/ft/finetune-operator/cpu@{DIGEST}"
    assert (
        default_image("finetune-operator/nvidia", images)
        == "registry.example:5000/ft/finetune-operator/nvidia:handbuilt"
    )
    assert default_image("finetune-operator/cpu", {"digests": {"finetune-operator/cpu": DIGEST}}) == (
        f"finetune-operator/cpu@{DIGEST}"
    )
    assert check_images_config({"images": images}) == []


@pytest.mark.parametrize(
    ("digests", "field"),
    [
        ({"finetune-operator/cpu": "sha256:abc"}, "images.digests.finetune-operator/cpu"),
        ({"finetune-operator/cpu": DIGEST.upper()}, "images.digests.finetune-operator/cpu"),
        ({"finetune-operator/cpu": "0123456789abcdef" * 4}, "images.digests.finetune-operator/cpu"),
        ({"cpu": DIGEST}, "images.digests.cpu"),
        ([DIGEST], "images.digests"),
    ],
)
def test_config_check_refuses_malformed_digests(digests: object, field: str) -> None:
    (problem,) = check_images_config({"images": {"digests": digests}})
    assert problem.startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("images", "field"),
    [
        ({"registry": "https://registry.example"}, "images.registry"),
        ({"registry": "Registry.Example"}, "images.registry"),
        ({"registry": "registry.example/"}, "images.registry"),
        ({"tag": "a b"}, "images.tag"),
        ({"tag": 1}, "images.tag"),
        ("registry.example", "images"),
    ],
)
def test_config_check_refuses_malformed_registry_and_tag(images: object, field: str) -> None:
    (problem,) = check_images_config({"images": images})
    assert problem.startswith(f"{field}: ")


@pytest.mark.parametrize(
    "images",
    [None, {}, {"registry": "", "tag": ""}, {"registry": "localhost:5000/mirror/ft", "tag": "2026.12-dev_1"}],
)
def test_config_check_accepts(images: object) -> None:
    assert check_images_config({} if images is None else {"images": images}) == []


def test_the_stack_fields_description_names_every_profiles_stacks_and_default() -> None:
    """`kubectl explain`'s text for spec.hardware.stack is written by hand (the schema cannot import the
    profiles): it must say what the data says."""
    from finetune_operator.api.schema import HARDWARE

    text = " ".join(HARDWARE["properties"]["stack"]["description"].split())
    for p in profiles.load_all().values():
        assert p.name in text
        for s in p.stacks:
            assert re.search(rf"\b{re.escape(s)}\b", text), f"{p.name}/{s} not in spec.hardware.stack's description"
        if len(p.stacks) > 1:
            assert f"{p.default_stack} (the default" in text, f"{p.name}'s default {p.default_stack} not said"
