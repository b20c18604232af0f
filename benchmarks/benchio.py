"""What every benchmark script writes with --json: the result document, pretty-printed, folders made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path | None, doc: Any) -> None:
    """Write `doc` to `path` (nothing when the script was given no --json)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
