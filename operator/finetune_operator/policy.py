"""Operator-side allowlists (the chart's `policy` values, the config file's `policy:` block).

`create` on finetunejobs amounts to creating pods in the namespace: with any image, any ServiceAccount and any
Secret there, on any node the pods tolerate and select (docs/operator.md, "Who may create a job"). These lists
narrow that: a job naming an image, ServiceAccount, Secret, claim, toleration, node label, scheduler, volume type
or priority class outside them, or lacking a queue its namespace requires, ends Failed/PolicyViolation before
any child is created. An empty or absent list allows everything (the default), but for allowedVolumeTypes,
whose default is the volume types Pod Security's restricted profile allows (no hostPath), and
allowedSidecarImages, whose default is allowedImages. Pure: reconcile.py calls `violations()` on every
unfinished pass, so tightening a list also stops running jobs that break it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

REASON = "PolicyViolation"  # status.reason and the Event's reason of a job that breaks an allowlist
# Config keys, read by reconcile (through violations()) and written by the chart's ConfigMap template.
IMAGES, SERVICE_ACCOUNTS, SECRETS = "allowedImages", "allowedServiceAccounts", "allowedSecrets"
CLAIMS = "allowedClaims"  # [{namespaces: [glob], claims: [glob], purposes: [output|compileCache]}]
TOLERATION_KEYS = "allowedTolerationKeys"  # spec.hardware.tolerations[].key
NODE_LABELS = "allowedNodeLabels"  # "key=value" globs for spec.hardware.nodeSelector and node affinity
SCHEDULERS = "allowedSchedulerNames"  # spec.hardware.schedulerName
QUEUE_REQUIRED = "queueRequiredNamespaces"  # namespaces whose jobs must set spec.runPolicy.queueName
# spec.podTemplate (builders/podtemplate.py):
VOLUME_TYPES = "allowedVolumeTypes"  # the source of each spec.podTemplate.volumes entry (hostPath, csi, ...)
SIDECAR_IMAGES = "allowedSidecarImages"  # images of spec.podTemplate.initContainers; default: allowedImages
PRIORITY_CLASSES = "allowedPriorityClasses"  # spec.podTemplate.priorityClassName
GLOB_LISTS = (
    IMAGES,
    SERVICE_ACCOUNTS,
    SECRETS,
    TOLERATION_KEYS,
    NODE_LABELS,
    SCHEDULERS,
    QUEUE_REQUIRED,
    VOLUME_TYPES,
    SIDECAR_IMAGES,
    PRIORITY_CLASSES,
)
KEYS = (*GLOB_LISTS[:3], CLAIMS, *GLOB_LISTS[3:])
DEFAULT_SERVICE_ACCOUNT = "default"  # what a pod without serviceAccountName runs as
# allowedVolumeTypes when empty or absent: the inline volume sources Pod Security's restricted profile allows
# (k8s.io/pod-security-admission, check restrictedVolumes), so a job's pods pass a restricted namespace and no
# job mounts a node's files (hostPath) or a storage backend directly (nfs, iscsi, ...).
DEFAULT_VOLUME_TYPES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
# What a spec mounts from a PersistentVolumeClaim, by purpose (an allowedClaims entry's `purposes`).
CLAIM_PURPOSES = {
    "output": "spec.output.claimName",
    "compileCache": "spec.compileCache.claimName",
    "volume": "spec.podTemplate.volumes[].persistentVolumeClaim.claimName",
}
CLAIM_ENTRY_KEYS = ("namespaces", "claims", "purposes")


def _allowed(value: str, patterns: list[str]) -> bool:
    # Shell-style globs: `*` matches across `/`, so "registry.example.com/team/*" allows a whole prefix.
    return any(fnmatchcase(value, p) for p in patterns)


def _env_secrets(where: str, container: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i, src in enumerate(_dicts(container.get("envFrom"))):
        if isinstance(src.get("secretRef"), Mapping) and src["secretRef"].get("name"):
            out.append((f"{where}.envFrom[{i}].secretRef.name", str(src["secretRef"]["name"])))
    for i, var in enumerate(_dicts(container.get("env"))):
        ref = (var.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name"):
            out.append((f"{where}.env[{i}].valueFrom.secretKeyRef.name", str(ref["name"])))
    return out


def _template(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    tpl = spec.get("podTemplate")
    return tpl if isinstance(tpl, Mapping) else {}


def _volumes(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for i, vol in enumerate(_dicts(_template(spec).get("volumes"))):
        yield f"spec.podTemplate.volumes[{i}]", vol


def _volume_secrets(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Secrets a template's volumes mount: secret volumes, and projected volumes' secret sources (passed through
    unchecked, so read with care)."""
    out: list[tuple[str, str]] = []
    for where, vol in _volumes(spec):
        secret = vol.get("secret")
        if isinstance(secret, Mapping) and secret.get("secretName"):
            out.append((f"{where}.secret.secretName", str(secret["secretName"])))
        projected = vol.get("projected")
        sources = projected.get("sources") if isinstance(projected, Mapping) else None
        for j, src in enumerate(_dicts(sources)):
            ref = src.get("secret")
            if isinstance(ref, Mapping) and ref.get("name"):
                out.append((f"{where}.projected.sources[{j}].secret.name", str(ref["name"])))
    return out


