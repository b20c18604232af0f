"""Rules on the fields passed through into the pods (resources, env, tolerations, node selector), written as CEL
for the CRD and as Python for admission, from the formats in formats.py. They are the pod's own validation,
moved up front: a spec that passes them makes pods the API server accepts, so no job is left retrying a pod
create that can never succeed (what still slips through ends the job Failed/InvalidSpec: refusal.py).
"""

from __future__ import annotations

from typing import Any

from . import formats as f
from .rules import Rule

Obj = dict[str, Any]

# Downward-API fields a container's env may read (the pod's rule for env; labels/annotations need a key).
ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
ENV_FIELD_PATH_KEYED = r"^metadata[.](labels|annotations)\['[^']+'\]$"
ENV_RESOURCE_FIELDS = tuple(
    f"{kind}.{res}" for kind in ("limits", "requests") for res in ("cpu", "memory", "ephemeral-storage")
)
ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
ENVFROM_SOURCES = ("configMapRef", "secretRef")


# Quantities at or above this (1E = 10^18) name no real resource, and overflow the int64 Kubernetes counts in.
QUANTITY_CEILING = "1E"


def _q(v: Any) -> str:
    return str(v)  # an int-or-string value, as CEL's string() gives it


def _cmp(a: Any, b: Any) -> int:
    qa, qb = f.parse_quantity(_q(a)), f.parse_quantity(_q(b))
    return (qa > qb) - (qa < qb)


def quantities_ok(m: Obj | None) -> bool:
    return all(
        f.is_quantity(_q(v)) and 0 <= f.parse_quantity(_q(v)) < f.parse_quantity(QUANTITY_CEILING)
        for v in (m or {}).values()
    )


def _names_ok(m: Obj | None) -> bool:
    return all(f.is_resource_name(k) for k in (m or {}))


def _extended_ok(r: Obj) -> bool:
    req, lim = r.get("requests") or {}, r.get("limits") or {}
    for k, v in req.items():
        if f.is_extended_resource(k) and (
            k not in lim or not f.is_quantity(_q(v)) or not f.is_quantity(_q(lim[k])) or _cmp(v, lim[k]) != 0
        ):
            return False
    return all(
        not f.is_extended_resource(k)
        or k.startswith(f.HUGEPAGES_PREFIX)
        or not f.is_quantity(_q(v))
        or f.parse_quantity(_q(v)) == f.parse_quantity(_q(v)).to_integral_value()
        for k, v in lim.items()
    )


def requests_within_limits(r: Obj) -> bool:
    req, lim = r.get("requests") or {}, r.get("limits") or {}
    return all(
        k not in lim or not (f.is_quantity(_q(v)) and f.is_quantity(_q(lim[k]))) or _cmp(v, lim[k]) <= 0
        for k, v in req.items()
    )


def valid_env(e: Obj) -> bool:
    if "value" in e and "valueFrom" in e:
        return False
    src = e.get("valueFrom")
    if src is None:
        return True
    given = [k for k in ENV_SOURCES if k in src]
    if len(given) != 1:
        return False
    if "fieldRef" in src:
        path = src["fieldRef"].get("fieldPath")
        return path in ENV_FIELD_PATHS or f.matches(ENV_FIELD_PATH_KEYED, path)
    if "resourceFieldRef" in src:
        ref = src["resourceFieldRef"]
        return ref.get("resource") in ENV_RESOURCE_FIELDS and (
            "divisor" not in ref or (f.is_quantity(ref["divisor"]) and f.parse_quantity(ref["divisor"]) > 0)
        )
    return True


def _valid_toleration(t: Obj) -> bool:
    key, op = t.get("key", ""), t.get("operator", "Equal")
    if key and not f.is_qualified_name(key):
        return False
    if not key and op != "Exists":
        return False
    if op == "Exists" and t.get("value", ""):
        return False
    return "tolerationSeconds" not in t or t.get("effect") == "NoExecute"


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


ENV_CEL = (
    "!(has(e.value) && has(e.valueFrom)) && (!has(e.valueFrom) || ("
    + " + ".join(f"(has(e.valueFrom.{s}) ? 1 : 0)" for s in ENV_SOURCES)
    + " == 1"
    f" && (!has(e.valueFrom.fieldRef) || e.valueFrom.fieldRef.fieldPath in {_cel_list(ENV_FIELD_PATHS)} || "
    f'e.valueFrom.fieldRef.fieldPath.matches(r"{ENV_FIELD_PATH_KEYED}"))'
    f" && (!has(e.valueFrom.resourceFieldRef) || (e.valueFrom.resourceFieldRef.resource in "
    f"{_cel_list(ENV_RESOURCE_FIELDS)} && (!has(e.valueFrom.resourceFieldRef.divisor) || "
    "(isQuantity(e.valueFrom.resourceFieldRef.divisor) && "
    "quantity(e.valueFrom.resourceFieldRef.divisor).compareTo(quantity('0')) > 0))))))"
)

_TOLERATION_CEL = (
    f"(!has(t.key) || t.key == '' || {f.qualified_name_cel('t.key')}) && "
    "((has(t.key) && t.key != '') || (has(t.operator) && t.operator == 'Exists')) && "
    "(!has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '') && "
    "(!has(t.tolerationSeconds) || (has(t.effect) && t.effect == 'NoExecute'))"
)


