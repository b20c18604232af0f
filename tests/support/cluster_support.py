"""Types shared by the pytest fixtures (tests/conftest.py) and the tests that use them, and the kubectl runner the
fixtures, the tiers that start their own cluster and the benchmarks build on.

Kept here rather than in conftest.py so test modules import them by a unique module name."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Cluster:
    """What tests may rely on, whichever cluster backs the session."""

    kubeconfig: Path
    server: str
    # True for the LocalCluster this session started: its version is the pin and its logs are local files.
    local: bool
    logs: dict[str, Path] = field(default_factory=dict)
    # The LocalCluster's pki/ (ca.crt, kubelet-serving.crt/.key the API server trusts for a kubelet on
    # 127.0.0.1); None for an external cluster.
    pki: Path | None = None


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call; str() includes stderr so a pytest report shows kubectl's own words."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr:\n{self.stderr}"


# kubectl(*args, check=True, input=None, timeout=120.0) -> CompletedProcess[str]
Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]
# wait_for(predicate, timeout=60.0, interval=0.25, message="condition") -> the truthy value
Wait = Callable[..., object]


def make_kubectl(binary: Path, kubeconfig: Path) -> Kubectl:
    """A callable that runs `binary` (kubectl) against `kubeconfig`; see the `kubectl` fixture."""

    def run(
        *args: str, check: bool = True, input: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        cmd: Sequence[str] = [str(binary), f"--kubeconfig={kubeconfig}", *args]
        proc = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, list(cmd), proc.stdout, proc.stderr)
        return proc

    return run
