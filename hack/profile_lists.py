"""Writes the hardware-profile list where a file must hold it literally: the chart's values.schema.json
(`runtimeImages` requires one image per profile and accepts no other key). The list comes from
operator/finetune_operator/profiles/*.yaml (`finetune_operator.api.schema.PROFILES`).

    python hack/profile_lists.py          # rewrite the files (`make generate` runs this)
    python hack/profile_lists.py --check  # exit 1 when a file is stale (what the drift test asserts)

Templates and docs do not repeat the list: the chart's NOTES.txt and configmap.yaml range over
`.Values.runtimeImages`, whose keys this schema pins.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from finetune_operator.api.schema import PROFILES

ROOT = Path(__file__).resolve().parents[1]
VALUES_SCHEMA = ROOT / "charts" / "finetune-operator" / "values.schema.json"


def values_schema(current: str, profiles: Sequence[str] = PROFILES) -> str:
    """values.schema.json's text with `runtimeImages` listing exactly `profiles` (everything else kept)."""
    schema = json.loads(current)
    images = schema["properties"]["runtimeImages"]
    images["description"] = (
        "Default runtime image for each hardware profile (operator/finetune_operator/profiles/*.yaml); "
        "every profile is required."
    )
    images["required"] = list(profiles)
    images["properties"] = {"tag": images["properties"]["tag"]} | {p: {"$ref": "#/definitions/image"} for p in profiles}
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str]) -> int:
    current = VALUES_SCHEMA.read_text()
    wanted = values_schema(current)
    if current == wanted:
        return 0
    if "--check" in argv:
        print(f"{VALUES_SCHEMA.relative_to(ROOT)} is stale: run `make generate`", file=sys.stderr)
        return 1
    VALUES_SCHEMA.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
