"""Cross-field rules: each one is written once with its CEL expression (enforced by the API server through the
CRD) and its Python twin (enforced by `ftjob render`, `ftjob run` and the operator). Tests run the same bad
specs through both and compare.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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

    @property
    def path(self) -> str:
        """Absolute field path for messages, e.g. spec.task."""
        return (self.scope + self.field).lstrip(".")


def _has(o: Obj | None, *keys: str) -> bool:
    for k in keys:
        if not isinstance(o, dict) or k not in o or o[k] is None:
            return False
        o = o[k]
    return True


def _valid_name(name: str) -> bool:
    return len(name) <= 50 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) is not None


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
            "size(self.metadata.name) <= 50 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
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
            lambda s: not _has(s, "mpi", "slotsPerNode")
            or not _has(s, "hardware", "procsPerNode")
            or s["mpi"]["slotsPerNode"] == s["hardware"]["procsPerNode"],
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
            "dataset-name-xor-path",
            "spec.task.dataset",
            "has(self.name) != has(self.path)",
            ".name",
            "set exactly one of spec.task.dataset.name (a hub dataset) and spec.task.dataset.path (a file or "
            "directory)",
            lambda d: _has(d, "name") != _has(d, "path"),
        ),
        Rule(
            "classification-columns",
            "spec.task",
            "self.type != 'text-classification' || (has(self.dataset.textColumn) && "
            "has(self.dataset.labelColumn))",
            ".dataset.textColumn",
            "text-classification needs spec.task.dataset.textColumn and spec.task.dataset.labelColumn (e.g. "
            "review_body and stars)",
            lambda t: t.get("type") != "text-classification"
            or (_has(t, "dataset", "textColumn") and _has(t, "dataset", "labelColumn")),
        ),
        Rule(
            "label-ids-have-names",
            "spec.task",
            "!has(self.labels) || !has(self.dataset.labelMap) || "
            "self.dataset.labelMap.all(k, self.dataset.labelMap[k] < size(self.labels))",
            ".dataset.labelMap",
            "every class id in spec.task.dataset.labelMap must index spec.task.labels; add the missing label "
            "names or fix the ids",
            lambda t: not _has(t, "labels")
            or not _has(t, "dataset", "labelMap")
            or all(int(v) < len(t["labels"]) for v in t["dataset"]["labelMap"].values()),
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
            "has(self.launcher) == has(oldSelf.launcher) && (!has(self.launcher) || self.launcher == "
            "oldSelf.launcher)",
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
    ]
