"""The release: images and chart of the repository's VERSION, pushed to an OCI registry (`make release`).

    python3 hack/release.py release --registry HOST[:PORT][/PREFIX] [--images operator,cpu,...]
    python3 hack/release.py previous      # the commit of the previous release (the upgrade tests start there)

`release` builds each image with images/scripts/build.sh for one explicit platform (linux/amd64), tags it
REGISTRY/finetune-operator/FLAVOR:VERSION, pushes it and takes the digest the registry answered; then it packages
a copy of the chart whose values name every pushed image by that digest (operator.image.digest,
runtimeImages.digests: a tag can never drift under a released chart) and pushes it to oci://REGISTRY/charts.
What it pushed is recorded in _out/release/VERSION/release.json, next to the packaged chart. The clients must be
logged in already (docker login, helm registry login); a registry with a private CA takes --ca-file for helm
(Docker trusts /etc/docker/certs.d/HOST/ca.crt, and treats 127.0.0.0/8 as insecure).

See images/README.md ("Release") and charts/finetune-operator/README.md ("Upgrade").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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


# Every flavor images/scripts/build.sh builds, in release order (the operator first: the chart needs it).
FLAVORS = ("operator", "cpu", "nvidia", "xeon-upstream", "xeon", "neuron", "neuron-native")
# Flavors whose build needs a vendor repository this project's build machines cannot reach (Intel's IPEX wheel
# index, the Neuron apt and pip repositories and an Ubuntu base): released only with --all (RELEASE_ALL=1) on a
# machine that reaches them.
VENDOR_FLAVORS = {
    "xeon": "needs Intel's wheel index (torch 2.7 + IPEX 2.7 + oneccl_bind_pt)",
    "neuron": "needs the Neuron apt and pip repositories and an Ubuntu 24.04 base image",
    "neuron-native": "needs the Neuron apt and pip repositories and an Ubuntu 26.04 base image",
}
# The one platform a release publishes. A second one needs a multi-platform index (one tag, a manifest per
# architecture), which this command does not make yet; arm64 builds need emulation on an amd64 host
# (images/scripts/platform-check.sh says why, images/README.md "Platforms").
PLATFORMS = ("linux/amd64",)
# host[:port][/path], as the operator's config accepts (builders/images.py REGISTRY_PATTERN; a test compares).
REGISTRY_PATTERN = r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})", re.I)
OPERATOR_REPOSITORY = "finetune-operator/operator"


def read_version(root: Path = ROOT) -> str:
    """VERSION, checked by hack/version.py (the one generator of the version), loaded from its file."""
    spec = importlib.util.spec_from_file_location("ftjob_version", root / "hack" / "version.py")
    assert spec is not None and spec.loader is not None
    version = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(version)
    return str(version.read_version(root / "VERSION"))


def run(cmd: list[str], **kw: object) -> str:
    """Runs a command, its output streamed to stderr and kept; exits with it when the command fails."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)  # type: ignore[call-overload]
    sys.stderr.write(proc.stdout[-6000:])
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} exited {proc.returncode}: {' '.join(cmd)}")
    return str(proc.stdout)


def plan_flavors(requested: list[str], release_all: bool) -> tuple[list[str], dict[str, str]]:
    """The flavors to release and those skipped (with why): every unknown name is refused."""
    unknown = [f for f in requested if f not in FLAVORS]
    if unknown:
        raise SystemExit(f"--images: unknown flavor(s) {', '.join(unknown)} (known: {', '.join(FLAVORS)})")
    if OPERATOR_REPOSITORY.split("/")[1] not in requested:
        raise SystemExit("--images: the operator image is part of every release (the chart runs it)")
    skipped = {f: VENDOR_FLAVORS[f] for f in requested if f in VENDOR_FLAVORS and not release_all}
    return [f for f in FLAVORS if f in requested and f not in skipped], skipped


def set_values(
    text: str, operator_repository: str, operator_digest: str, registry: str, digests: dict[str, str]
) -> str:
    """values.yaml with the release's image references, comments kept: each line is replaced where the chart's
    values.yaml has it (under operator.image and runtimeImages); a layout this does not know is refused."""
    replacements = [
        (r"^(    repository: )finetune-operator/operator$", operator_repository),
        (r'^(    digest: )""$', json.dumps(operator_digest)),
        (r'^(  registry: )""$', json.dumps(registry)),
        (r"^(  digests: )\{\}$", json.dumps(dict(sorted(digests.items())))),
    ]
    for pattern, value in replacements:
        text, n = re.subn(pattern, r"\g<1>" + value.replace("\\", "\\\\"), text, flags=re.M)
        if n != 1:
            raise SystemExit(f"values.yaml: expected one line matching {pattern!r}, found {n}")
    return text


