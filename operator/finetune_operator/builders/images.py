"""The runtime image of a job: spec.image, else the profile's default, `registry/repository:tag`.

The profile names the repository (profiles/*.yaml `imageRepository`); the operator's config file names the
registry and the tag for every profile at once (`images: {registry, tag}`, the chart's `runtimeImages`).
An empty registry means none (the image name as the repository gives it); an empty tag means the operator's own
version, the repository's VERSION, which is the tag `make image-*` builds (mk/images.mk). So `ftjob render`
without a config and the operator with the chart's defaults name the same images.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from .. import __version__

# Keys of the config file's `images:` block; the chart's ConfigMap template writes them (runtimeImages).
REGISTRY: Final = "registry"
TAG: Final = "tag"
# host[:port][/path], lower case, no trailing slash: what prefixes a repository in a Docker image reference
# (registry.example.com:5000/mirror, 123456789012.dkr.ecr.us-west-2.amazonaws.com). The chart's
# values.schema.json carries the same patterns (tests/chart/test_schema.py compares them).
REGISTRY_PATTERN: Final = r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
TAG_PATTERN: Final = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"


def default_image(repository: str, images: Mapping[str, Any] | None) -> str:
    """`registry/repository:tag` from a profile's repository and the config's `images` block."""
    config = images or {}
    registry = str(config.get(REGISTRY) or "")
    tag = str(config.get(TAG) or __version__)
    return f"{registry}/{repository}:{tag}" if registry else f"{repository}:{tag}"


def check_images_config(config: Mapping[str, Any]) -> list[str]:
    """Problems with the config file's `images:` block (the operator refuses to start with any)."""
    images = config.get("images")
    if images is None:
        return []
    if not isinstance(images, Mapping):
        return [f"images: expected a mapping with {REGISTRY} and {TAG}, got {images!r}"]
    out = [
        f"images.{key}: unknown key (known: {REGISTRY}, {TAG}). Each profile names its image repository "
        f"(imageRepository in operator/finetune_operator/profiles/*.yaml); the config sets only the registry "
        "and the tag they share. A job that needs another image sets spec.image."
        for key in images
        if key not in (REGISTRY, TAG)
    ]
    for key, pattern, example in (
        (REGISTRY, REGISTRY_PATTERN, "registry.example.com:5000/mirror"),
        (TAG, TAG_PATTERN, __version__),
    ):
        value = images.get(key)
        if value in (None, ""):
            continue
        if not isinstance(value, str) or not re.match(pattern, value):
            out.append(f"images.{key}: {value!r} is not a valid image {key} (e.g. {example!r})")
    return out
