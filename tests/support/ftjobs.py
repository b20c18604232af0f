"""Fluent FineTuneJob builders and the corpus of invalid specs, shared by the unit tests (`ftjob render`) and
the control-plane tests (the real API server must reject the same specs, naming the same field)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
HUB_JA = "hf://datasets/mteb/amazon_reviews_multi/ja/"


def load_sample(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "manifests" / "samples" / f"{name}.yaml").read_text())
    return data


class JobBuilder:
    """make_job("demo").profile("trn1").instance("trn1.2xlarge").procs(2).classification().build()"""

    def __init__(self, name: str = "job", namespace: str | None = None):
        self.obj: dict[str, Any] = {
            "apiVersion": "finetune.dev/v1alpha1",
            "kind": "FineTuneJob",
            "metadata": {"name": name},
            "spec": {"hardware": {"profile": "cpu"}},
        }
        if namespace:
            self.obj["metadata"]["namespace"] = namespace

    def profile(self, p: str) -> JobBuilder:
        self.obj["spec"]["hardware"]["profile"] = p
        return self

    def instance(self, t: str) -> JobBuilder:
        self.obj["spec"]["hardware"]["instanceType"] = t
        return self

    def nodes(self, n: int) -> JobBuilder:
        self.obj["spec"]["hardware"]["nodes"] = n
        return self

    def procs(self, n: int) -> JobBuilder:
        self.obj["spec"]["hardware"]["procsPerNode"] = n
        return self

    def launcher(self, launcher: str, implementation: str | None = None) -> JobBuilder:
        self.obj["spec"]["launcher"] = launcher
        if implementation:
            self.obj["spec"]["mpi"] = {"implementation": implementation}
        return self

    def classification(self, model: str = "tiny-bert", path: str = "data/reviews.jsonl") -> JobBuilder:
        self.obj["spec"]["task"] = {
            "type": "text-classification",
            "model": model,
            "dataset": {
                "path": path,
                "textColumn": "review_body",
                "labelColumn": "stars",
                "labelMap": {"1": 0, "2": 0, "4": 1, "5": 1},
            },
            "labels": ["negative", "positive"],
        }
        self.obj["spec"].setdefault("output", {"claimName": "results", "path": "out"})
        return self

    def data_files(self, fmt: str | None = None, **files: str) -> JobBuilder:
        """Replace the classification dataset's source by dataFiles (split=file), in the Hub's layout."""
        ds = self.obj["spec"]["task"]["dataset"]
        for source in ("name", "config", "path"):
            ds.pop(source, None)
        ds["dataFiles"] = files or {"train": HUB_JA + "train.jsonl", "validation": HUB_JA + "validation.jsonl"}
        if fmt:
            ds["format"] = fmt
        return self

    def qa(self, model: str = "tiny-distilbert") -> JobBuilder:
        self.obj["spec"]["task"] = {"type": "question-answering", "model": model, "dataset": {"name": "squad"}}
        self.obj["spec"].setdefault("output", {"claimName": "results", "path": "out"})
        return self

    def command(self, *argv: str) -> JobBuilder:
        self.obj["spec"]["command"] = list(argv)
        return self

    def training(self, **kw: Any) -> JobBuilder:
        self.obj["spec"].setdefault("training", {}).update(kw)
        return self

    def cache(self, **kw: Any) -> JobBuilder:
        self.obj["spec"].setdefault("compileCache", {}).update(kw)
        return self

    def run_policy(self, **kw: Any) -> JobBuilder:
        self.obj["spec"].setdefault("runPolicy", {}).update(kw)
        return self

    def set(self, path: str, value: Any) -> JobBuilder:
        node = self.obj
        parts = path.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)


def make_job(name: str = "job", namespace: str | None = None) -> JobBuilder:
    return JobBuilder(name, namespace)


@dataclass(frozen=True)
class BadSpec:
    id: str
    field: str  # the field path the error must name
    mutate: Callable[[dict[str, Any]], None]


def _base() -> dict[str, Any]:
    return make_job("bad").classification().build()


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def f(o: dict[str, Any]) -> None:
        node = o
        parts = path.split(".")
        for p in parts[:-1]:
            node = node[p]
        del node[parts[-1]]

    return f


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def f(o: dict[str, Any]) -> None:
        node = o
        parts = path.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = copy.deepcopy(value)

    return f


def _both(*fs: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def f(o: dict[str, Any]) -> None:
        for g in fs:
            g(o)

    return f


BAD_SPECS: list[BadSpec] = [
    BadSpec("unknown-profile", "spec.hardware.profile", _set("spec.hardware.profile", "trn3")),
    BadSpec("zero-nodes", "spec.hardware.nodes", _set("spec.hardware.nodes", 0)),
    BadSpec(
        "unknown-instance",
        "spec.hardware.instanceType",
        _both(_set("spec.hardware.profile", "trn1"), _set("spec.hardware.instanceType", "m7i.xlarge")),
    ),
    BadSpec(
        "trn1-unplaceable-devices",
        "spec.hardware.procsPerNode",
        _both(
            _set("spec.hardware.profile", "trn1"),
            _set("spec.hardware.instanceType", "trn1.32xlarge"),
            _set("spec.hardware.procsPerNode", 6),
        ),
    ),
    BadSpec(
        "trn1-too-many-cores",
        "spec.hardware.procsPerNode",
        _both(
            _set("spec.hardware.profile", "trn1"),
            _set("spec.hardware.instanceType", "trn1.2xlarge"),
            _set("spec.hardware.procsPerNode", 4),
        ),
    ),
    BadSpec(
        "trn1-2xl-multinode",
        "spec.hardware.nodes",
        _both(
            _set("spec.hardware.profile", "trn1"),
            _set("spec.hardware.instanceType", "trn1.2xlarge"),
            _set("spec.hardware.nodes", 2),
        ),
    ),
    BadSpec("task-and-command", "spec.task", _set("spec.command", ["python", "train.py"])),
    BadSpec("neither-task-nor-command", "spec.task", _both(_del("spec.task"), _del("spec.output"))),
    BadSpec(
        "mpi-with-torchrun",
        "spec.mpi",
        _both(_set("spec.launcher", "torchrun"), _set("spec.mpi", {"implementation": "openmpi"})),
    ),
    BadSpec(
        "unknown-mpi",
        "spec.mpi.implementation",
        _both(_set("spec.launcher", "mpi"), _set("spec.mpi", {"implementation": "lam"})),
    ),
    BadSpec("bad-precision", "spec.training.precision", _set("spec.training", {"precision": "fp8"})),
    BadSpec("negative-lr", "spec.training.learningRate", _set("spec.training", {"learningRate": -1})),
    BadSpec("missing-output", "spec.output", _del("spec.output")),
    BadSpec(
        "output-claim-and-url", "spec.output.claimName", _set("spec.output", {"claimName": "r", "url": "s3://b/p"})
    ),
    BadSpec("output-bad-url", "spec.output.url", _set("spec.output", {"url": "gs://bucket/x"})),
    BadSpec(
        "resume-from-other-kind",
        "spec.output.resumeFrom",
        _set("spec.output", {"url": "s3://b/p", "resumeFrom": "pvc://results/team/old"}),
    ),
    BadSpec(
        "resume-from-other-claim",
        "spec.output.resumeFrom",
        _set("spec.output", {"claimName": "results", "resumeFrom": "pvc://results-2/team/old"}),
    ),
    BadSpec(
        "resume-from-dotdot",
        "spec.output.resumeFrom",
        _set("spec.output", {"claimName": "results", "resumeFrom": "pvc://results/out/../../x"}),
    ),
    BadSpec(
        "resume-from-no-bucket",
        "spec.output.resumeFrom",
        _set("spec.output", {"url": "s3://b/p", "resumeFrom": "s3:///x"}),
    ),
    BadSpec("dataset-name-and-path", "spec.task.dataset", _set("spec.task.dataset.name", "squad")),
    BadSpec(
        "dataset-path-and-data-files",
        "spec.task.dataset",
        _set("spec.task.dataset.dataFiles", {"train": HUB_JA + "train.jsonl"}),
    ),
    BadSpec("dataset-without-source", "spec.task.dataset", _del("spec.task.dataset.path")),
    BadSpec("dataset-config-without-name", "spec.task.dataset.config", _set("spec.task.dataset.config", "ja")),
    BadSpec(
        "data-files-empty",
        "spec.task.dataset.dataFiles",
        _both(_del("spec.task.dataset.path"), _set("spec.task.dataset.dataFiles", {})),
    ),
    BadSpec(
        "data-files-list-value",
        "spec.task.dataset.dataFiles.train",
        _both(_del("spec.task.dataset.path"), _set("spec.task.dataset.dataFiles", {"train": ["a.jsonl"]})),
    ),
    BadSpec(
        "data-files-bad-split-name",
        "spec.task.dataset.dataFiles",
        _both(
            _del("spec.task.dataset.path"),
            _set("spec.task.dataset.dataFiles", {"train": "t.jsonl", "dev set": "d.jsonl"}),
        ),
    ),
    BadSpec(
        "data-files-without-train-split",
        "spec.task.dataset.dataFiles",
        _both(_del("spec.task.dataset.path"), _set("spec.task.dataset.dataFiles", {"validation": "v.jsonl"})),
    ),
    BadSpec(
        "data-files-eval-split-missing",
        "spec.task.dataset.evalSplit",
        _both(
            _del("spec.task.dataset.path"),
            _set("spec.task.dataset.dataFiles", {"train": "t.jsonl"}),
            _set("spec.task.dataset.evalSplit", "validation"),
        ),
    ),
    BadSpec(
        "data-files-unknown-extension",
        "spec.task.dataset.format",
        _both(_del("spec.task.dataset.path"), _set("spec.task.dataset.dataFiles", {"train": "t.txt"})),
    ),
    BadSpec(
        "data-files-mixed-formats",
        "spec.task.dataset.format",
        _both(
            _del("spec.task.dataset.path"),
            _set("spec.task.dataset.dataFiles", {"train": "t.jsonl", "validation": "v.csv"}),
        ),
    ),
    BadSpec(
        "data-files-unknown-format",
        "spec.task.dataset.format",
        _both(
            _del("spec.task.dataset.path"),
            _set("spec.task.dataset.dataFiles", {"train": "t.jsonl"}),
            _set("spec.task.dataset.format", "arrow"),
        ),
    ),
    BadSpec("format-with-path", "spec.task.dataset.format", _set("spec.task.dataset.format", "json")),
    BadSpec("classification-without-label", "spec.task.dataset.textColumn", _del("spec.task.dataset.labelColumn")),
    BadSpec("lora-without-causal-lm", "spec.task.lora", _set("spec.task.lora", {"r": 8})),
    BadSpec(
        "lora-zero-rank",
        "spec.task.lora.r",
        _both(_set("spec.task.type", "causal-lm"), _set("spec.task.lora", {"r": 0})),
    ),
    BadSpec(
        "label-id-without-name", "spec.task.dataset.labelMap", _set("spec.task.dataset.labelMap", {"1": 0, "5": 2})
    ),
    BadSpec("unknown-task-type", "spec.task.type", _set("spec.task.type", "summarization")),
    BadSpec("cache-url-on-cpu", "spec.compileCache.url", _set("spec.compileCache", {"url": "s3://b/cache"})),
    BadSpec(
        "cache-url-on-trn2-native",
        "spec.compileCache.url",
        _both(
            _set("spec.hardware.profile", "trn2"),
            _set("spec.hardware.stack", "native"),
            _set("spec.compileCache", {"url": "s3://b/cache"}),
        ),
    ),
    BadSpec(
        "stack-not-offered-trn1-native",
        "spec.hardware.stack",
        _both(_set("spec.hardware.profile", "trn1"), _set("spec.hardware.stack", "native")),
    ),
    BadSpec("stack-of-another-profile", "spec.hardware.stack", _set("spec.hardware.stack", "ipex")),
    BadSpec("stack-not-a-name", "spec.hardware.stack", _set("spec.hardware.stack", "Native 2")),
    BadSpec("bad-clean-policy", "spec.runPolicy.cleanPodPolicy", _set("spec.runPolicy", {"cleanPodPolicy": "Never"})),
    BadSpec("typo-field", "spec.hardware.procPerNode", _set("spec.hardware.procPerNode", 2)),
    BadSpec("name-too-long", "metadata.name", _set("metadata.name", "a" * 60)),
    BadSpec(
        "cpu-not-a-quantity",
        "spec.hardware.resources.requests",
        _set("spec.hardware.resources", {"requests": {"cpu": "abc"}}),
    ),
    BadSpec("env-value-not-a-string", "spec.env[0].value", _set("spec.env", [{"name": "X", "value": 5}])),
    BadSpec("env-reserved", "spec.env", _set("spec.env", [{"name": "MASTER_ADDR", "value": "10.0.0.1"}])),
    BadSpec(
        "toleration-bad-operator",
        "spec.hardware.tolerations[0].operator",
        _set("spec.hardware.tolerations", [{"key": "k", "operator": "Maybe"}]),
    ),
    BadSpec(
        "node-selector-bad-key", "spec.hardware.nodeSelector", _set("spec.hardware.nodeSelector", {"bad key!": "v"})
    ),
    BadSpec("queue-name-not-label-value", "spec.runPolicy.queueName", _set("spec.runPolicy", {"queueName": "a b"})),
    BadSpec("service-account-not-dns", "spec.serviceAccountName", _set("spec.serviceAccountName", "Bad_SA")),
    BadSpec(
        "qa-inference-sentences",
        "spec.task.inferenceSamples",
        _set(
            "spec.task",
            {"type": "question-answering", "model": "m", "dataset": {"name": "squad"}, "inferenceSamples": ["What?"]},
        ),
    ),
    BadSpec(
        "node-loss-after-eviction",
        "spec.runPolicy.nodeLossSeconds",
        _both(
            _set("spec.runPolicy", {"nodeLossSeconds": 120}),
            _set(
                "spec.hardware.tolerations",
                [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "tolerationSeconds": 90}],
            ),
        ),
    ),
    BadSpec(
        "progress-deadline-below-reads",
        "spec.runPolicy.progressDeadlineSeconds",
        _set("spec.runPolicy", {"progressDeadlineSeconds": 30}),
    ),
    BadSpec(
        "slots-differ-from-procs",
        "spec.mpi.slotsPerNode",
        _both(
            _set("spec.launcher", "mpi"), _set("spec.hardware.procsPerNode", 2), _set("spec.mpi", {"slotsPerNode": 4})
        ),
    ),
]


def bad_job(case: BadSpec) -> dict[str, Any]:
    o = _base()
    case.mutate(o)
    return o
