"""Hypothesis strategies for FineTuneJobs across every spec field, pass-through fields included: valid jobs, and
jobs made invalid by one known mistake together with the field the rejection must name.

The oracle (tests/unit/test_spec_properties.py through `ftjob render`'s admission and builders,
tests/controlplane/test_validation_cluster.py through the real API server): a valid job is accepted and renders;
an invalid one is rejected with an error naming its field. Valid jobs are built to satisfy every rule by
construction (from the profile data), so a rejection of one is a finding, not noise.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from finetune_operator import profiles
from finetune_operator.api.schema import PROFILES
from finetune_operator.builders.reserved_env import reserved_env

Job = dict[str, Any]

_LOWER = "abcdefghijklmnopqrstuvwxyz"
_ALNUM = _LOWER + "0123456789"
dns_label = st.builds(lambda a, b: a + b, st.sampled_from(_LOWER), st.text(_ALNUM, max_size=8))
dns_subdomain = st.lists(dns_label, min_size=1, max_size=3).map(".".join)
label_value = st.one_of(
    st.just(""),
    st.builds(
        lambda a, b: a + b, st.sampled_from("aZ9"), st.text(_ALNUM + "-_.", max_size=6).map(lambda s: s.rstrip("-_."))
    ),
)
label_key = st.builds(lambda p, n: f"{p}/{n}" if p else n, st.one_of(st.none(), dns_subdomain), dns_label)
quantity = st.one_of(  # int-or-string, as in a Pod
    st.builds(lambda n, s: f"{n}{s}", st.integers(0, 64), st.sampled_from(["", "m", "k", "Mi", "Gi", "e2", ".5"])),
    st.integers(0, 64),
)
env_name = st.builds(lambda s: "USER_" + s, st.text("ABCXYZ_019", max_size=6))


def _env_var() -> st.SearchStrategy[dict[str, Any]]:
    sources = st.one_of(
        st.builds(
            lambda p: {"fieldRef": {"fieldPath": p}},
            st.sampled_from(["metadata.name", "status.podIP", "metadata.labels['app']"]),
        ),
        st.builds(
            lambda r: {"resourceFieldRef": {"resource": r, "divisor": "1"}},
            st.sampled_from(["limits.cpu", "requests.memory"]),
        ),
        st.builds(lambda n, k: {"configMapKeyRef": {"name": n, "key": k}}, dns_subdomain, dns_label),
        st.builds(lambda n, k: {"secretKeyRef": {"name": n, "key": k, "optional": True}}, dns_subdomain, dns_label),
    )
    return st.one_of(
        st.builds(lambda n, v: {"name": n, "value": v}, env_name, st.text("ab 1=:", max_size=8)),
        st.builds(lambda n, s: {"name": n, "valueFrom": s}, env_name, sources),
    )


def _toleration() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(
            lambda k, v, e: {"key": k, "operator": "Equal", "value": v, "effect": e},
            label_key,
            label_value,
            st.sampled_from(["NoSchedule", "PreferNoSchedule", ""]),
        ),
        st.builds(lambda k: {"key": k, "operator": "Exists"}, st.one_of(st.just(""), label_key)),
        st.builds(
            lambda k, s: {"key": k, "effect": "NoExecute", "tolerationSeconds": s}, label_key, st.integers(0, 3600)
        ),
    )


def _resources(draw: st.DrawFn) -> dict[str, Any]:
    limits = draw(st.dictionaries(st.sampled_from(["cpu", "memory"]), quantity, max_size=2))
    requests = {k: draw(st.sampled_from([v, "0"])) for k, v in limits.items()}  # never above the limit
    if draw(st.booleans()):
        requests["ephemeral-storage"] = draw(quantity)
    if draw(st.booleans()):
        n = str(draw(st.integers(0, 4)))
        limits["example.com/widget"] = n
        if draw(st.booleans()):
            requests["example.com/widget"] = n
    out = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


@st.composite
def valid_jobs(draw: st.DrawFn) -> Job:
    """A job that every rule accepts, with each optional field present or absent."""
    name = draw(
        st.builds(
            lambda a, b: a + b, st.sampled_from(_LOWER), st.text(_ALNUM + "-", max_size=12).map(lambda s: s.rstrip("-"))
        )
    )
    profile = draw(st.sampled_from(PROFILES))
    p = profiles.get(profile)
    inst_name = draw(st.one_of(st.none(), st.sampled_from(sorted(p.instance_types)))) if p.instance_types else None
    inst = p.instance(inst_name)
    hw: dict[str, Any] = {"profile": profile}
    if inst_name:
        hw["instanceType"] = inst_name
    multi_ok = not p.multi_node_needs_efa or (inst is not None and inst.efa > 0)
    if draw(st.booleans()):
        hw["nodes"] = draw(st.integers(1, 3)) if multi_ok else 1
    if draw(st.booleans()):
        hw["procsPerNode"] = 1
    if draw(st.booleans()):
        hw["schedulerName"] = draw(dns_subdomain)
    if draw(st.booleans()):
        hw["resources"] = _resources(draw)
    if draw(st.booleans()):
        hw["nodeSelector"] = draw(st.dictionaries(label_key, label_value, max_size=3))
    if draw(st.booleans()):
        hw["tolerations"] = draw(st.lists(_toleration(), max_size=3))
    spec: dict[str, Any] = {"hardware": hw}
    launcher = draw(st.sampled_from([None, "torchrun", "mpi"]))
    if launcher:
        spec["launcher"] = launcher
    if (launcher or p.default_launcher) == "mpi" and draw(st.booleans()):
        spec["mpi"] = {"implementation": draw(st.sampled_from(["intel", "mpich", "openmpi"]))}
        if "procsPerNode" in hw and draw(st.booleans()):
            spec["mpi"]["slotsPerNode"] = hw["procsPerNode"]
    if draw(st.booleans()):
        spec["image"] = draw(st.builds(lambda r, t: f"registry.test/{r}:{t}", dns_label, dns_label))
    if draw(st.booleans()):
        spec["imagePullPolicy"] = draw(st.sampled_from(["Always", "IfNotPresent", "Never"]))
    if draw(st.booleans()):
        spec["serviceAccountName"] = draw(dns_subdomain)
    has_task = draw(st.booleans())
    if has_task:
        if draw(st.booleans()):
            spec["task"] = {
                "type": "text-classification",
                "model": "tiny-bert",
                "dataset": {"path": "data/reviews.jsonl", "textColumn": "text", "labelColumn": "label"},
                "labels": ["negative", "positive"],
            }
            if draw(st.booleans()):
                spec["task"]["inferenceSamples"] = draw(
                    st.lists(st.text("abc ", min_size=1, max_size=10), min_size=1, max_size=3)
                )
        else:
            spec["task"] = {
                "type": "question-answering",
                "model": "tiny-distilbert",
                "dataset": {"name": "squad"},
                "maxLength": 384,
            }
            if draw(st.booleans()):
                spec["task"]["inferenceQuestions"] = [{"question": "Who?", "context": "Ann did."}]
        if draw(st.booleans()):
            spec["training"] = {
                "epochs": draw(st.sampled_from([1, 2.5])),
                "precision": draw(st.sampled_from(["fp32", "bf16"])),
            }
        spec["output"] = draw(st.sampled_from([{"claimName": "results", "path": "out"}, {"url": "s3://b/p"}]))
    else:
        spec["command"] = ["python", "train.py"]
    if draw(st.booleans()):
        cache: dict[str, Any] = {"claimName": draw(dns_subdomain)}
        if has_task:
            cache["precompile"] = draw(st.booleans())
        if p.backend == "neuron" and draw(st.booleans()):
            cache["url"] = "s3://b/cache"
        spec["compileCache"] = cache
    if draw(st.booleans()):
        spec["env"] = draw(st.lists(_env_var(), max_size=3))
    if draw(st.booleans()):
        spec["envFrom"] = [
            draw(
                st.sampled_from(
                    [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "s", "optional": True}, "prefix": "S_"}]
                )
            )
        ]
    if draw(st.booleans()):
        spec["hfTokenSecretRef"] = {"name": draw(dns_subdomain)}
    if draw(st.booleans()):
        rp: dict[str, Any] = {"backoffLimit": draw(st.integers(0, 5))}
        if draw(st.booleans()):
            rp["queueName"] = draw(label_value)
        if draw(st.booleans()):
            rp["activeDeadlineSeconds"] = draw(st.integers(1, 10**6))
        spec["runPolicy"] = rp
    if draw(st.booleans()):
        spec["podTemplate"] = draw(pod_templates((launcher or p.default_launcher) == "mpi"))
    return {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": name}, "spec": spec}


# PriorityClasses a generated spec.podTemplate may name: tests that make pods from generated jobs create them
# (the Priority admission plugin refuses a pod naming a class that does not exist).
PRIORITY_CLASSES = ("ftjob-test-low", "ftjob-test-high")
_RESERVED_KEY_PREFIXES = ("finetune.dev/", "kueue.x-k8s.io/", "app.kubernetes.io/")
_free_key = label_key.filter(lambda k: not k.startswith(_RESERVED_KEY_PREFIXES))
# Volume sources that need nothing to exist for a pod to be accepted (a claim or Secret is checked only when the
# kubelet mounts it).
_VOLUME_SOURCES = (
    {"emptyDir": {}},
    {"emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
    {"persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
    {"configMap": {"name": "settings", "optional": True}},
    {"secret": {"secretName": "creds", "defaultMode": 0o400}},
    {"csi": {"driver": "fsx.csi.aws.com", "volumeAttributes": {"dnsname": "fs.example"}}},
    {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
    {"projected": {"sources": [{"configMap": {"name": "settings"}}]}},
)


@st.composite
def pod_templates(draw: st.DrawFn, mpi: bool) -> dict[str, Any]:
    """A spec.podTemplate every rule accepts, for a torchrun (or MPI) job."""
    t: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    if draw(st.booleans()):
        meta["labels"] = draw(st.dictionaries(_free_key, label_value, max_size=3))
    if draw(st.booleans()):
        meta["annotations"] = draw(st.dictionaries(_free_key, st.text(max_size=12), max_size=3))
    if meta:
        t["metadata"] = meta
    if draw(st.booleans()):
        t["priorityClassName"] = draw(st.sampled_from(PRIORITY_CLASSES))
    if draw(st.booleans()):
        roles = ["worker", "launcher"] if mpi else ["rank"]
        t["roles"] = draw(st.lists(st.sampled_from(roles), min_size=1, max_size=2, unique=True))
    names = draw(st.lists(dns_label.map(lambda n: "v" + n), max_size=3, unique=True))
    if names:
        t["volumes"] = [{"name": n, **draw(st.sampled_from(_VOLUME_SOURCES))} for n in names]
        mounted = draw(st.lists(st.sampled_from(names), max_size=len(names), unique=True))
        if mounted:
            t["volumeMounts"] = [
                {"name": n, "mountPath": f"/data/{n}", **({"readOnly": True} if draw(st.booleans()) else {})}
                for n in mounted
            ]
    if draw(st.booleans()):
        containers = []
        for i in range(draw(st.integers(1, 2))):
            ctr: dict[str, Any] = {"name": f"user-{i}"}
            if draw(st.booleans()):
                ctr["image"] = draw(st.builds(lambda r: f"registry.test/{r}:1", dns_label))
            if draw(st.booleans()):
                ctr["restartPolicy"] = "Always"
            if draw(st.booleans()):
                ctr["command"] = ["sh", "-c", "true"]
            if draw(st.booleans()):
                ctr["env"] = draw(st.lists(_env_var(), max_size=2))
            if draw(st.booleans()):
                ctr["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}
            if names and draw(st.booleans()):
                ctr["volumeMounts"] = [{"name": names[0], "mountPath": "/mnt/data"}]
            containers.append(ctr)
        t["initContainers"] = containers
    return t


@dataclass(frozen=True)
class Mistake:
    """One way to make a valid job invalid, and the field the rejection must name."""

    id: str
    field: str
    apply: Callable[[Job, Any], None]  # (job, one of `examples`)
    examples: tuple[Any, ...]


def _hw(job: Job) -> dict[str, Any]:
    h: dict[str, Any] = job["spec"]["hardware"]
    return h


def _put(path: str) -> Callable[[Job, Any], None]:
    def f(job: Job, value: Any) -> None:
        node = job
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    return f


def _append(path: str) -> Callable[[Job, Any], None]:
    def f(job: Job, value: Any) -> None:
        node = job
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node.setdefault(leaf, []).append(value)

    return f


def _reserved(job: Job, pick: str | int) -> None:
    table = reserved_env()[_hw(job)["profile"]]
    chosen = pick if isinstance(pick, str) else table[pick % len(table)]
    job["spec"].setdefault("env", []).append({"name": chosen, "value": "x"})


def _requests_above_limits(job: Job, n: int) -> None:
    _hw(job)["resources"] = {"requests": {"cpu": str(n + 1)}, "limits": {"cpu": str(n)}}


def _qa_stride(job: Job, stride: int) -> None:
    job["spec"]["task"] = {
        "type": "question-answering",
        "model": "m",
        "dataset": {"name": "squad"},
        "docStride": stride,
        "maxLength": 128,
    }


def _qa_samples(job: Job, text: str) -> None:
    job["spec"]["task"] = {
        "type": "question-answering",
        "model": "m",
        "dataset": {"name": "squad"},
        "inferenceSamples": [text],
    }


def _other_roles(job: Job, _: int) -> None:
    """spec.podTemplate.roles naming a role of the other launcher."""
    spec = job["spec"]
    mpi = spec.get("launcher", profiles.get(_hw(job)["profile"]).default_launcher) == "mpi"
    spec["podTemplate"] = {"roles": ["rank"] if mpi else ["launcher"]}


MISTAKES: list[Mistake] = [
    Mistake(
        "cpu-not-a-quantity",
        "spec.hardware.resources.requests",
        _put("spec.hardware.resources.requests"),
        (
            {"cpu": "abc"},
            {"cpu": "2 k"},
            {"memory": "1.2.3Gi"},
            {"cpu": ""},
            {"cpu": 1.5},
            {"cpu": True},
            {"memory": "2E"},
            {"cpu": "1e999999"},
        ),
    ),
    Mistake(
        "negative-quantity",
        "spec.hardware.resources.limits",
        _put("spec.hardware.resources.limits"),
        ({"cpu": "-1"}, {"memory": "-5Mi"}),
    ),
    Mistake(
        "fractional-device",
        "spec.hardware.resources.limits",
        _put("spec.hardware.resources.limits"),
        ({"example.com/widget": "1.5"}, {"nvidia.com/gpu": "500m"}),
    ),
    Mistake(
        "device-only-requested",
        "spec.hardware.resources.limits",
        _put("spec.hardware.resources"),
        ({"requests": {"example.com/widget": "1"}},),
    ),
    Mistake("requests-above-limits", "spec.hardware.resources.requests", _requests_above_limits, (1, 4, 16)),
    Mistake(
        "bad-resource-name",
        "spec.hardware.resources",
        _put("spec.hardware.resources.limits"),
        ({"gpu": "1"}, {"kubernetes.io/foo": "1"}, {"bad name/x": "1"}),
    ),
    Mistake(
        "env-value-not-string",
        "spec.env",
        _append("spec.env"),
        ({"name": "USER_X", "value": 5}, {"name": "USER_X", "value": True}, {"name": "USER_X", "value": 1.5}),
    ),
    Mistake(
        "env-bad-name",
        "spec.env",
        _append("spec.env"),
        ({"name": "A=B", "value": "1"}, {"name": "", "value": "1"}, {"name": "TAB\tX", "value": "1"}),
    ),
    Mistake(
        "env-value-and-from",
        "spec.env",
        _append("spec.env"),
        ({"name": "USER_X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},),
    ),
    Mistake(
        "env-two-sources",
        "spec.env",
        _append("spec.env"),
        (
            {
                "name": "USER_X",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}},
            },
        ),
    ),
    Mistake(
        "env-bad-field-path",
        "spec.env",
        _append("spec.env"),
        (
            {"name": "USER_X", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}},
            {"name": "USER_X", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}},
        ),
    ),
    Mistake("env-unknown-field", "spec.env", _append("spec.env"), ({"name": "USER_X", "valu": "1"},)),
    Mistake("env-reserved", "spec.env", _reserved, ("FTJOB_WORLD_SIZE", "FTJOB_X", 0, 1, 2, 3, 5, 8, 13)),
    Mistake(
        "env-from-two-sources",
        "spec.envFrom",
        _append("spec.envFrom"),
        ({"configMapRef": {"name": "c"}, "secretRef": {"name": "s"}},),
    ),
    Mistake(
        "toleration-bad-operator",
        "spec.hardware.tolerations",
        _append("spec.hardware.tolerations"),
        ({"key": "k", "operator": "Maybe"}, {"key": "k", "effect": "NoRun"}),
    ),
    Mistake(
        "toleration-bad-key",
        "spec.hardware.tolerations",
        _append("spec.hardware.tolerations"),
        ({"key": "bad key", "operator": "Exists"}, {"key": "-k", "value": "v"}, {"key": "", "value": "v"}),
    ),
    Mistake(
        "toleration-exists-with-value",
        "spec.hardware.tolerations",
        _append("spec.hardware.tolerations"),
        ({"key": "k", "operator": "Exists", "value": "v"},),
    ),
    Mistake(
        "toleration-seconds-without-noexecute",
        "spec.hardware.tolerations",
        _append("spec.hardware.tolerations"),
        ({"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5},),
    ),
    Mistake(
        "node-selector-bad-key",
        "spec.hardware.nodeSelector",
        _put("spec.hardware.nodeSelector"),
        ({"bad key!": "v"}, {"a/b/c": "v"}, {"x" * 64: "v"}),
    ),
    Mistake(
        "node-selector-bad-value",
        "spec.hardware.nodeSelector",
        _put("spec.hardware.nodeSelector"),
        ({"k": "bad value"}, {"k": "-v"}, {"k": "v" * 64}),
    ),
    Mistake(
        "queue-name-not-label-value",
        "spec.runPolicy.queueName",
        _put("spec.runPolicy.queueName"),
        ("team a", "-a", "q" * 64),
    ),
    Mistake(
        "service-account-not-dns",
        "spec.serviceAccountName",
        _put("spec.serviceAccountName"),
        ("Bad_SA", "sa name", "-sa"),
    ),
    Mistake(
        "scheduler-not-dns",
        "spec.hardware.schedulerName",
        _put("spec.hardware.schedulerName"),
        ("My Scheduler", "UPPER"),
    ),
    Mistake("image-with-space", "spec.image", _put("spec.image"), ("my image:1",)),
    Mistake("hf-token-bad-name", "spec.hfTokenSecretRef.name", _put("spec.hfTokenSecretRef"), ({"name": "Bad Name"},)),
    Mistake("qa-with-sentences", "spec.task.inferenceSamples", _qa_samples, ("What is it?",)),
    Mistake("zero-nodes", "spec.hardware.nodes", _put("spec.hardware.nodes"), (0, -1)),
    Mistake("bad-profile", "spec.hardware.profile", _put("spec.hardware.profile"), ("trn3",)),
    # Issue 23: numbers past what the code downstream handles, in every type a decoder may give them.
    Mistake("seed-past-numpy", "spec.training.seed", _put("spec.training.seed"), (2**32, 2**63, 2**64)),
    Mistake(
        "deadline-past-maximum",
        "spec.runPolicy.activeDeadlineSeconds",
        _put("spec.runPolicy.activeDeadlineSeconds"),
        (2**31, 2**63 - 1, 10**30),
    ),
    Mistake(
        "ttl-past-maximum",
        "spec.runPolicy.ttlSecondsAfterFinished",
        _put("spec.runPolicy.ttlSecondsAfterFinished"),
        (2**31, -1),
    ),
    Mistake(
        "toleration-seconds-out-of-range",
        "spec.hardware.tolerations",
        _append("spec.hardware.tolerations"),
        (
            {"key": "k", "effect": "NoExecute", "tolerationSeconds": -1},
            {"key": "k", "effect": "NoExecute", "tolerationSeconds": 2**31},
        ),
    ),
    Mistake("whole-float-for-integer", "spec.hardware.nodes", _put("spec.hardware.nodes"), (1.0, 2.0)),
    Mistake("integer-past-int64", "spec.hardware.nodes", _put("spec.hardware.nodes"), (2**63, -(2**63) - 1)),
    # What the runtime refused only after loading the data.
    Mistake(
        "output-url-without-bucket", "spec.output.url", _put("spec.output"), ({"url": "s3:///x"}, {"url": "s3://"})
    ),
    Mistake("qa-stride-fills-the-window", "spec.task.docStride", _qa_stride, (64, 128, 4096)),
    # Device accounting and the runtime contract.
    Mistake(
        "env-device-visibility",
        "spec.env",
        _append("spec.env"),
        ({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "NEURON_RT_VISIBLE_CORES", "value": "0-31"}),
    ),
    Mistake(
        "env-from-reserved-prefix",
        "spec.envFrom",
        _append("spec.envFrom"),
        ({"configMapRef": {"name": "c"}, "prefix": "FTJOB_"}, {"secretRef": {"name": "s"}, "prefix": "NVIDIA_"}),
    ),
    # spec.podTemplate: what would override the operator's own, or make pods the API server refuses.
    Mistake(
        "template-reserved-label",
        "spec.podTemplate.metadata.labels",
        _put("spec.podTemplate"),
        tuple(
            {"metadata": {"labels": {k: "x"}}}
            for k in (
                "finetune.dev/role",
                "finetune.dev/other",
                "app.kubernetes.io/managed-by",
                "kueue.x-k8s.io/queue-name",
            )
        ),
    ),
    Mistake(
        "template-bad-label",
        "spec.podTemplate.metadata.labels",
        _put("spec.podTemplate"),
        ({"metadata": {"labels": {"team": "a b"}}}, {"metadata": {"labels": {"bad key": "v"}}}),
    ),
    Mistake(
        "template-reserved-annotation",
        "spec.podTemplate.metadata.annotations",
        _put("spec.podTemplate"),
        (
            {"metadata": {"annotations": {"finetune.dev/x": "1"}}},
            {"metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": "zone"}}},
            {"metadata": {"annotations": {"bad key": "1"}}},
            {"metadata": {"annotations": {"a": "x" * 65536}}},
        ),
    ),
    Mistake(
        "template-volume-collides",
        "spec.podTemplate.volumes",
        _put("spec.podTemplate"),
        (
            {"volumes": [{"name": "output", "emptyDir": {}}]},
            {"volumes": [{"name": "ssh", "secret": {"secretName": "mine"}}]},
            {"volumes": [{"name": "d", "emptyDir": {}}, {"name": "d", "emptyDir": {}}]},
            {"volumes": [{"name": "d", "emptyDir": {}, "secret": {"secretName": "s"}}]},
            {"volumes": [{"name": "d"}]},
            {"volumes": [{"name": "Data", "emptyDir": {}}]},
        ),
    ),
    Mistake(
        "template-mount-reserved-path",
        "spec.podTemplate.volumeMounts",
        _put("spec.podTemplate"),
        tuple(
            {"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": path}]}
            for path in ("/output", "/output/x", "/etc/ftjob/ssh", "/tmp", "/cache/a/b", "/dev/shm", "data", "/a/../b")
        ),
    ),
    Mistake(
        "template-mount-not-a-template-volume",
        "spec.podTemplate.volumeMounts",
        _put("spec.podTemplate"),
        (
            {"volumeMounts": [{"name": "output", "mountPath": "/results"}]},
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/a"}, {"name": "d", "mountPath": "/a"}],
            },
        ),
    ),
    Mistake(
        "template-container-collides",
        "spec.podTemplate.initContainers",
        _put("spec.podTemplate"),
        (
            {"initContainers": [{"name": "trainer"}]},
            {"initContainers": [{"name": "wait-for-peers"}]},
            {"initContainers": [{"name": "a"}, {"name": "a", "restartPolicy": "Always"}]},
            {"initContainers": [{"name": "a", "restartPolicy": "OnFailure"}]},
            {"initContainers": [{"name": "a", "volumeMounts": [{"name": "ssh", "mountPath": "/keys"}]}]},
        ),
    ),
    Mistake(
        "template-container-devices-or-env",
        "spec.podTemplate.initContainers",
        _put("spec.podTemplate"),
        (
            {"initContainers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
            {"initContainers": [{"name": "a", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]},
            {"initContainers": [{"name": "a", "resources": {"requests": {"memory": "lots"}}}]},
            {"initContainers": [{"name": "a", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]},
            {"initContainers": [{"name": "a", "env": [{"name": "FTJOB_MODE", "value": "precompile"}]}]},
            {"initContainers": [{"name": "a", "envFrom": [{"prefix": "CUDA_", "configMapRef": {"name": "c"}}]}]},
        ),
    ),
    Mistake(
        "template-security-context",
        "spec.podTemplate",
        _put("spec.podTemplate"),
        (
            {"securityContext": {"runAsUser": 0}},
            {"initContainers": [{"name": "a", "securityContext": {"privileged": True}}]},
        ),
    ),
    Mistake("template-roles-of-another-launcher", "spec.podTemplate.roles", _other_roles, (0,)),
    # metadata, which the CRD's schema cannot constrain.
    Mistake("kueue-queue-label", "metadata.labels", _put("metadata.labels"), ({"kueue.x-k8s.io/queue-name": "q"},)),
    Mistake("bad-label-value", "metadata.labels", _put("metadata.labels"), ({"app": "bad value"}, {"app": "x\n"})),
    Mistake("name-trailing-newline", "metadata.name", _put("metadata.name"), ("job\n",)),
    Mistake("image-trailing-newline", "spec.image", _put("spec.image"), ("registry.test/x:1\n",)),
]


@st.composite
def invalid_jobs(draw: st.DrawFn) -> tuple[Job, Mistake]:
    job = copy.deepcopy(draw(valid_jobs()))
    mistake = draw(st.sampled_from(MISTAKES))
    mistake.apply(job, draw(st.sampled_from(mistake.examples)))
    return job, mistake


def names_field(field: str, fields: list[str]) -> bool:
    """Whether an error list names `field` (itself, or a part of it such as spec.env[0].value)."""
    return any(f == field or f.startswith((field + ".", field + "[")) for f in fields)


# --- boundary values: every type the schema has, at and beyond its limits ------------------------------------
#
# No expected verdict here: a job changed at one to three places of the schema, each to a boundary value of the
# node's type (or a value of another type), is either accepted or refused, and `ftjob render` must say what the
# real API server says (tests/controlplane/test_validation_cluster.py). The unit tier checks that render never
# crashes on them (tests/unit/test_spec_properties.py).

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Where float64 stops holding every integer (JSON numbers pass through float64 in many decoders).
FLOAT_EXACT = 2**53
# Strings of every character class: controls (NUL, TAB, LF, DEL, C1's NEL), the spaces only Unicode calls space,
# letters outside ASCII, a character outside the Basic Multilingual Plane, and the RE2/Python differences
# (a trailing newline, which Python's `$` matches before).
ODD_CHARS = ("\x00", "\t", "\n", "\r", "\x7f", "\x85", "\xa0", "\u2028", "\u3000", "é", "中", "\U0001f600", "$", "'")
TYPE_SWAPS: tuple[Any, ...] = (None, True, 0, 1.5, "1", "", [], {}, [None], {"x": 1})


def schema_nodes(
    schema: dict[str, Any], path: tuple[str | int, ...] = ()
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every node of `schema` with the path that reaches it in a document: property names, 0 for an array's
    first item, "k" for a map's entry."""
    out = [(path, schema)] if path else []
    for key, sub in (schema.get("properties") or {}).items():
        out += schema_nodes(sub, (*path, key))
    if isinstance(schema.get("items"), dict):
        out += schema_nodes(schema["items"], (*path, 0))
    if isinstance(schema.get("additionalProperties"), dict):
        out += schema_nodes(schema["additionalProperties"], (*path, "k"))
    return out