def release(args: argparse.Namespace) -> dict[str, object]:
    version = read_version()
    registry = args.registry.rstrip("/")
    if not re.match(REGISTRY_PATTERN, registry):
        raise SystemExit(
            f"REGISTRY={args.registry!r}: expected host[:port][/prefix] in lower case, no scheme "
            "(e.g. registry.example.com:5000/ml)"
        )
    if args.platform not in PLATFORMS:
        raise SystemExit(
            f"PLATFORM={args.platform}: a release publishes {', '.join(PLATFORMS)} only. An arm64 image under the "
            "same tag needs a multi-platform index, which this release does not make yet, and an arm64 build on "
            "this amd64 host needs QEMU user emulation (images/scripts/platform-check.sh linux/arm64 says whether "
            "this Docker daemon has it); `make image-operator PLATFORM=linux/arm64` builds one image by hand."
        )
    flavors, skipped = plan_flavors(args.images.split(","), args.all)
    for flavor, why in skipped.items():
        print(f"skipping {flavor}: {why}; RELEASE_ALL=1 on a machine that reaches it", file=sys.stderr)
    out = Path(args.out) / version
    out.mkdir(parents=True, exist_ok=True)
    docker = args.docker or os.environ.get("DOCKER") or shutil.which("docker") or "docker"
    env = {**os.environ, "PLATFORM": args.platform, "IMAGE_TAG": version}
    images: dict[str, dict[str, str]] = {}
    for flavor in flavors:
        local = f"finetune-operator/{flavor}:{version}"
        if not args.no_build:
            run([str(ROOT / "images" / "scripts" / "build.sh"), flavor], env=env)
        repository = f"finetune-operator/{flavor}"
        remote = f"{registry}/{repository}:{version}"
        run([docker, "tag", local, remote])
        pushed = run([docker, "push", remote])
        found = DIGEST.findall(pushed)
        if not found:
            raise SystemExit(f"docker push {remote}: no digest in its output")
        images[repository] = {"image": f"{registry}/{repository}", "tag": version, "digest": found[-1]}

    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / CHART_DIR.name
        shutil.copytree(ROOT / CHART_DIR, chart)
        values = chart / "values.yaml"
        operator = images[OPERATOR_REPOSITORY]
        runtime = {repo: i["digest"] for repo, i in images.items() if repo != OPERATOR_REPOSITORY}
        values.write_text(set_values(values.read_text(), operator["image"], operator["digest"], registry, runtime))
        for old in out.glob(f"{CHART_DIR.name}-*.tgz"):
            old.unlink()
        run([args.helm, "package", str(chart), "--destination", str(out)])
    (tgz,) = out.glob(f"{CHART_DIR.name}-{version}.tgz")
    ca = ["--ca-file", args.ca_file] if args.ca_file else []
    pushed = run([args.helm, "push", str(tgz), f"oci://{registry}/charts", *ca])
    found = DIGEST.findall(pushed)
    if not found:
        raise SystemExit("helm push: no digest in its output")
    record: dict[str, object] = {
        "version": version,
        "registry": registry,
        "platform": args.platform,
        "images": images,
        "skipped": skipped,
        "chart": {"ref": f"oci://{registry}/charts/{CHART_DIR.name}", "version": version, "digest": found[-1]},
        "chartPackage": str(tgz),
    }
    (out / "release.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"released {version} to {registry}: {out / 'release.json'}", file=sys.stderr)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("previous", help="print the commit of the previous release")
    r = sub.add_parser("release", help="build, push and record the images and the chart of VERSION")
    r.add_argument("--registry", required=True, help="host[:port][/prefix]")
    r.add_argument("--images", default=",".join(FLAVORS), help="comma-separated flavors (operator always)")
    r.add_argument("--all", action="store_true", help="also the flavors that need vendor repositories")
    r.add_argument("--platform", default="linux/amd64")
    r.add_argument("--no-build", action="store_true", help="push finetune-operator/FLAVOR:VERSION as built")
    r.add_argument("--docker", help="Docker CLI (default: $DOCKER, else docker on PATH)")
    r.add_argument("--helm", default="helm")
    r.add_argument("--ca-file", help="CA bundle helm trusts for the registry")
    r.add_argument("--out", default=str(ROOT / "_out" / "release"))
    args = parser.parse_args(argv)
    if args.command == "previous":
        print(previous_release())
    elif args.command == "release":
        release(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
