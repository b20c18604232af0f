"""Cross-field rules: each one is written once with its CEL expression (enforced by the API server through the
CRD) and its Python twin (enforced by `ftjob render`, `ftjob run` and the operator). Tests run the same bad
specs through both and compare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..constants import LABEL_KUEUE_QUEUE, NODE_LOSS_TAINTS
from .formats import re2_search
from .schema import CACHE_FOLDER, DATA_FILE_COMPRESSIONS, DATA_FILE_SUFFIXES

Obj = dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """A validation rule attached to the schema node at `scope` (dotted path from the root object)."""

    id: str
    scope: str  # "" = root object, "spec", "spec.task", ...
    cel: str
    field: str  # reported field, relative to scope, e.g. ".task" (CEL fieldPath)
    message: str  # names the field and the fix
    check: Callable[[Obj], bool] | None  # True when valid; None for transition rules (need the old object)
    transition: bool = False
    # A message with the values at hand, for `ftjob render` (the CRD's CEL says the static one: a
    # messageExpression that formats numbers exceeds the API server's cost budget).
    describe: Callable[[Obj], str] | None = None
    # Enforced by the ValidatingAdmissionPolicy generated beside the CRD (crd.py), not by the CRD: a CRD's CEL
    # sees no metadata but the name. `cel` then reads `object` (and `oldObject`, null on create).
    admission_policy: bool = False

    @property
    def path(self) -> str:
        """Absolute field path for messages, e.g. spec.task."""
        return (self.scope + self.field).lstrip(".")


# datasets' own rule for split names (datasets.splits: `^\w+(\.\w+)*$`), spelled without backslashes so the
# same text is valid in CEL and in the CRD's YAML.
_SPLIT_NAME = "^[A-Za-z0-9_]+([.][A-Za-z0-9_]+)*$"
# format -> file-name pattern (unanchored at the start, like CEL's matches()).
_FORMAT_PATTERNS = {
    fmt: f"[.]({'|'.join(suffixes)})([.]({'|'.join(DATA_FILE_COMPRESSIONS)}))?$"
    for fmt, suffixes in DATA_FILE_SUFFIXES.items()
}


def _has(o: Obj | None, *keys: str) -> bool:
    for k in keys:
        if not isinstance(o, dict) or k not in o or o[k] is None:
            return False
        o = o[k]
    return True


_JOB_NAME = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
_NODE_LOSS_TAINTS_CEL = "[" + ", ".join(f"'{t}'" for t in NODE_LOSS_TAINTS) + "]"


def _resume_from_same_kind(o: Obj) -> bool:
    src = str(o["resumeFrom"])
    if _has(o, "url"):
        return src.startswith("s3://")
    claim = f"pvc://{o['claimName']}" if _has(o, "claimName") else None
    return claim is not None and (src == claim or src.startswith(claim + "/"))


def _valid_name(name: str) -> bool:
    return len(name) <= 50 and re2_search(_JOB_NAME, name)


def static_rules(default_mpi_profiles: tuple[str, ...]) -> list[Rule]:
    """Rules that need no hardware data except which profiles default to MPI."""
    mpi_profiles_cel = "[" + ", ".join(f"'{p}'" for p in default_mpi_profiles) + "]"

    def launcher(spec: Obj) -> str:
        if _has(spec, "launcher"):
            return str(spec["launcher"])
        return "mpi" if spec.get("hardware", {}).get("profile") in default_mpi_profiles else "torchrun"

    return [
        Rule(
            "name-length",
            "",
            f"size(self.metadata.name) <= 50 && self.metadata.name.matches('{_JOB_NAME}')",
            ".metadata.name",
            "metadata.name must start with a letter, contain only lower-case letters, digits and '-', and be at "
            "most 50 characters (it becomes the Service name and prefixes pod hostnames); choose a shorter name",
            lambda o: _valid_name(str(o.get("metadata", {}).get("name", ""))),
        ),
        Rule(
            "task-xor-command",
            "spec",
            "has(self.task) != has(self.command)",
            ".task",
            "set exactly one of spec.task (the built-in trainer) and spec.command (your own script)",
            lambda s: _has(s, "task") != _has(s, "command"),
        ),
        Rule(
            "mpi-needs-mpi-launcher",
            "spec",
            f"!has(self.mpi) || (has(self.launcher) ? self.launcher == 'mpi' : "
            f"self.hardware.profile in {mpi_profiles_cel})",
            ".mpi",
            "spec.mpi applies only to launcher: mpi; remove spec.mpi or set spec.launcher: mpi",
            lambda s: not _has(s, "mpi") or launcher(s) == "mpi",
        ),
        Rule(
            "slots-match-procs",
            "spec",
            "!has(self.mpi) || !has(self.mpi.slotsPerNode) || !has(self.hardware.procsPerNode) || "
            "self.mpi.slotsPerNode == self.hardware.procsPerNode",
            ".mpi.slotsPerNode",
            "spec.mpi.slotsPerNode must equal spec.hardware.procsPerNode when both are set; drop one of them",
            lambda s: (
                not _has(s, "mpi", "slotsPerNode")
                or not _has(s, "hardware", "procsPerNode")
                or s["mpi"]["slotsPerNode"] == s["hardware"]["procsPerNode"]
            ),
        ),
        Rule(
            "training-needs-task",
            "spec",
            "!has(self.training) || has(self.task)",
            ".training",
            "spec.training configures the built-in task only; with spec.command pass hyper-parameters as "
            "arguments and remove spec.training",
            lambda s: not _has(s, "training") or _has(s, "task"),
        ),
        Rule(
            "task-needs-output",
            "spec",
            "!has(self.task) || has(self.output)",
            ".output",
            "spec.output is required with spec.task so the model outlives the pods: set output.claimName "
            "(a PersistentVolumeClaim) or output.url (s3://...)",
            lambda s: not _has(s, "task") or _has(s, "output"),
        ),
        Rule(
            "precompile-needs-task",
            "spec",
            "!has(self.compileCache) || !self.compileCache.precompile || has(self.task)",
            ".compileCache.precompile",
            "spec.compileCache.precompile runs the built-in task's trial run; with spec.command run your own "
            "precompile step and set precompile: false",
            lambda s: not _has(s, "compileCache") or not s["compileCache"].get("precompile") or _has(s, "task"),
        ),
        Rule(
            "output-claim-xor-url",
            "spec.output",
            "has(self.claimName) != has(self.url)",
            ".claimName",
            "set exactly one of spec.output.claimName (a PersistentVolumeClaim) and spec.output.url (s3://...)",
            lambda o: _has(o, "claimName") != _has(o, "url"),
        ),
        Rule(
            "output-path-needs-claim",
            "spec.output",
            "!has(self.path) || has(self.claimName)",
            ".path",
            "spec.output.path is a directory under spec.output.claimName; put the prefix into output.url instead",
            lambda o: not _has(o, "path") or _has(o, "claimName"),
        ),
        Rule(
            "output-path-no-dotdot",
            "spec.output",
            "!has(self.path) || !self.path.split('/').exists(p, p == '..')",
            ".path",
            "spec.output.path must stay inside the claim: remove '..' segments",
            lambda o: not _has(o, "path") or ".." not in str(o["path"]).split("/"),
        ),
        Rule(
            "output-path-not-cache",
            "spec.output",
            f"!has(self.path) || self.path.split('/').all(p, p != '{CACHE_FOLDER}')",
            ".path",
            f"spec.output.path may not name the folder {CACHE_FOLDER}: it is where jobs using the claim as "
            "spec.compileCache.claimName share their cache, so they could read or delete this job's results; "
            "choose another directory",
            lambda o: not _has(o, "path") or CACHE_FOLDER not in str(o["path"]).split("/"),
        ),
        Rule(
            "resume-from-same-kind",
            "spec.output",
            "!has(self.resumeFrom) || (has(self.url) ? self.resumeFrom.startsWith('s3://') : "
            "(has(self.claimName) && (self.resumeFrom == 'pvc://' + self.claimName || "
            "self.resumeFrom.startsWith('pvc://' + self.claimName + '/'))))",
            ".resumeFrom",
            "spec.output.resumeFrom must be of the output's kind: with output.url an s3://bucket/prefix URL, with "
            "output.claimName pvc://<claimName>/<directory> of that same claim (the only one the pods mount)",
            lambda o: not _has(o, "resumeFrom") or _resume_from_same_kind(o),
        ),
        Rule(
            "resume-from-no-dotdot",
            "spec.output",
            "!has(self.resumeFrom) || !self.resumeFrom.split('/').exists(p, p == '..')",
            ".resumeFrom",
            "spec.output.resumeFrom must name a directory without '..' segments: remove them",
            lambda o: not _has(o, "resumeFrom") or ".." not in str(o["resumeFrom"]).split("/"),
        ),
        Rule(
            "dataset-one-source",
            "spec.task.dataset",
            "(has(self.name) ? 1 : 0) + (has(self.dataFiles) ? 1 : 0) + (has(self.path) ? 1 : 0) == 1",
            "",
            "set exactly one of spec.task.dataset.name (a hub dataset), spec.task.dataset.dataFiles (files per "
            "split, e.g. {train: hf://datasets/<owner>/<name>/train.jsonl}) and spec.task.dataset.path (a file "
            "or directory in the pod)",
            lambda d: [_has(d, "name"), _has(d, "dataFiles"), _has(d, "path")].count(True) == 1,
        ),
        Rule(
            "dataset-config-needs-name",
            "spec.task.dataset",
            "!has(self.config) || has(self.name)",
            ".config",
            "spec.task.dataset.config selects a configuration of the hub dataset in spec.task.dataset.name; with "
            "dataFiles or path, remove it (name the files of that configuration instead)",
            lambda d: not _has(d, "config") or _has(d, "name"),
        ),
        Rule(
            "data-files-split-names",
            "spec.task.dataset",
            f"!has(self.dataFiles) || self.dataFiles.all(k, k.matches('{_SPLIT_NAME}'))",
            ".dataFiles",
            "spec.task.dataset.dataFiles keys are split names: letters, digits and '_' (dot-separated parts "
            "allowed), e.g. train, validation, test",
            lambda d: not _has(d, "dataFiles") or all(re2_search(_SPLIT_NAME, k) for k in d["dataFiles"]),
        ),
        Rule(
            "data-files-have-train-split",
            "spec.task.dataset",
            "!has(self.dataFiles) || (has(self.trainSplit) ? self.trainSplit : 'train') in self.dataFiles",
            ".dataFiles",
            "spec.task.dataset.dataFiles must have an entry for the train split (spec.task.dataset.trainSplit, "
            "default train): add it, or set trainSplit to one of its keys",
            lambda d: not _has(d, "dataFiles") or d.get("trainSplit", "train") in d["dataFiles"],
        ),
        Rule(
            "data-files-have-eval-split",
            "spec.task.dataset",
            "!has(self.dataFiles) || !has(self.evalSplit) || self.evalSplit in self.dataFiles",
            ".evalSplit",
            "spec.task.dataset.evalSplit must be a key of spec.task.dataset.dataFiles: add its files, or remove "
            "evalSplit to evaluate on a seeded tenth of the train split",
            lambda d: not _has(d, "dataFiles") or not _has(d, "evalSplit") or d["evalSplit"] in d["dataFiles"],
        ),
        Rule(
            "data-files-format",
            "spec.task.dataset",
            "!has(self.dataFiles) || has(self.format) || "
            + " || ".join(
                f"self.dataFiles.all(k, self.dataFiles[k].matches('{pat}'))" for pat in _FORMAT_PATTERNS.values()
            ),
            ".format",
            "spec.task.dataset.format cannot be told from the names in spec.task.dataset.dataFiles: set format "
            "to json, csv or parquet (told from the extension only when every file ends in .jsonl/.json, every "
            "one in .csv or every one in .parquet, optionally followed by .gz, .bz2, .xz or .zst)",
            lambda d: (
                not _has(d, "dataFiles")
                or _has(d, "format")
                or any(
                    all(re2_search(pat, str(f)) for f in d["dataFiles"].values()) for pat in _FORMAT_PATTERNS.values()
                )
            ),
        ),
        Rule(
            "format-needs-data-files",
            "spec.task.dataset",
            "!has(self.format) || has(self.dataFiles)",
            ".format",
            "spec.task.dataset.format applies to spec.task.dataset.dataFiles only (path tells each file's format "
            "from its extension): remove format",
            lambda d: not _has(d, "format") or _has(d, "dataFiles"),
        ),
        Rule(
            "classification-columns",
            "spec.task",
            "self.type != 'text-classification' || (has(self.dataset.textColumn) && has(self.dataset.labelColumn))",
            ".dataset.textColumn",
            "text-classification needs spec.task.dataset.textColumn and spec.task.dataset.labelColumn (e.g. "
            "text and label)",
            lambda t: (
                t.get("type") != "text-classification"
                or (_has(t, "dataset", "textColumn") and _has(t, "dataset", "labelColumn"))
            ),
        ),
        Rule(
            "classification-label-set",
            "spec.task",
            "self.type != 'text-classification' || (has(self.labels) && size(self.labels) > 0) || "
            "(has(self.dataset.labelMap) && size(self.dataset.labelMap) > 0)",
            ".labels",
            "text-classification needs its set of classes: give spec.task.labels (class names by id, e.g. "
            "[negative, positive]) or spec.task.dataset.labelMap (raw label -> class id); the runtime refuses a "
            "job with neither, but only after loading the dataset",
            lambda t: (
                t.get("type") != "text-classification"
                or bool(t.get("labels"))
                or bool(t.get("dataset", {}).get("labelMap"))
            ),
        ),
        Rule(
            "doc-stride-fits-max-length",
            "spec.task",
            "self.type != 'question-answering' || 2 * self.docStride < self.maxLength",
            ".docStride",
            "spec.task.docStride must be less than half of spec.task.maxLength: each window of maxLength tokens "
            "also holds the question and the tokenizer's special tokens, and the tokenizer refuses a stride that "
            "leaves no room for them (after the dataset was loaded); lower docStride (e.g. 32 with maxLength 128) "
            "or raise maxLength (e.g. 384)",
            lambda t: (
                t.get("type") != "question-answering" or 2 * int(t.get("docStride", 32)) < int(t.get("maxLength", 128))
            ),
        ),
        Rule(
            "label-ids-have-names",
            "spec.task",
            "!has(self.labels) || !has(self.dataset.labelMap) || "
            "self.dataset.labelMap.all(k, self.dataset.labelMap[k] < size(self.labels))",
            ".dataset.labelMap",
            "every class id in spec.task.dataset.labelMap must index spec.task.labels; add the missing label "
            "names or fix the ids",
            lambda t: (
                not _has(t, "labels")
                or not _has(t, "dataset", "labelMap")
                or all(int(v) < len(t["labels"]) for v in t["dataset"]["labelMap"].values())
            ),
        ),
        Rule(
            "inference-samples-classification-only",
            "spec.task",
            "self.type != 'question-answering' || !has(self.inferenceSamples)",
            ".inferenceSamples",
            "spec.task.inferenceSamples are sentences for text-classification; for question-answering give "
            "spec.task.inferenceQuestions: [{question: ..., context: ...}]",
            lambda t: t.get("type") != "question-answering" or not _has(t, "inferenceSamples"),
        ),
        Rule(
            "inference-questions-qa-only",
            "spec.task",
            "self.type == 'question-answering' || !has(self.inferenceQuestions)",
            ".inferenceQuestions",
            "spec.task.inferenceQuestions apply to question-answering only; for this task type give "
            "spec.task.inferenceSamples (sentences, or prompts for causal-lm)",
            lambda t: t.get("type") == "question-answering" or not _has(t, "inferenceQuestions"),
        ),
        Rule(
            "lora-needs-causal-lm",
            "spec.task",
            "!has(self.lora) || self.type == 'causal-lm'",
            ".lora",
            "spec.task.lora trains adapters of a decoder language model: set spec.task.type to causal-lm, or "
            "remove lora",
            lambda t: not _has(t, "lora") or t.get("type") == "causal-lm",
        ),
        Rule(
            "node-loss-before-eviction",
            "spec",
            "!has(self.hardware.tolerations) || !has(self.runPolicy) || !has(self.runPolicy.nodeLossSeconds) || "
            f"self.hardware.tolerations.all(t, !has(t.key) || !(t.key in {_NODE_LOSS_TAINTS_CEL}) || "
            "!has(t.tolerationSeconds) || t.tolerationSeconds > self.runPolicy.nodeLossSeconds)",
            ".runPolicy.nodeLossSeconds",
            "spec.runPolicy.nodeLossSeconds must end before the tolerationSeconds that spec.hardware.tolerations "
            f"give the taints of a lost node ({', '.join(NODE_LOSS_TAINTS)}): Kubernetes evicts the pods when the "
            "toleration ends, and they then wait on the lost node for ever instead of being replaced; lower "
            "nodeLossSeconds or raise the toleration's tolerationSeconds",
            lambda s: (
                not _has(s, "hardware", "tolerations")
                or not _has(s, "runPolicy", "nodeLossSeconds")
                or all(
                    t.get("key") not in NODE_LOSS_TAINTS
                    or t.get("tolerationSeconds") is None
                    or int(t["tolerationSeconds"]) > int(s["runPolicy"]["nodeLossSeconds"])
                    for t in s["hardware"]["tolerations"]
                )
            ),
        ),
        Rule(
            "hardware-immutable",
            "spec.hardware",
            "self == oldSelf",
            "",
            "spec.hardware is immutable; delete and recreate the job to change it",
            None,
            transition=True,
        ),
        Rule(
            "task-immutable",
            "spec.task",
            "self == oldSelf",
            "",
            "spec.task is immutable; delete and recreate the job to change it",
            None,
            transition=True,
        ),
        Rule(
            "launcher-immutable",
            "spec",
            "has(self.launcher) == has(oldSelf.launcher) && (!has(self.launcher) || self.launcher == oldSelf.launcher)",
            ".launcher",
            "spec.launcher is immutable; delete and recreate the job to change it",
            None,
            transition=True,
        ),
        Rule(
            "mpi-immutable",
            "spec.mpi",
            "self == oldSelf",
            "",
            "spec.mpi is immutable; delete and recreate the job to change it",
            None,
            transition=True,
        ),
        *[_frozen_block(block, why) for block, why in _FROZEN_BLOCKS.items()],
        Rule(
            "queue-name-frozen-once-admitted",
            "",
            f"{_queue('self')} == {_queue('oldSelf')} || {NOT_ADMITTED}",
            ".spec.runPolicy.queueName",
            "spec.runPolicy.queueName may change only while the job has not been admitted: before the operator "
            "first handled it, or while it waits in its queue (status.phase Queued with condition Queued True, no "
            "status.startTime). Once Kueue admitted it or its pods were created, adding, changing or removing the "
            "queue would run its pods outside the quota; to move the job, delete it and create it again",
            None,
            transition=True,
        ),
        Rule(
            "no-kueue-queue-label",
            "",
            f"!has(object.metadata.labels) || !('{LABEL_KUEUE_QUEUE}' in object.metadata.labels) || "
            f"(oldObject != null && has(oldObject.metadata.labels) && '{LABEL_KUEUE_QUEUE}' in "
            f"oldObject.metadata.labels && oldObject.metadata.labels['{LABEL_KUEUE_QUEUE}'] == "
            f"object.metadata.labels['{LABEL_KUEUE_QUEUE}'])",
            ".metadata.labels",
            f"metadata.labels: the {LABEL_KUEUE_QUEUE} label does not queue a FineTuneJob (the job would run "
            "outside Kueue's quota): remove the label and set spec.runPolicy.queueName to the LocalQueue instead",
            lambda o: LABEL_KUEUE_QUEUE not in ((o.get("metadata") or {}).get("labels") or {}),
            admission_policy=True,
        ),
    ]


def _queue(o: str) -> str:
    """CEL: the job's queue name, '' without one (the operator queues only a non-empty name)."""
    return f"((has({o}.spec.runPolicy) && has({o}.spec.runPolicy.queueName)) ? {o}.spec.runPolicy.queueName : '')"