def _numbers(node: dict[str, Any]) -> list[Any]:
    lo, hi = node.get("minimum"), node.get("maximum")
    vals: list[Any] = [0, -1, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, FLOAT_EXACT - 1, FLOAT_EXACT + 1]
    vals += [INT64_MAX, INT64_MAX + 1, INT64_MIN, INT64_MIN - 1, 2**64, 10**30]
    vals += [float("nan"), float("inf"), float("-inf"), -0.0, 1e-320, 1.7976931348623157e308, 0.5, 2.0]
    for bound in (lo, hi):
        if bound is not None:
            vals += [bound, bound - 1, bound + 1, float(bound), bound - 0.5, bound + 0.5]
    if node.get("type") == "integer":
        vals += [1.0, 2.0, 4294967295.0]
    return vals


def _strings(node: dict[str, Any], current: Any) -> list[Any]:
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    vals: list[Any] = ["", "a", "A", "-a", "a-", "a.b", "a/b", "a b", "1", "true", " a", "a "]
    vals += [c for c in ODD_CHARS] + ["a" + c for c in ODD_CHARS] + ["a" + c + "b" for c in ODD_CHARS]
    if isinstance(current, str) and current:
        vals += [current + "\n", current + " ", "\n" + current, current + "\x00", current.upper()]
    for n in {lo, max(lo - 1, 0), *((hi, hi + 1) if hi is not None else (256, 70000))}:
        vals += ["a" * n, "é" * n, "\U0001f600" * n]
    vals += [str(v) + "\n" for v in node.get("enum") or []] + [str(v).upper() for v in node.get("enum") or []]
    return vals


