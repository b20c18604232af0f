"""Everything the API server checks on a FineTuneJob, run in-process: `ftjob render`/`run` and the operator
reject exactly what admission would, with the same field paths."""

from __future__ import annotations

from typing import Any

from . import profiles
from .api.meta import metadata_errors
from .api.podrules import pod_rules
from .api.rules import Rule, static_rules
from .api.schema import openapi_schema
from .api.validation import FieldError, InvalidSpec, apply_defaults, non_finite, prune_nulls, validate_structure
from .builders.devices import device_limits_rule
from .builders.podtemplate_rules import pod_template_rules
from .builders.reserved_env import env_from_prefix_rule, reserved_env_rule
from .constants import API_VERSION, KIND


def all_rules() -> list[Rule]:
    return (
        static_rules(profiles.default_mpi_profiles())
        + profiles.profile_rules()
        + pod_rules()
        + [reserved_env_rule(), env_from_prefix_rule(), device_limits_rule()]
        + pod_template_rules()
    )


def _at(obj: Any, scope: str) -> Any:
    for part in [p for p in scope.split(".") if p]:
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def validate(job: dict[str, Any]) -> dict[str, Any]:
    """Return the job with schema defaults applied, or raise InvalidSpec listing every problem."""
    errors: list[FieldError] = []
    if job.get("apiVersion") != API_VERSION or job.get("kind") != KIND:
        errors.append(FieldError("apiVersion/kind", f"expected apiVersion: {API_VERSION} and kind: {KIND}"))
    errors += non_finite(job, "")
    meta = job.get("metadata")
    errors += metadata_errors(meta)
    if not isinstance(meta, dict) or not meta.get("name"):
        errors.append(FieldError("metadata.name", "required: give the job a name"))
    schema = openapi_schema()
    # The server ignores status on create (a subresource), and drops the nulls of typed fields first.
    body = prune_nulls(schema, {k: v for k, v in job.items() if k != "status"})
    errors += validate_structure(schema, body, "")
    if errors:
        raise InvalidSpec([FieldError(e.field.lstrip("."), e.message) for e in errors])
    defaulted: dict[str, Any] = apply_defaults(schema, body)
    for rule in all_rules():
        if rule.check is None:
            continue
        target = _at(defaulted, rule.scope)
        if target is None:
            continue
        if not rule.check(target):
            errors.append(FieldError(rule.path, rule.describe(target) if rule.describe else rule.message))
    if errors:
        raise InvalidSpec(errors)
    return defaulted
