"""What a precompile trial found in the compile cache, for status.compileCache: how many files the cache held
before and after, and the graph compiler's own cache hits and misses where it counts them (torch.compile's
AOTAutograd and FX graph caches, read from torch._dynamo's counters).

`warm` means the trial compiled nothing new: every graph came from the cache. Where no counters exist (Neuron:
neuron_parallel_compile compiles the extracted graphs after the trial, outside this process) it means the cache
already held entries and the trial added none.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_HITS = (("inductor", "fxgraph_cache_hit"), ("aot_autograd", "autograd_cache_hit"))
_MISSES = (("inductor", "fxgraph_cache_miss"), ("aot_autograd", "autograd_cache_miss"))


def toolchain_problem() -> str | None:
    """What torch.compile lacks here, or None. Inductor builds its CPU kernels as C++ Python extensions (a C++
    compiler and Python.h), and Triton its GPU launcher stub the same way (a C compiler)."""
    missing = []
    if not shutil.which(os.environ.get("CXX") or "g++"):
        missing.append("a C++ compiler (g++)")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        missing.append(f"Python.h ({sysconfig.get_paths()['include']})")
    if not missing:
        return None
    return (
        f"torch.compile (training.compile, compileCache.precompile) needs {' and '.join(missing)}: use a "
        "finetune-operator image (they ship g++ and python3-dev), or install them into yours"
    )


def cache_root(env: Mapping[str, str], variable: str) -> Path | None:
    """The local directory the trial compiles into (named by the backend's `compile_cache_var`); None for a remote
    cache (s3://)."""
    where = env.get(variable)
    if not where or "://" in where:
        return None
    return Path(where)


def count_entries(root: Path | None) -> int | None:
    if root is None:
        return None
    return sum(len(files) for _, _, files in os.walk(root))  # 0 for a directory that does not exist yet


def _compiler_counts() -> tuple[int, int] | None:
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # a stack without torch.compile
        return None
    hits = sum(counters[group][key] for group, key in _HITS)
    misses = sum(counters[group][key] for group, key in _MISSES)
    return (hits, misses) if hits + misses else None


class CacheProbe:
    """Started before the trial's first step, reported after its last."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.before = count_entries(root)
        self.started = time.monotonic()

    def report(self) -> dict[str, Any]:
        after = count_entries(self.root)
        counts = _compiler_counts()
        hits: int | None = counts[0] if counts else None
        misses: int | None = counts[1] if counts else None
        # With counters: nothing compiled and something loaded. Without: the cache held entries, none added.
        warm = (counts[0] > 0 and counts[1] == 0) if counts else (bool(self.before) and after == self.before)
        out: dict[str, Any] = {
            "warm": warm,
            "entriesBefore": self.before,
            "entriesAfter": after,
            "graphHits": hits,
            "graphMisses": misses,
            "trialSeconds": round(time.monotonic() - self.started, 1),
        }
        return {k: v for k, v in out.items() if v is not None}