def secrets_of(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, Secret name) of every Secret the job's pods would read."""
    out: list[tuple[str, str]] = []
    if (spec.get("hfTokenSecretRef") or {}).get("name"):
        out.append(("spec.hfTokenSecretRef.name", spec["hfTokenSecretRef"]["name"]))
    out += _env_secrets("spec", spec)
    for i, ctr in enumerate(_dicts(_template(spec).get("initContainers"))):
        out += _env_secrets(f"spec.podTemplate.initContainers[{i}]", ctr)
    # The kubelet reads these for the pods: registry credentials are the namespace's Secrets too.
    for i, ref in enumerate(_dicts(_template(spec).get("imagePullSecrets"))):
        if ref.get("name"):
            out.append((f"spec.podTemplate.imagePullSecrets[{i}].name", str(ref["name"])))
    return out + _volume_secrets(spec)


def claims_of(spec: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(purpose, field, claim name) of every PersistentVolumeClaim the job's pods would mount."""
    out = []
    for purpose in ("output", "compileCache"):
        name = (spec.get(purpose) or {}).get("claimName")
        if name:
            out.append((purpose, CLAIM_PURPOSES[purpose], str(name)))
    for where, vol in _volumes(spec):
        pvc = vol.get("persistentVolumeClaim")
        if isinstance(pvc, Mapping) and pvc.get("claimName"):
            out.append(("volume", f"{where}.persistentVolumeClaim.claimName", str(pvc["claimName"])))
    return out


def _claim_allowed(purpose: str, claim: str, namespace: str, entries: list[Mapping[str, Any]]) -> bool:
    return any(
        _allowed(namespace, list(e.get("namespaces") or ["*"]))
        and _allowed(claim, list(e.get("claims") or []))
        and purpose in (e.get("purposes") or CLAIM_PURPOSES)
        for e in entries
    )


def _dicts(value: Any) -> Iterator[Mapping[str, Any]]:
    """The mappings in `value` when it is a list (a pass-through field may hold anything)."""
    if isinstance(value, list):
        yield from (v for v in value if isinstance(v, Mapping))


def node_terms(affinity: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(field, node selector term) of spec.hardware.affinity's nodeAffinity, required and preferred."""
    node = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    if not isinstance(node, Mapping):
        return
    base = "spec.hardware.affinity.nodeAffinity"
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, Mapping):
        for i, term in enumerate(_dicts(required.get("nodeSelectorTerms"))):
            yield f"{base}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]", term
    for i, pref in enumerate(_dicts(node.get("preferredDuringSchedulingIgnoredDuringExecution"))):
        if isinstance(pref.get("preference"), Mapping):
            yield f"{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference", pref["preference"]


def _label_allowed(key: str, value: str | None, patterns: list[str]) -> bool:
    """`key=value` against "keyglob=valueglob" patterns (a pattern without '=' allows any value of its keys).
    value None: an expression that may select any value of the key (Exists, NotIn, Gt, ...), which only a
    pattern whose value part is exactly `*` allows."""
    for p in patterns:
        kglob, eq, vglob = p.partition("=")
        vglob = vglob if eq else "*"
        if fnmatchcase(key, kglob) and (vglob == "*" if value is None else fnmatchcase(value, vglob)):
            return True
    return False


def _selection(spec: Mapping[str, Any]) -> Iterator[tuple[str, str, str | None]]:
    """(field, label key, value or None for "any value") of every node label the job's pods select by."""
    hw = spec.get("hardware") or {}
    for k, v in (hw.get("nodeSelector") or {}).items():
        yield f"spec.hardware.nodeSelector[{k}]", str(k), str(v)
    for field, term in node_terms(hw.get("affinity")):
        for kind in ("matchExpressions", "matchFields"):
            for i, expr in enumerate(_dicts(term.get(kind))):
                key, op, values = str(expr.get("key", "")), expr.get("operator"), expr.get("values")
                where = f"{field}.{kind}[{i}]"
                if op == "In" and isinstance(values, list):
                    yield from ((where, key, str(v)) for v in values)
                else:
                    yield where, key, None


def _glob_list(policy: Mapping[str, Any], key: str) -> list[str]:
    return [str(x) for x in policy.get(key) or []]


def _scheduling_violations(spec: Mapping[str, Any], policy: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    hw = spec.get("hardware") or {}
    keys = _glob_list(policy, TOLERATION_KEYS)
    for i, t in enumerate(hw.get("tolerations") or [] if keys else []):
        key = str(t.get("key") or "")
        if not _allowed(key, keys):
            what = f"key {key!r}" if key else "an empty key (every taint)"
            out.append(
                f"spec.hardware.tolerations[{i}] with {what} is not allowed by the operator's policy."
                f"{TOLERATION_KEYS} {keys}: tolerate only those taints (the profile's own tolerations are always "
                "added)"
            )
    labels = _glob_list(policy, NODE_LABELS)
    for field, key, value in _selection(spec) if labels else []:
        if not _label_allowed(key, value, labels):
            what = f"{key}={value}" if value is not None else f"any value of {key}"
            out.append(
                f"{field} selects nodes by {what!r}, which the operator's policy.{NODE_LABELS} {labels} does not "
                "allow: select only those labels (an expression other than In needs a pattern `<key>=*`); the "
                "profile's and instance type's selectors are always added"
            )
    schedulers = _glob_list(policy, SCHEDULERS)
    name = hw.get("schedulerName")
    if schedulers and name and not _allowed(str(name), schedulers):
        out.append(
            f"spec.hardware.schedulerName {name!r} is not allowed by the operator's policy.{SCHEDULERS} "
            f"{schedulers}: name one of those schedulers, or leave it out for the cluster's default scheduler"
        )
    return out


def volume_type(vol: Mapping[str, Any]) -> str:
    """A volume's source (the key beside its name); admission lets only volumes with exactly one through."""
    return next((str(k) for k in vol if k != "name"), "")


def _template_violations(spec: Mapping[str, Any], policy: Mapping[str, Any]) -> list[str]:
    """spec.podTemplate: volume types, the images of init containers and sidecars, the priority class."""
    out: list[str] = []
    types = _glob_list(policy, VOLUME_TYPES) or list(DEFAULT_VOLUME_TYPES)
    for where, vol in _volumes(spec):
        kind = volume_type(vol)
        if not _allowed(kind, types):
            default = "" if policy.get(VOLUME_TYPES) else " (the default: Pod Security restricted's types)"
            out.append(
                f"{where} is a {kind} volume, which the operator's policy.{VOLUME_TYPES} {types}{default} does not "
                "allow: use one of those types (e.g. a persistentVolumeClaim for a dataset)"
            )
    own = _glob_list(policy, SIDECAR_IMAGES)
    images, key = (own, SIDECAR_IMAGES) if own else (_glob_list(policy, IMAGES), IMAGES)
    for i, ctr in enumerate(_dicts(_template(spec).get("initContainers")) if images else []):
        image = ctr.get("image")
        if image and not _allowed(str(image), images):
            out.append(
                f"spec.podTemplate.initContainers[{i}].image {image!r} is not allowed by the operator's "
                f"policy.{key} {images}: use a matching image, or leave it empty for the job's image"
            )
    classes = _glob_list(policy, PRIORITY_CLASSES)
    name = _template(spec).get("priorityClassName")
    if classes and name and not _allowed(str(name), classes):
        out.append(
            f"spec.podTemplate.priorityClassName {name!r} is not allowed by the operator's "
            f"policy.{PRIORITY_CLASSES} {classes}: name one of those PriorityClasses, or leave it out for the "
            "cluster's default priority"
        )
    return out


def violations(spec: Mapping[str, Any], config: Mapping[str, Any], namespace: str) -> list[str]:
    """One message per field that breaks the operator's allowlists, each naming the field, the value, the
    allowlist and the fix. The profiles' default images (the operator's own configuration) are always allowed:
    only spec.image is checked. `namespace` is the job's: the rules given for some namespaces only
    (allowedClaims entries with `namespaces`, queueRequiredNamespaces) match a glob against it."""
    policy: Mapping[str, Any] = config.get("policy") or {}
    ns = namespace
    out: list[str] = []
    images = _glob_list(policy, IMAGES)
    if images and spec.get("image") and not _allowed(str(spec["image"]), images):
        out.append(
            f"spec.image {spec['image']!r} is not allowed by the operator's policy.{IMAGES} {images}: "
            "use a matching image, or leave spec.image empty for the profile's default"
        )
    accounts = _glob_list(policy, SERVICE_ACCOUNTS)
    account = str(spec.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT)
    if accounts and not _allowed(account, accounts):
        out.append(
            f"spec.serviceAccountName {account!r} is not allowed by the operator's "
            f"policy.{SERVICE_ACCOUNTS} {accounts}: name one of those ServiceAccounts"
        )
    secrets = _glob_list(policy, SECRETS)
    for field, name in secrets_of(spec) if secrets else []:
        if not _allowed(name, secrets):
            out.append(
                f"{field} {name!r} is not allowed by the operator's policy.{SECRETS} {secrets}: "
                "reference one of those Secrets"
            )
    entries = [e for e in policy.get(CLAIMS) or [] if isinstance(e, Mapping)]
    for purpose, field, claim in claims_of(spec) if entries else []:
        if not _claim_allowed(purpose, claim, ns, entries):
            usable = sorted(
                {
                    c
                    for e in entries
                    if _allowed(ns, list(e.get("namespaces") or ["*"]))
                    and purpose in (e.get("purposes") or CLAIM_PURPOSES)
                    for c in e.get("claims") or []
                }
            )
            out.append(
                f"{field} {claim!r} is not allowed for {purpose} in namespace {ns!r} by the operator's "
                f"policy.{CLAIMS}: name a claim listed there for {purpose}"
                + (f" (e.g. {', '.join(usable)})" if usable else "")
            )
    out += _scheduling_violations(spec, policy)
    out += _template_violations(spec, policy)
    required = _glob_list(policy, QUEUE_REQUIRED)
    if required and not (spec.get("runPolicy") or {}).get("queueName") and _allowed(ns, required):
        out.append(
            f"spec.runPolicy.queueName is required in namespace {ns!r} by the operator's policy.{QUEUE_REQUIRED} "
            f"{required}: name the Kueue LocalQueue the job waits in"
        )
    return out


def _check_claims(value: Any) -> list[str]:
    if not isinstance(value, list):
        return [f"policy.{CLAIMS}: expected a list of {{namespaces, claims, purposes}} entries, got {value!r}"]
    out = []
    for i, e in enumerate(value):
        where = f"policy.{CLAIMS}[{i}]"
        if not isinstance(e, Mapping):
            out.append(f"{where}: expected a mapping with claims (and optionally namespaces, purposes)")
            continue
        out += [
            f"{where}.{k}: unknown key (known: {', '.join(CLAIM_ENTRY_KEYS)})" for k in e if k not in CLAIM_ENTRY_KEYS
        ]
        for k in CLAIM_ENTRY_KEYS:
            v = e.get(k)
            if (k == "claims" or v is not None) and not (
                isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)
            ):
                out.append(f"{where}.{k}: expected a non-empty list of non-empty strings, got {v!r}")
        bad = [p for p in e.get("purposes") or [] if p not in CLAIM_PURPOSES]
        if bad:
            out.append(f"{where}.purposes: unknown {bad} (known: {', '.join(CLAIM_PURPOSES)})")
    return out


def check_config(config: Mapping[str, Any]) -> list[str]:
    """Problems with the config file's `policy:` block (the operator refuses to start with any)."""
    policy = config.get("policy")
    if policy is None:
        return []
    if not isinstance(policy, Mapping):
        return [f"policy: expected a mapping with {', '.join(KEYS)}"]
    out = [f"policy.{k}: unknown key (known: {', '.join(KEYS)})" for k in policy if k not in KEYS]
    for k in GLOB_LISTS:
        v = policy.get(k)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) and x for x in v)):
            out.append(f"policy.{k}: expected a list of non-empty strings (globs), got {v!r}")
    if policy.get(CLAIMS) is not None:
        out += _check_claims(policy[CLAIMS])
    return out
