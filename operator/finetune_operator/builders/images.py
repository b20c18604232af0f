"""The runtime image of a job: spec.image, else the profile's default, `registry/repository:tag`, or
`registry/repository@sha256:...` where the config pins the repository's digest.

The profile's stack names the repository (profiles/*.yaml `stacks.<name>.imageRepository`); the operator's config
file names the registry and the tag for every profile at once (`images: {registry, tag}`, the chart's `runtimeImages`).
An empty registry means none (the image name as the repository gives it); an empty tag means the operator's own
version, the repository's VERSION, which is the tag `make image-*` builds (mk/images.mk). So `ftjob render`
without a config and the operator with the chart's defaults name the same images.

`images.digests` maps a repository to the digest `make release` pushed it with (hack/release.py writes them into
the released chart's `runtimeImages.digests`): a job then runs exactly that image, whatever the tag names later.
A repository without one falls back to the tag (a chart built by hand, a flavor the release skipped).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from .. import __version__

# Keys of the config file's `images:` block; the chart's ConfigMap template writes them (runtimeImages).
REGISTRY: Final = "registry"
TAG: Final = "tag"
DIGESTS: Final = "digests"
# host[:port][/path], lower case, no trailing slash: what prefixes a repository in a Docker image reference
# (registry.example.com:5000/mirror, 123456789012.dkr.ecr.us-west-2.amazonaws.com). The chart's
# values.schema.json carries the same patterns (tests/chart/test_schema.py compares them).
REGISTRY_PATTERN: Final = r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
TAG_PATTERN: Final = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
# What a registry names a manifest by; the only algorithm registries serve and `docker push` prints.
DIGEST_PATTERN: Final = r"^sha256:[a-f0-9]{64}$"


def default_image(repository: str, images: Mapping[str, Any] | None) -> str:
    """`registry/repository:tag`, or `registry/repository@digest` when the config pins the repository's digest,
    from a profile's repository and the config's `images` block."""
    config = images or {}
    registry = str(config.get(REGISTRY) or "")
    name = f"{registry}/{repository}" if registry else repository
    digest = (config.get(DIGESTS) or {}).get(repository)
    if digest:
        return f"{name}@{digest}"
    return f"{name}:{config.get(TAG) or __version__}"


def check_images_config(config: Mapping[str, Any]) -> list[str]:
    """Problems with the config file's `images:` block (the operator refuses to start with any)."""
    images = config.get("images")
    if images is None:
        return []
    if not isinstance(images, Mapping):
        return [f"images: expected a mapping with {REGISTRY} and {TAG}, got {images!r}"]
    out = [
        f"images.{key}: unknown key (known: {REGISTRY}, {TAG}, {DIGESTS}). Each profile names its image repository "
        f"(imageRepository in operator/finetune_operator/profiles/*.yaml); the config sets only the registry "
        "and the tag they share, and the digests `make release` pushed. A job that needs another image sets "
        "spec.image."
        for key in images
        if key not in (REGISTRY, TAG, DIGESTS)
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
    return out + _check_digests(images.get(DIGESTS))


def _check_digests(digests: object) -> list[str]:
    if digests in (None, {}):
        return []
    if not isinstance(digests, Mapping):
        return [f"images.{DIGESTS}: expected a mapping of image repository to digest, got {digests!r}"]
    from ..profiles import load_all

    known = sorted({s.image_repository for p in load_all().values() for s in p.stacks.values()})
    out = []
    for repository, digest in digests.items():
        if repository not in known:
            out.append(
                f"images.{DIGESTS}.{repository}: not the image repository of any profile's stack "
                f"(known: {', '.join(known)})"
            )
        if not isinstance(digest, str) or not re.match(DIGEST_PATTERN, digest):
            out.append(f"images.{DIGESTS}.{repository}: {digest!r} is not an image digest (sha256:<64 hex digits>)")
    return out