def boundary_values(node: dict[str, Any], current: Any) -> list[Any]:
    """Values at and beyond the limits of `node`'s type, and values of other types."""
    t = node.get("type")
    vals: list[Any] = list(TYPE_SWAPS)
    if node.get("x-kubernetes-int-or-string"):
        # Quantities: int64's edges, Kubernetes' 1E ceiling, suffixes, and RE2's end of text.
        vals += [INT64_MAX, INT64_MAX + 1, 2**64, 2.0, 0.5, float("nan"), "1e18", "1E", "999999999999999999999"]
        vals += ["1\n", "2Gi\n", "-1", "0.5m", "1Ki", "1ki", "+1", ".5", "1e-3", "a" * 65, "1" * 64]
    elif t in ("integer", "number"):
        vals += _numbers(node)
    elif t == "string":
        vals += _strings(node, current)
    elif t == "boolean":
        vals += [False, "false", 0]
    elif t == "array":
        item = copy.deepcopy(current[0]) if isinstance(current, list) and current else "a"
        vals += [[item] * (node.get("maxItems", 64) + 1), [item, None], [item, item]]
    elif t == "object":
        vals += [{"unknownField": 1}, {"k": None}, {"": "v"}]
    return vals


def _mutate(job: Job, path: tuple[Any, ...], value: Any) -> None:
    """Set `path` in job to value, making the missing parents (objects, or one-item lists)."""
    node: Any = job
    for part, nxt in itertools.pairwise(path):
        if isinstance(node, dict):
            if not isinstance(node.get(part), (dict, list)):
                node[part] = [] if nxt == 0 else {}
            node = node[part]
        else:  # a list, part == 0
            if not node or not isinstance(node[0], (dict, list)):
                node[:] = [[] if nxt == 0 else {}]
            node = node[0]
    last = path[-1]
    if isinstance(node, dict):
        node[last] = value
    elif node:
        node[0] = value
    else:
        node.append(value)


