"""A profile's image has one home: its `imageRepository`. The operator's config adds the registry and the tag for
every profile at once (builders/images.py); the chart, the manifests and the runtime name no profile's image."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from finetune_operator import __version__, profiles
from finetune_operator.builders.images import check_images_config, default_image
from finetune_runtime.backends import IMAGES

ROOT = Path(__file__).resolve().parents[2]
# What images/scripts/build.sh tags a flavour's image with (images/<flavour>/Dockerfile).
BUILT = {f"finetune-operator/{d.parent.name}" for d in (ROOT / "images").glob("*/Dockerfile")}


@pytest.mark.parametrize("name", sorted(profiles.load_all()))
def test_profile_names_a_repository_the_images_build(name: str) -> None:
    profile = profiles.get(name)
    assert profile.image_repository in BUILT, (
        f"{name}: no images/<flavour>/Dockerfile builds {profile.image_repository}"
    )
    assert ":" not in profile.image_repository and "@" not in profile.image_repository, "the config sets the tag"
    # The runtime's "use the ... image" messages name the same repository for the profile's backend.
    assert IMAGES[profile.backend] == profile.image_repository


def test_chart_and_manifests_name_no_profile_image() -> None:
    repositories = {p.image_repository for p in profiles.load_all().values()}
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
