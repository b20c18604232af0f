"""Admission rules of spec.podTemplate (CEL for the CRD, with their Python twins for `ftjob render`): a template
may add to the pods, never override what the operator derives, and never make a pod the API server refuses.

What the operator sets is derived by rendering every shape of job the builders know (reserved_env.py's shapes,
with claims for the output, the resume source and the compile cache), as reserved_env derives its variables: a
label, volume, mount path or container a builder starts setting is reserved without a list to keep in step.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from .. import constants as c
from .. import profiles
from ..api import formats as f
from ..api.podrules import ENV_CEL, ENVFROM_SOURCES, QUANTITY_CEILING, quantities_ok, requests_within_limits, valid_env
from ..api.rules import Rule
from ..api.schema import POD_TEMPLATE_ANNOTATION_CHARS, PROFILES, VOLUME_SOURCES
from . import desired
from .podtemplate import DEFAULT_ROLES
from .reserved_env import DEVICE_ENV, RESERVED_PREFIX, SHAPE_KEYS, shapes

Obj = dict[str, Any]
SCOPE = "spec.podTemplate"
# Label and annotation prefixes a template may not use: the operator's own group (its labels, present and future),
# and Kueue's (the operator queues the job through its Workload; Kueue's queue-name or pod-group labels on the
# pods would have Kueue's pod integration queue them a second time, and its annotations there would be read by
# nothing).
RESERVED_KEY_PREFIXES = (f"{c.GROUP}/", f"{c.KUEUE_GROUP}/")
# Resources a user's container may request: no devices (those are the ranks', counted from their processes),
# no hugepages.
CONTAINER_RESOURCES = f.NATIVE_RESOURCES


def _jobs() -> list[Obj]:
    jobs = []
    for profile in PROFILES:
        for job in shapes(profile):
            jobs.append(job)
            claims = {**job, "spec": dict(job["spec"])}
            if "task" in job["spec"]:
                claims["spec"]["output"] = {"claimName": "o", "resumeFrom": "pvc://o/old"}
            claims["spec"]["compileCache"] = {**(job["spec"].get("compileCache") or {}), "claimName": "k"}
            jobs.append(claims)
    return jobs


@functools.cache
def reserved() -> dict[str, tuple[str, ...]]:
    """What the builders set in any pod of any shape: labels, annotations, volumes, mount paths, containers."""
    found: dict[str, set[str]] = {k: set() for k in ("labels", "annotations", "volumes", "paths", "containers")}
    for job in _jobs():
        for pod in desired(job, ssh_keys=SHAPE_KEYS).pods:
            found["labels"].update(pod["metadata"].get("labels") or {})
            found["annotations"].update(pod["metadata"].get("annotations") or {})
            found["volumes"].update(v["name"] for v in pod["spec"].get("volumes") or [])
            for ctr in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
                found["containers"].add(ctr["name"])
                found["paths"].update(m["mountPath"] for m in ctr.get("volumeMounts") or [])
    out = {k: tuple(sorted(v)) for k, v in found.items()}
    # A path under another is reserved with it (/etc/ftjob/ssh under /etc/ftjob).
    out["paths"] = tuple(p for p in out["paths"] if not _under(p, tuple(r for r in out["paths"] if r != p)))
    return out


def _cel_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def _reserved_key(k: str, own: tuple[str, ...]) -> bool:
    return k in own or k.startswith(RESERVED_KEY_PREFIXES)


def _key_cel(var: str, own: tuple[str, ...]) -> str:
    prefixes = " || ".join(f"{var}.startsWith('{p}')" for p in RESERVED_KEY_PREFIXES)
    return f"!({var} in {_cel_list(own)} || {prefixes})"


def _lower_ascii(k: str) -> str:
    """CEL's lowerAscii(): only A-Z change (Python's lower() also maps e.g. the Kelvin sign to k)."""
    return "".join(ch.lower() if "A" <= ch <= "Z" else ch for ch in k)


def _meta(t: Obj, key: str) -> Obj:
    return dict((t.get("metadata") or {}).get(key) or {})


def _containers(t: Obj) -> list[Obj]:
    return list(t.get("initContainers") or [])


def _volume_names(t: Obj) -> list[str]:
    return [str(v.get("name")) for v in t.get("volumes") or []]


def _paths_unique(mounts: list[Obj]) -> bool:
    paths = [m.get("mountPath") for m in mounts]
    return len(paths) == len(set(paths))


def _env_reserved(name: str) -> bool:
    return name.startswith(RESERVED_PREFIX) or name in DEVICE_ENV


def _prefix_reserved(prefix: str) -> bool:
    if not prefix:
        return False
    return (
        prefix.startswith(RESERVED_PREFIX)
        or RESERVED_PREFIX.startswith(prefix)
        or any(len(n) > len(prefix) and n.startswith(prefix) for n in DEVICE_ENV)
    )


def _roles_of(spec: Obj) -> tuple[str, ...]:
    mpi = spec.get("launcher") == "mpi" or (
        "launcher" not in spec and (spec.get("hardware") or {}).get("profile") in profiles.default_mpi_profiles()
    )
    return (c.ROLE_WORKER, c.ROLE_LAUNCHER) if mpi else (c.ROLE_RANK,)


def pod_template_rules() -> list[Rule]:
    """Every rule on spec.podTemplate but its immutability (rules.py's frozen blocks)."""
    own = reserved()
    labels, volumes, paths, containers = own["labels"], own["volumes"], own["paths"], own["containers"]
    mpi_profiles = _cel_list(profiles.default_mpi_profiles())
    lm = "self.metadata.labels"
    am = "self.metadata.annotations"
    has_labels = f"!has(self.metadata) || !has({lm})"
    has_annotations = f"!has(self.metadata) || !has({am})"
    resource_names = _cel_list(CONTAINER_RESOURCES)

    def qty(m: str) -> str:
        v = f"string({m}[k])"
        return (
            f"{m}.all(k, isQuantity({v}) && quantity({v}).compareTo(quantity('0')) >= 0 && "
            f"quantity({v}).isLessThan(quantity('{QUANTITY_CEILING}')))"
        )

    sources = " + ".join(f"(has(v.{s}) ? 1 : 0)" for s in VOLUME_SOURCES)
    return [
        Rule(
            "pod-template-label-keys",
            SCOPE,
            f"{has_labels} || {lm}.all(k, {f.qualified_name_cel('k')})",
            ".metadata.labels",
            "spec.podTemplate.metadata.labels keys must be label keys: an optional DNS prefix and '/', then at most "
            "63 letters, digits, '-', '_' or '.' starting and ending with a letter or digit (e.g. team or "
            "example.com/team)",
            lambda t: all(f.is_qualified_name(k) for k in _meta(t, "labels")),
        ),
        Rule(
            "pod-template-labels-not-reserved",
            SCOPE,
            f"{has_labels} || {lm}.all(k, {_key_cel('k', labels)})",
            ".metadata.labels",
            "spec.podTemplate.metadata.labels may not set the operator's own labels "
            f"({', '.join(labels)}) nor any key under {' or '.join(RESERVED_KEY_PREFIXES)} (the operator finds, "
            "restarts and counts its pods by them; to queue the job, set spec.runPolicy.queueName): choose "
            "another key",
            lambda t: not any(_reserved_key(k, labels) for k in _meta(t, "labels")),
        ),
        Rule(
            "pod-template-annotation-keys",
            SCOPE,
            f"{has_annotations} || {am}.all(k, {f.qualified_name_cel('k.lowerAscii()')} && "
            f"{_key_cel('k', own['annotations'])})",
            ".metadata.annotations",
            "spec.podTemplate.metadata.annotations keys must be annotation keys (label keys, e.g. "
            f"karpenter.sh/do-not-disrupt), not under {' or '.join(RESERVED_KEY_PREFIXES)} (the operator's and "
            "Kueue's own): choose another key",
            lambda t: all(
                f.is_qualified_name(_lower_ascii(k)) and not _reserved_key(k, own["annotations"])
                for k in _meta(t, "annotations")
            ),
        ),
        Rule(
            "pod-template-annotations-size",
            SCOPE,
            f"{has_annotations} || {am}.map(k, size(k) + size({am}[k])).sum() <= {POD_TEMPLATE_ANNOTATION_CHARS}",
            ".metadata.annotations",
            f"spec.podTemplate.metadata.annotations may hold at most {POD_TEMPLATE_ANNOTATION_CHARS} characters, "
            "keys and values together (a pod's annotations are limited to 256 KiB): shorten them",
            lambda t: sum(len(k) + len(v) for k, v in _meta(t, "annotations").items()) <= POD_TEMPLATE_ANNOTATION_CHARS,
        ),
        Rule(
            "pod-template-roles",
            "spec",
            f"!has(self.podTemplate) || !has(self.podTemplate.roles) || self.podTemplate.roles.all(r, "
            f"(has(self.launcher) ? self.launcher == 'mpi' : self.hardware.profile in {mpi_profiles}) ? "
            f"r in ['{c.ROLE_WORKER}', '{c.ROLE_LAUNCHER}'] : r == '{c.ROLE_RANK}')",
            ".podTemplate.roles",
            f"spec.podTemplate.roles names pods the job does not have: a torchrun job has {c.ROLE_RANK} pods, an "
            f"MPI job (spec.launcher: mpi, or the profile's default) {c.ROLE_WORKER} and {c.ROLE_LAUNCHER} pods; "
            f"remove the others (absent: the pods that hold ranks, {' or '.join(DEFAULT_ROLES)})",
            lambda s: not _has_roles(s) or all(r in _roles_of(s) for r in s["podTemplate"]["roles"]),
        ),
        Rule(
            "pod-template-volume-names",
            SCOPE,
            f"!has(self.volumes) || self.volumes.all(v, !(v.name in {_cel_list(volumes)}) && "
            "self.volumes.exists_one(w, w.name == v.name))",
            ".volumes",
            "spec.podTemplate.volumes names must be unique and not the operator's own volumes "
            f"({', '.join(volumes)}): rename the volume",
            lambda t: (
                not any(n in volumes for n in _volume_names(t)) and len(set(_volume_names(t))) == len(_volume_names(t))
            ),
        ),
        Rule(
            "pod-template-volume-source",
            SCOPE,
            f"!has(self.volumes) || self.volumes.all(v, {sources} == 1)",
            ".volumes",
            "each spec.podTemplate.volumes entry needs exactly one source besides its name, e.g. "
            "persistentVolumeClaim: {claimName: datasets}, configMap: {name: ...} or emptyDir: {}",
            lambda t: all(sum(s in v for s in VOLUME_SOURCES) == 1 for v in t.get("volumes") or []),
        ),
        Rule(
            "pod-template-mounts-name-volumes",
            SCOPE,
            "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
            "self.volumes.exists(v, v.name == m.name))",
            ".volumeMounts",
            "spec.podTemplate.volumeMounts may mount only volumes of spec.podTemplate.volumes (the operator's own "
            "volumes, such as output and ssh, stay its own): add the volume, or fix the name",
            lambda t: all(m.get("name") in _volume_names(t) for m in t.get("volumeMounts") or []),
        ),
        Rule(
            "pod-template-container-mounts-name-volumes",
            SCOPE,
            "!has(self.initContainers) || self.initContainers.all(x, !has(x.volumeMounts) || "
            "x.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name)))",
            ".initContainers",
            "the volumeMounts of spec.podTemplate.initContainers may mount only volumes of "
            "spec.podTemplate.volumes (the operator's own volumes, such as output and ssh, stay its own): add the "
            "volume, or fix the name",
            lambda t: all(
                m.get("name") in _volume_names(t) for x in _containers(t) for m in x.get("volumeMounts") or []
            ),
        ),
        Rule(
            "pod-template-mount-paths",
            SCOPE,
            f"!has(self.volumeMounts) || self.volumeMounts.all(m, !{_cel_list(paths)}.exists(r, "
            "m.mountPath == r || m.mountPath.startsWith(r + '/')) && "
            "self.volumeMounts.exists_one(n, n.mountPath == m.mountPath))",
            ".volumeMounts",
            "spec.podTemplate.volumeMounts go into the operator's containers: each mountPath must be unique and "
            f"neither one of the paths the operator mounts ({', '.join(paths)}) nor under one; mount elsewhere, "
            "e.g. /data",
            lambda t: (
                not any(_under(str(m.get("mountPath")), paths) for m in t.get("volumeMounts") or [])
                and _paths_unique(list(t.get("volumeMounts") or []))
            ),
        ),
        Rule(
            "pod-template-container-names",
            SCOPE,
            f"!has(self.initContainers) || self.initContainers.all(x, !(x.name in {_cel_list(containers)}) && "
            "self.initContainers.exists_one(y, y.name == x.name))",
            ".initContainers",
            "spec.podTemplate.initContainers names must be unique and not the operator's own containers "
            f"({', '.join(containers)}): rename the container",
            lambda t: (
                not any(x.get("name") in containers for x in _containers(t))
                and len({x.get("name") for x in _containers(t)}) == len(_containers(t))
            ),
        ),
        Rule(
            "pod-template-container-mount-paths",
            SCOPE,
            "!has(self.initContainers) || self.initContainers.all(x, !has(x.volumeMounts) || "
            "x.volumeMounts.all(m, x.volumeMounts.exists_one(n, n.mountPath == m.mountPath)))",
            ".initContainers",
            "each container of spec.podTemplate.initContainers needs a different mountPath for each of its "
            "volumeMounts",
            lambda t: all(_paths_unique(list(x.get("volumeMounts") or [])) for x in _containers(t)),
        ),
        Rule(
            "pod-template-container-resources",
            SCOPE,
            "!has(self.initContainers) || self.initContainers.all(x, !has(x.resources) || "
            f"((!has(x.resources.requests) || x.resources.requests.all(k, k in {resource_names})) && "
            f"(!has(x.resources.limits) || x.resources.limits.all(k, k in {resource_names})) && "
            f"(!has(x.resources.requests) || {qty('x.resources.requests')}) && "
            f"(!has(x.resources.limits) || {qty('x.resources.limits')}) && "
            "(!has(x.resources.requests) || !has(x.resources.limits) || x.resources.requests.all(k, "
            "!(k in x.resources.limits) || !isQuantity(string(x.resources.requests[k])) || "
            "!isQuantity(string(x.resources.limits[k])) || quantity(string(x.resources.requests[k]))"
            ".compareTo(quantity(string(x.resources.limits[k]))) <= 0))))",
            ".initContainers",
            "the resources of spec.podTemplate.initContainers may name only cpu, memory and ephemeral-storage "
            "(devices belong to the ranks: spec.hardware), as non-negative quantities below 1E such as 100m or "
            "64Mi, with requests not above limits",
            lambda t: all(_resources_ok(x.get("resources") or {}) for x in _containers(t)),
        ),
        Rule(
            "pod-template-container-env",
            SCOPE,
            f"!has(self.initContainers) || self.initContainers.all(x, (!has(x.env) || x.env.all(e, {ENV_CEL})) && "
            "(!has(x.envFrom) || x.envFrom.all(e, "
            + " + ".join(f"(has(e.{s}) ? 1 : 0)" for s in ENVFROM_SOURCES)
            + " == 1)))",
            ".initContainers",
            "each env entry of spec.podTemplate.initContainers sets either value or valueFrom with exactly one "
            "source (as spec.env), and each envFrom entry names exactly one of configMapRef and secretRef",
            lambda t: all(
                all(valid_env(e) for e in x.get("env") or [])
                and all(sum(k in e for k in ENVFROM_SOURCES) == 1 for e in x.get("envFrom") or [])
                for x in _containers(t)
            ),
        ),
        Rule(
            "pod-template-container-env-not-reserved",
            SCOPE,
            "!has(self.initContainers) || self.initContainers.all(x, (!has(x.env) || x.env.all(e, "
            f"!e.name.startsWith('{RESERVED_PREFIX}') && !(e.name in {_cel_list(DEVICE_ENV)}))) && "
            "(!has(x.envFrom) || x.envFrom.all(e, !has(e.prefix) || e.prefix == '' || "
            f"(!e.prefix.startsWith('{RESERVED_PREFIX}') && !'{RESERVED_PREFIX}'.startsWith(e.prefix) && "
            f"!{_cel_list(DEVICE_ENV)}.exists(n, size(n) > size(e.prefix) && n.startsWith(e.prefix))))))",
            ".initContainers",
            f"the env of spec.podTemplate.initContainers may not set {RESERVED_PREFIX}* (the runtime's contract) "
            f"nor a device-visibility variable ({', '.join(DEVICE_ENV)}: the device plugins' and container "
            "toolkits' own, which would hand the container devices outside the scheduler's accounting), nor an "
            "envFrom prefix that could make one; rename them",
            lambda t: all(
                not any(_env_reserved(str(e.get("name", ""))) for e in x.get("env") or [])
                and not any(_prefix_reserved(str(e.get("prefix") or "")) for e in x.get("envFrom") or [])
                for x in _containers(t)
            ),
        ),
        Rule(
            "pod-template-no-security-context",
            SCOPE,
            "!has(self.securityContext) && (!has(self.initContainers) || "
            "self.initContainers.all(x, !has(x.securityContext)))",
            ".securityContext",
            "spec.podTemplate may not set a securityContext (of the pod or of an init container): the operator "
            "sets them (the profile's non-root user, seccomp RuntimeDefault, no privilege escalation, every "
            "capability dropped, as Pod Security's restricted profile asks); remove it",
            lambda t: "securityContext" not in t and not any("securityContext" in x for x in _containers(t)),
        ),
    ]


def _has_roles(spec: Obj) -> bool:
    return bool((spec.get("podTemplate") or {}).get("roles"))


def _resources_ok(r: Obj) -> bool:
    req, lim = dict(r.get("requests") or {}), dict(r.get("limits") or {})
    return (
        all(k in CONTAINER_RESOURCES for k in itertools.chain(req, lim))
        and quantities_ok(req)
        and quantities_ok(lim)
        and requests_within_limits(r)
    )