def _get(job: Job, path: tuple[Any, ...]) -> Any:
    node: Any = job
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and node and part == 0:
            node = node[0]
        else:
            return None
    return node


# metadata: ObjectMeta's fields the API server types and checks, and the kueue label (refused by the policy).
META_VALUES: dict[str, tuple[Any, ...]] = {
    "name": ("a" * 50, "a" * 51, "Job", "job\n", "job-", "1job", "j.b", 5, True, None, ["j"], "é"),
    "namespace": ("other", "Bad_NS", 5, None, ""),
    "labels": (
        {"app": "x"},
        {"app": 1},
        {"app": None},
        {"bad key": "v"},
        {"app": "bad value"},
        {"app": "v" * 64},
        {"a/" * 2 + "b": "v"},
        {"kueue.x-k8s.io/queue-name": "q"},
        {"app": "x\n"},
        "x",
        [],
    ),
    "annotations": ({"note": "anything at all\n"}, {"note": 1}, {"Upper/Key": "v"}, {"bad key": "v"}, {"n": None}),
    "finalizers": (["example.com/done"], ["bad finalizer"], "x"),
    "creationTimestamp": ("2026-01-02T03:04:05Z", "yesterday", None, 5),
    "generation": (1, 1.0, 1.5, "1", 2**63),
    "unknownField": ("x",),
}


