"""metadata as the API server checks it on create: the types of ObjectMeta's fields (a wrong type fails decoding),
no unknown field (strict field validation, kubectl's default), and the formats of labels, annotations, the
namespace, timestamps and finalizers (apimachinery's ValidateObjectMeta). The CRD's schema cannot say any of it
(a CRD may constrain metadata.name only), so `ftjob render` checks it here to refuse what the server refuses.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from . import formats as f
from .validation import FieldError

_STRINGS = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion")
_INTEGERS = ("generation", "deletionGracePeriodSeconds")
_TIMES = ("creationTimestamp", "deletionTimestamp")
_MAPS = ("labels", "annotations")
_LISTS = ("ownerReferences", "finalizers", "managedFields")
FIELDS = (*_STRINGS, *_INTEGERS, *_TIMES, *_MAPS, *_LISTS)
# Namespace names are DNS-1123 labels.
DNS_LABEL, DNS_LABEL_MAX = f.DNS_LABEL, f.DNS_LABEL_MAX
# apimachinery's TotalAnnotationSizeLimitB: keys and values together, in bytes.
ANNOTATIONS_MAX_BYTES = 256 * 1024
# RFC 3339 as Go's time.RFC3339 parses it (metav1.Time).
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})")


def _is_time(v: str) -> bool:
    if not _RFC3339.fullmatch(v):
        return False
    try:
        datetime.fromisoformat(re.sub(r"[.][0-9]+", "", v).replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _type_errors(meta: dict[str, Any]) -> list[FieldError]:
    errors = []
    for key, v in meta.items():
        path = f"metadata.{key}"
        if key not in FIELDS:
            errors.append(FieldError(path, f"unknown field; metadata has {', '.join(FIELDS)}"))
        elif v is None:
            continue  # decodes as the field's zero value
        elif key in _STRINGS and not isinstance(v, str):
            errors.append(FieldError(path, f"must be of type string, got {type(v).__name__} {v!r}"))
        elif key in _INTEGERS and not (
            ((isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()))
            and -(2**63) <= v < 2**63
        ):  # an int64; ObjectMeta's decoder takes 1.0 for an integer, unlike the CRD's schema
            errors.append(FieldError(path, f"must be of type integer, got {type(v).__name__} {v!r}"))
        elif key in _TIMES and not (isinstance(v, str) and _is_time(v)):
            errors.append(FieldError(path, f"must be an RFC 3339 time such as 2026-01-02T15:04:05Z, got {v!r}"))
        elif key in _MAPS and not (isinstance(v, dict) and all(isinstance(x, str) or x is None for x in v.values())):
            errors.append(FieldError(path, "must map keys to string values (quote numbers and booleans in YAML)"))
        elif key in _LISTS and not isinstance(v, list):
            errors.append(FieldError(path, f"must be a list, got {type(v).__name__}"))
    return errors


def metadata_errors(meta: Any) -> list[FieldError]:
    """Everything the API server refuses in `metadata` on create (the name's own rule apart: rules.py)."""
    if meta is None:
        return []
    if not isinstance(meta, dict):
        return [FieldError("metadata", f"must be of type object, got {type(meta).__name__}")]
    errors = _type_errors(meta)
    if errors:
        return errors
    ns = meta.get("namespace")
    if ns and not (f.re2_search(DNS_LABEL, ns) and len(ns) <= DNS_LABEL_MAX):
        errors.append(FieldError("metadata.namespace", f"{ns!r} is not a namespace name (a DNS label)"))
    for k, v in (meta.get("labels") or {}).items():
        if not f.is_qualified_name(k):
            errors.append(
                FieldError(
                    "metadata.labels",
                    f"{k!r} is not a label key (an optional DNS prefix and '/', "
                    "then at most 63 letters, digits, '-', '_' or '.')",
                )
            )
        if v is not None and not f.is_label_value(v):
            errors.append(
                FieldError(f"metadata.labels.{k}", f"{v!r} is not a label value; {f.PATTERN_HINTS[f.LABEL_VALUE]}")
            )
    annotations = meta.get("annotations") or {}
    for k in annotations:
        if not f.is_qualified_name(k.lower()):
            errors.append(FieldError("metadata.annotations", f"{k!r} is not an annotation key (a label key)"))
    size = sum(len(k.encode()) + len((v or "").encode()) for k, v in annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        errors.append(FieldError("metadata.annotations", f"may hold at most {ANNOTATIONS_MAX_BYTES} bytes, has {size}"))
    for i, fin in enumerate(meta.get("finalizers") or []):
        if not (isinstance(fin, str) and f.is_qualified_name(fin)):
            errors.append(
                FieldError(f"metadata.finalizers[{i}]", f"{fin!r} is not a finalizer name (a qualified name)")
            )
    return errors
