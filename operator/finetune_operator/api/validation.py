"""Structural validation and defaulting driven by the OpenAPI schema in schema.py, as the API server does it.

Walking the same schema the CRD is generated from keeps `ftjob render` and admission in agreement without a
second hand-written copy of types, enums and bounds.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass
from typing import Any

from .formats import PATTERN_HINTS, re2_search
from .schema import Schema


@dataclass(frozen=True)
class FieldError:
    """One problem with a spec: the field path (e.g. spec.hardware.nodes) and what to do about it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidSpec(ValueError):
    """Raised with every problem found, so a user fixes them in one round."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def prune_nulls(schema: Schema, value: Any) -> Any:
    """A copy of value without the nulls the API server drops before defaulting and validation: a null field of
    a typed object (a property, or a value of a map such as nodeSelector) is as if it were absent. Nulls in
    arrays, and anywhere inside a free object (x-kubernetes-preserve-unknown-fields), stay."""
    if (
        isinstance(value, dict)
        and schema.get("type") == "object"
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        props: dict[str, Schema] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for k, v in value.items():
            sub = props.get(k) if k in props else (extra if isinstance(extra, dict) else None)
            if v is None and sub is not None:
                continue  # an unknown field stays, null or not: strict field validation refuses it
            out[k] = prune_nulls(sub, v) if sub is not None else copy.deepcopy(v)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_nulls(schema["items"], v) if v is not None else None for v in value]
    return copy.deepcopy(value)


def non_finite(value: Any, path: str) -> list[FieldError]:
    """NaN and infinities anywhere (YAML's .nan and .inf): JSON has no such number, so neither kubectl nor the
    API server takes a document that holds one."""
    if isinstance(value, float) and not math.isfinite(value):
        return [FieldError(path, f"{value} is not a number JSON can carry (nor the API server); write a finite number")]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in non_finite(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [e for i, v in enumerate(value) for e in non_finite(v, f"{path}[{i}]")]
    return []


def apply_defaults(schema: Schema, value: Any) -> Any:
    """Return a copy of value with schema defaults filled in where a parent object is present."""
    value = copy.deepcopy(value)
    _default_in_place(schema, value)
    return value


def _default_in_place(schema: Schema, value: Any) -> None:
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default_in_place(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in schema.get("properties", {}):
                    _default_in_place(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default_in_place(schema["items"], item)


def validate_structure(schema: Schema, value: Any, path: str) -> list[FieldError]:
    """Type, enum, bounds, pattern, required and unknown-field checks (kubectl's strict field validation)."""
    errors: list[FieldError] = []
    _walk(schema, value, path, errors)
    return errors


def _type_ok(expected: str, value: Any) -> bool:
    if isinstance(value, bool) and expected in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[expected])


def _walk(schema: Schema, value: Any, path: str, errors: list[FieldError]) -> None:
    expected = schema.get("type")
    if value is None:
        errors.append(FieldError(path, "must not be null; remove the field to use the default"))
        return
    if schema.get("x-kubernetes-int-or-string"):
        _int_or_string(schema, value, path, errors)
        return
    if expected and not _type_ok(expected, value):
        quote = " (quote it in YAML)" if expected == "string" and isinstance(value, int | float | bool) else ""
        errors.append(FieldError(path, f"must be of type {expected}, got {type(value).__name__} {value!r}{quote}"))
        return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(str(v) for v in schema["enum"])
        hint = difflib.get_close_matches(str(value), [str(v) for v in schema["enum"]], n=1)
        did = f" (did you mean {hint[0]}?)" if hint else ""
        errors.append(FieldError(path, f"unsupported value {value!r}{did}; use one of: {allowed}"))
    if expected in ("integer", "number"):
        _bounds(schema, value, path, errors)
    if expected == "string":
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(FieldError(path, f"must have at least {schema['minLength']} characters"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(FieldError(path, f"must have at most {schema['maxLength']} characters"))
        if "pattern" in schema and not re2_search(schema["pattern"], value):
            means = PATTERN_HINTS.get(schema["pattern"], f"it must match the pattern {schema['pattern']}")
            errors.append(FieldError(path, f"{value!r} is not allowed here; {means}"))
    if expected == "array":
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(FieldError(path, f"must have at most {schema['maxItems']} items"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(FieldError(path, f"must have at least {schema['minItems']} item(s)"))
        for i, item in enumerate(value):
            _walk(schema.get("items", {}), item, f"{path}[{i}]", errors)
    if expected == "object":
        _object(schema, value, path, errors)


def _int_or_string(schema: Schema, value: Any, path: str, errors: list[FieldError]) -> None:
    if not (_type_ok("integer", value) or _type_ok("string", value)):
        errors.append(FieldError(path, f"must be an integer or a string, got {type(value).__name__} {value!r}"))
        return
    if isinstance(value, str) and "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(FieldError(path, f"must have at most {schema['maxLength']} characters"))


def _bounds(schema: Schema, value: float, path: str, errors: list[FieldError]) -> None:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if lo is not None:
        if schema.get("exclusiveMinimum") and value <= lo:
            errors.append(FieldError(path, f"must be greater than {lo}, got {value}"))
        elif value < lo:
            errors.append(FieldError(path, f"must be at least {lo}, got {value}"))
    if hi is not None and value > hi:
        errors.append(FieldError(path, f"must be at most {hi}, got {value}"))


def _object(schema: Schema, value: dict[str, Any], path: str, errors: list[FieldError]) -> None:
    props: dict[str, Schema] = schema.get("properties", {})
    for req in schema.get("required", []):
        if req not in value:
            errors.append(FieldError(f"{path}.{req}", "required field is missing"))
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        errors.append(
            FieldError(
                path,
                f"must have at least {schema['minProperties']} entr{'y' if schema['minProperties'] == 1 else 'ies'}",
            )
        )
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(FieldError(path, f"must have at most {schema['maxProperties']} entries"))
    extra = schema.get("additionalProperties")
    for key, sub_value in value.items():
        if key in props:
            _walk(props[key], sub_value, f"{path}.{key}", errors)
        elif isinstance(extra, dict):
            _walk(extra, sub_value, f"{path}.{key}", errors)
        elif not schema.get("x-kubernetes-preserve-unknown-fields") and props:
            hint = difflib.get_close_matches(key, list(props), n=1)
            did = f"; did you mean {hint[0]}?" if hint else f"; known fields: {', '.join(props)}"
            errors.append(FieldError(f"{path}.{key}", f"unknown field{did}"))
