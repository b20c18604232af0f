"""YAML as Go reads it (kubectl, kustomize, Helm, the API server), for tests that compare what those tools render
with what the API server holds."""

from __future__ import annotations

import re
from typing import Any

import yaml


class Yaml12Loader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 floats such as `5e-05` (no dot), as Go's YAML (kubectl,
    kustomize, the API server) does. PyYAML follows YAML 1.1 and would read them as strings, so a
    CRD default re-emitted by kustomize would look different from the same default in the chart."""


Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def load_all_documents(text: str) -> list[Any]:
    """The non-empty documents of a multi-document YAML stream."""
    return [d for d in yaml.load_all(text, Loader=Yaml12Loader) if d]
