"""Deterministic child names: the same job always yields the same names, so a create that races a previous
one gets a 409 that is read back and compared instead of a duplicate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Names:
    job: str
    namespace: str
    launcher_kind: str  # torchrun | mpi

    @classmethod
    def of(cls, job: dict[str, Any], launcher: str) -> Names:
        meta = job["metadata"]
        return cls(meta["name"], meta.get("namespace") or "default", launcher)

    @property
    def service(self) -> str:
        return self.job

    @property
    def config_map(self) -> str:
        return f"{self.job}-config"

    @property
    def ssh_secret(self) -> str:
        return f"{self.job}-ssh"

    def output_sub_path(self, path: str | None) -> str:
        """The job's directory in its output claim, mounted at /output: `<output.path>/<namespace>/<job>`. Jobs
        sharing a claim (and even an output.path) each see only their own directory, so none can overwrite
        another's checkpoints or model; a job re-created under the same name finds its predecessor's."""
        return "/".join(p for p in ((path or "").strip("/"), self.namespace, self.job) if p)

    @property
    def workload(self) -> str:
        """Kueue Workload of a queued job: the job's own name (one Workload per job, owned by it)."""
        return self.job

    @property
    def launcher(self) -> str:
        return f"{self.job}-launcher"

    def rank_pod(self, i: int) -> str:
        """Pod holding node rank i: `{job}-rank-{i}` (torchrun) or `{job}-worker-{i}` (MPI)."""
        return f"{self.job}-{'worker' if self.launcher_kind == 'mpi' else 'rank'}-{i}"

    def fqdn(self, pod: str) -> str:
        """Stable DNS name through the headless Service (hostname + subdomain)."""
        return f"{pod}.{self.service}.{self.namespace}.svc"

    @property
    def master_addr(self) -> str:
        return self.fqdn(self.rank_pod(0))
