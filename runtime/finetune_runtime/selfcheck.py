"""`selfcheck`: image smoke test (versions, backend stacks, the Japanese tokenizer path)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
from typing import Any

from finetune_runtime.backends import BACKENDS, MissingStackError, backend_from_env, get, plan_backend

COMMON_PACKAGES = ("torch", "transformers", "datasets", "accelerate", "fugashi", "unidic-lite", "numpy", "boto3")
PACKAGES = tuple(dict.fromkeys(COMMON_PACKAGES + tuple(p for b in BACKENDS.values() for p in b.packages)))
SAMPLE = "この掃除機は音が静かで、とても使いやすいです。"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


def run_selfcheck() -> tuple[bool, dict[str, Any]]:
    report: dict[str, Any] = {"versions": versions()}
    ok = True
    backend = backend_from_env(os.environ)
    try:
        plan = plan_backend(backend, os.environ.get("FTJOB_PRECISION", "fp32"))
        report["backend"] = {"name": backend, "ddp": plan.ddp_backend, "ipex": plan.ipex, "notes": plan.notes}
    except MissingStackError as e:
        report["backend"] = {"name": backend, "error": str(e)}
        ok = False
    import torch

    report["torch"] = {
        "cuda": torch.cuda.is_available(),
        "threads": torch.get_num_threads(),
        "bf16_cpu": bool(
            getattr(torch.backends, "mkldnn", None) and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call,unused-ignore]
        ),
    }
    if get(backend).inductor:  # Neuron compiles with neuronx-cc (XLA, or torch.compile's neuron backend)
        from finetune_runtime.compilecache import toolchain_problem

        problem = toolchain_problem()
        report["compile"] = {"ok": problem is None, **({"error": problem} if problem else {})}
        ok = ok and problem is None
    try:
        from finetune_runtime.tokenization import mecab_words

        report["tokenizer"] = {"mecab_unidic_lite": mecab_words(SAMPLE)}
    except Exception as e:  # the report is the point: show what broke
        report["tokenizer"] = {"error": f"{type(e).__name__}: {e}"}
        ok = False
    report["ok"] = ok
    return ok, report