# CEL on the stored object (oldSelf): the job is not admitted, so its queue may still change. The operator
# (reconcile.py's `queued` phase) keeps phase Queued with condition Queued True and no startTime while the
# job's Workload waits; admission (`admitted`) turns the condition False (reason Admitted) and the first pods
# set startTime. A job without status has not been handled yet.
NOT_ADMITTED = (
    "(!has(oldSelf.status) || (!has(oldSelf.status.startTime) && (!has(oldSelf.status.phase) || "
    "(oldSelf.status.phase == 'Queued' && has(oldSelf.status.conditions) && "
    "oldSelf.status.conditions.exists(c, c.type == 'Queued' && c.status == 'True')))))"
)


# Spec blocks fixed at creation, and why: the job's ConfigMap (config.json) is written once, and restarted pods
# must run what the first attempt ran, or a restart would resume a checkpoint under other settings.
_FROZEN_BLOCKS = {
    "training": "config.json and the checkpoints it resumes from are made with these hyper-parameters",
    "output": "checkpoints and the model already written stay where the job resumes from",
    "compileCache": "config.json and the pods' cache mount are fixed at creation",
    "command": "every attempt of the job runs the same program",
    "podTemplate": "every attempt's pods, and a queued job's Kueue Workload (its pod sets' requests, labels and "
    "priority), are made from it",
}


def _frozen_block(block: str, why: str) -> Rule:
    """`spec.<block>` may be neither changed, added nor removed after creation. Checked at spec scope, since a
    rule on the block itself would not run when the block is added or removed."""
    return Rule(
        f"{block}-immutable",
        "spec",
        f"has(self.{block}) == has(oldSelf.{block}) && (!has(self.{block}) || self.{block} == oldSelf.{block})",
        f".{block}",
        f"spec.{block} is immutable after creation ({why}); to change it, delete the job and create it again "
        "(a new job of the same name starts fresh and keeps the old one's results; output.resumeFrom starts it "
        "from the old checkpoints)",
        None,
        transition=True,
    )