@st.composite
def boundary_jobs(draw: st.DrawFn, under: str | None = None) -> Job:
    """A valid job changed at one to three places to boundary values, or to values of another type. With `under`
    (a spec field, e.g. podTemplate), only there, in a job that has the field."""
    from finetune_operator.api.schema import SPEC

    job = copy.deepcopy(draw(valid_jobs()))
    nodes = schema_nodes(SPEC, ("spec",))
    if under is not None:
        nodes = [(path, node) for path, node in nodes if path[:2] == ("spec", under)]
        if under == "podTemplate" and "podTemplate" not in job["spec"]:
            mpi = job["spec"].get("launcher", profiles.get(_hw(job)["profile"]).default_launcher) == "mpi"
            job["spec"]["podTemplate"] = draw(pod_templates(mpi))
    for _ in range(draw(st.integers(1, 3))):
        if under is None and draw(st.integers(0, 5)) == 0:
            key = draw(st.sampled_from(sorted(META_VALUES)))
            job["metadata"][key] = copy.deepcopy(draw(st.sampled_from(META_VALUES[key])))
            continue
        path, node = draw(st.sampled_from(nodes))
        value = draw(st.sampled_from(boundary_values(node, _get(job, path))))
        _mutate(job, path, copy.deepcopy(value))
    return job
