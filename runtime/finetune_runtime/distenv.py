"""Mapping of launcher environments onto the torch.distributed variables HF Trainer/accelerate read.

torchrun already exports RANK/WORLD_SIZE/LOCAL_RANK. mpirun does not: MPICH's and Intel MPI's Hydra export
PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS, OpenMPI exports OMPI_COMM_WORLD_*. Writing the standard
names into os.environ before torch.distributed is touched lets an unmodified Trainer run under either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# (launcher, rank, size, local rank, local size): the first launcher whose rank variable is present wins.
_MPI_FLAVOURS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    source: str  # "torchrun", "openmpi", "hydra" or "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def distributed_env(env: Mapping[str, str]) -> dict[str, str]:
    """Return the variables to add to `env` so that torch.distributed sees one consistent world.

    Pure function (unit-tested): it never overrides what torchrun already set.
    """
    out: dict[str, str] = {}
    if "RANK" not in env:
        for _name, rank_v, size_v, lrank_v, lsize_v in _MPI_FLAVOURS:
            if rank_v in env:
                out["RANK"] = env[rank_v]
                out["WORLD_SIZE"] = env.get(size_v, "1")
                # Hydra sets MPI_LOCALRANKID; when absent (old PMI), rank modulo slots is the layout mpirun uses.
                slots = env.get("FTJOB_MPI_SLOTS_PER_NODE") or env.get(lsize_v)
                if lrank_v in env:
                    out["LOCAL_RANK"] = env[lrank_v]
                elif slots:
                    out["LOCAL_RANK"] = str(int(env[rank_v]) % int(slots))
                else:
                    out["LOCAL_RANK"] = "0"
                if lsize_v in env:
                    out["LOCAL_WORLD_SIZE"] = env[lsize_v]
                elif slots:
                    out["LOCAL_WORLD_SIZE"] = str(slots)
                break
    if "MASTER_ADDR" not in env:
        out["MASTER_ADDR"] = env.get("FTJOB_MASTER_ADDR") or "127.0.0.1"
    if "MASTER_PORT" not in env and env.get("FTJOB_MASTER_PORT"):
        # The operator chooses the port (constants.MASTER_PORT; `ftjob run` a free one). Under torchrun it set
        # MASTER_PORT already; under mpirun a world of several ranks needs it (checked by `dist_info`).
        out["MASTER_PORT"] = env["FTJOB_MASTER_PORT"]
    return out


def dist_info(env: Mapping[str, str]) -> DistInfo:
    """Where this process stands, after `distributed_env` was applied."""
    merged = {**env, **distributed_env(env)}
    if "RANK" not in merged:
        return DistInfo(0, 1, 0, 1, "single")
    source = "torchrun" if "TORCHELASTIC_RUN_ID" in env or "RANK" in env else "mpi"
    for name, rank_v, *_ in _MPI_FLAVOURS:
        if "RANK" not in env and rank_v in env:
            source = name
            break
    world = int(merged.get("WORLD_SIZE", "1"))
    if world > 1 and "MASTER_PORT" not in merged:
        raise ValueError(
            f"FTJOB_MASTER_PORT is not set: {source} started {world} ranks, and torch.distributed needs the rank-0 "
            "port (the operator and `ftjob run` set it)"
        )
    return DistInfo(
        rank=int(merged["RANK"]),
        world_size=world,
        local_rank=int(merged.get("LOCAL_RANK", "0")),
        local_world_size=int(merged.get("LOCAL_WORLD_SIZE", str(world))),
        source=source,
    )


def apply_distributed_env() -> DistInfo:
    """Export the mapped variables into this process and return where it stands."""
    before = dict(os.environ)
    os.environ.update(distributed_env(before))
    return dist_info(before)