def pod_rules() -> list[Rule]:
    """Rules whose failure would otherwise surface only as a refused pod create."""
    qty = (
        "isQuantity(string(self.{m}[k])) && quantity(string(self.{m}[k])).compareTo(quantity('0')) >= 0 && "
        f"quantity(string(self.{{m}}[k])).isLessThan(quantity('{QUANTITY_CEILING}'))"
    )
    integral = "quantity(string(self.limits[k])).isInteger()"
    return [
        Rule(
            "resource-names",
            "spec.hardware.resources",
            " && ".join(
                f"(!has(self.{m}) || self.{m}.all(k, {f.resource_name_cel('k')}))" for m in ("requests", "limits")
            ),
            "",
            "spec.hardware.resources keys are container resource names: cpu, memory, ephemeral-storage, "
            "hugepages-<size> (e.g. hugepages-2Mi) or a device plugin's prefixed name (e.g. aws.amazon.com/neuron, "
            "nvidia.com/gpu)",
            lambda r: _names_ok(r.get("requests")) and _names_ok(r.get("limits")),
        ),
        Rule(
            "resource-requests-quantities",
            "spec.hardware.resources",
            f"!has(self.requests) || self.requests.all(k, {qty.format(m='requests')})",
            ".requests",
            "spec.hardware.resources.requests values must be non-negative Kubernetes quantities below 1E such as "
            "8, '7500m', '32Gi' or '2e3'; fix the value",
            lambda r: quantities_ok(r.get("requests")),
        ),
        Rule(
            "resource-limits-quantities",
            "spec.hardware.resources",
            f"!has(self.limits) || self.limits.all(k, {qty.format(m='limits')})",
            ".limits",
            "spec.hardware.resources.limits values must be non-negative Kubernetes quantities below 1E such as "
            "8, '7500m', '32Gi' or '2e3'; fix the value",
            lambda r: quantities_ok(r.get("limits")),
        ),
        Rule(
            "resource-requests-within-limits",
            "spec.hardware.resources",
            "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || "
            "!isQuantity(string(self.requests[k])) || !isQuantity(string(self.limits[k])) || "
            "quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)",
            ".requests",
            "spec.hardware.resources.requests must not exceed spec.hardware.resources.limits for the same "
            "resource; lower the request or raise the limit",
            requests_within_limits,
        ),
        Rule(
            "extended-resources-limited",
            "spec.hardware.resources",
            "(!has(self.requests) || self.requests.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || "
            "(has(self.limits) && k in self.limits && isQuantity(string(self.requests[k])) && "
            "isQuantity(string(self.limits[k])) && "
            "quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) == 0))) && "
            "(!has(self.limits) || self.limits.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || "
            f"k.startsWith('hugepages-') || !isQuantity(string(self.limits[k])) || {integral}))",
            ".limits",
            "device and hugepages resources (e.g. nvidia.com/gpu, hugepages-2Mi) cannot be overcommitted: set them "
            "in spec.hardware.resources.limits (whole numbers for devices); a request, if given, must equal the "
            "limit",
            _extended_ok,
        ),
        Rule(
            "node-selector-keys",
            "spec.hardware",
            f"!has(self.nodeSelector) || self.nodeSelector.all(k, {f.qualified_name_cel('k')})",
            ".nodeSelector",
            "spec.hardware.nodeSelector keys must be label keys: an optional DNS prefix and '/', then at most 63 "
            "letters, digits, '-', '_' or '.' starting and ending with a letter or digit (e.g. "
            "node.kubernetes.io/instance-type)",
            lambda h: all(f.is_qualified_name(k) for k in h.get("nodeSelector") or {}),
        ),
        Rule(
            "tolerations-valid",
            "spec.hardware",
            f"!has(self.tolerations) || self.tolerations.all(t, {_TOLERATION_CEL})",
            ".tolerations",
            "each spec.hardware.tolerations entry needs a valid taint key (a label key; empty only with operator "
            "Exists), no value with operator Exists, and tolerationSeconds only with effect NoExecute",
            lambda h: all(_valid_toleration(t) for t in h.get("tolerations") or []),
        ),
        Rule(
            "env-valid",
            "spec",
            f"!has(self.env) || self.env.all(e, {ENV_CEL})",
            ".env",
            "each spec.env entry sets either value (a string) or valueFrom with exactly one of fieldRef "
            f"(fieldPath one of {', '.join(ENV_FIELD_PATHS)}, or metadata.labels['key'] / "
            "metadata.annotations['key']), resourceFieldRef (resource limits.cpu, requests.memory, ...; a "
            "positive divisor), configMapKeyRef or secretKeyRef",
            lambda s: all(valid_env(e) for e in s.get("env") or []),
        ),
        Rule(
            "env-from-one-source",
            "spec",
            "!has(self.envFrom) || self.envFrom.all(e, "
            + " + ".join(f"(has(e.{s}) ? 1 : 0)" for s in ENVFROM_SOURCES)
            + " == 1)",
            ".envFrom",
            "each spec.envFrom entry names exactly one of configMapRef and secretRef",
            lambda s: all(sum(k in e for k in ENVFROM_SOURCES) == 1 for e in s.get("envFrom") or []),
        ),
    ]
