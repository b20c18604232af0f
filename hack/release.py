"""The release: images and chart of the repository's VERSION, pushed to an OCI registry (`make release`).

    python3 hack/release.py previous      # the commit of the previous release (the upgrade tests start there)

See images/README.md ("Release") and charts/finetune-operator/README.md ("Upgrade").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART_DIR = Path("charts") / "finetune-operator"
# The chart's CRD before it became a template: the layout every cluster installed from a checkout runs.
CRDS_LAYOUT_FILE = CHART_DIR / "crds" / "finetunejobs.yaml"


def git(*args: str, root: Path = ROOT, check: bool = True) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip() if out.returncode == 0 else ""


def previous_release(root: Path = ROOT) -> str:
    """The commit the previous release was made from: what a cluster upgrading to this version runs now.

    The rule: VERSION names the release a commit belongs to, so the previous release is the last commit before
    VERSION took its current value, i.e. the parent of the newest commit that changed VERSION's value (or the
    tag v<previous version>, where one exists). While VERSION still holds the value it was introduced with
    (the first release: nothing was released before), it is the last commit whose chart installed the CRD
    from crds/, the layout of every cluster installed from a checkout until then.
    """
    current = git("show", "HEAD:VERSION", root=root)
    for commit in git("log", "--format=%H", "--", "VERSION", root=root).split():
        before = git("show", f"{commit}^:VERSION", root=root, check=False)
        if not before:
            break  # the commit that introduced VERSION
        if before != current:
            tag = git("rev-parse", "--verify", "--quiet", f"refs/tags/v{before}^{{commit}}", root=root, check=False)
            return tag or git("rev-parse", f"{commit}^", root=root)
    removed = git("log", "-1", "--format=%H", "--no-renames", "--diff-filter=D", "--", str(CRDS_LAYOUT_FILE), root=root)
    if not removed:
        raise SystemExit(f"no previous release: VERSION never changed and {CRDS_LAYOUT_FILE} was never removed")
    return git("rev-parse", f"{removed}^", root=root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("previous", help="print the commit of the previous release")
    args = parser.parse_args(argv)
    if args.command == "previous":
        print(previous_release())
    return 0


if __name__ == "__main__":
    sys.exit(main())
