"""Writes the release version (the repository's VERSION file, its one home) where a file must hold it literally:
the chart's Chart.yaml (version, appVersion) and the kustomize manifests (the app.kubernetes.io/version label and
the operator's image tag), which `kubectl apply -k` reads as they are.

    python3 hack/version.py          # rewrite the stale files (`make generate` runs this)
    python3 hack/version.py --check  # exit 1 naming every stale file (tests/unit/test_versions.py asserts it)

Everything else reads VERSION itself: the Python packages (setuptools' dynamic version, through the VERSION links
in operator/ and runtime/), the image tags (mk/images.mk, images/scripts/build.sh), and the runtime images' default
tag (the operator's own version, finetune_operator.__version__). The goldens under tests/unit/golden show the tag
because they are the builders' output for that version; `UPDATE_GOLDEN=1` rewrites them.
Standard library only: it runs before the venv exists.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION_FILE = ROOT / "VERSION"
CHART = ROOT / "charts" / "finetune-operator" / "Chart.yaml"
MANIFESTS = ROOT / "manifests"
# X.Y.Z: Helm wants SemVer 2 and Python PEP 440, and they spell pre-releases differently (1.0.0-rc.1, 1.0.0rc1).
VERSION_PATTERN = re.compile(r"^\d+\.\d+\.\d+$")

# (file pattern, line pattern): the group `v` is the version. Chart.yaml quotes appVersion (a string to Helm).
CHART_LINES = (
    re.compile(r"^(?P<k>version: )(?P<v>\S+)$", re.M),
    re.compile(r'^(?P<k>appVersion: ")(?P<v>[^"]+)(?=")', re.M),
)
MANIFEST_LINES = (
    re.compile(r'(?P<k>app\.kubernetes\.io/version: ")(?P<v>[^"]+)(?=")'),
    re.compile(r'(?P<k>image: "finetune-operator/operator:)(?P<v>[^"]+)(?=")'),
)


def read_version(path: Path = VERSION_FILE) -> str:
    version = path.read_text(encoding="utf-8").strip()
    if not VERSION_PATTERN.match(version):
        raise SystemExit(f"{path}: {version!r} is not a release version (X.Y.Z)")
    return version


def stamped(text: str, patterns: tuple[re.Pattern[str], ...], version: str) -> str:
    for pattern in patterns:
        text = pattern.sub(lambda m: m["k"] + version, text)
    return text


def targets() -> dict[Path, tuple[re.Pattern[str], ...]]:
    """Every file that holds the version, with the patterns that find it there."""
    out: dict[Path, tuple[re.Pattern[str], ...]] = {CHART: CHART_LINES}
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if any(p.search(path.read_text(encoding="utf-8")) for p in MANIFEST_LINES):
            out[path] = MANIFEST_LINES
    return out


def stale(version: str) -> dict[Path, str]:
    """Files whose text differs from the stamped text, with that text."""
    out = {}
    for path, patterns in targets().items():
        text = path.read_text(encoding="utf-8")
        wanted = stamped(text, patterns, version)
        if wanted != text:
            out[path] = wanted
    return out


def main(argv: list[str]) -> int:
    version = read_version()
    files = stale(version)
    if "--check" in argv:
        for path in files:
            print(f"{path.relative_to(ROOT)} does not carry VERSION {version}: run `make generate`", file=sys.stderr)
        return 1 if files else 0
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {version} into {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
