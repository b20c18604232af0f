"""Operator-side allowlists (the chart's `policy` values, the config file's `policy:` block).

`create` on finetunejobs amounts to creating pods in the namespace: with any image, any ServiceAccount and any
Secret there (docs/operator.md, "Who may create a job"). These lists narrow that: a job naming an image,
ServiceAccount or Secret outside them ends Failed/PolicyViolation before any child is created. An empty or
absent list allows everything (the default). Pure: reconcile.py calls `violations()` on every unfinished pass,
so tightening a list also stops running jobs that break it.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

REASON = "PolicyViolation"  # status.reason and the Event's reason of a job that breaks an allowlist
# Config keys, read by reconcile (through violations()) and written by the chart's ConfigMap template.
IMAGES, SERVICE_ACCOUNTS, SECRETS = "allowedImages", "allowedServiceAccounts", "allowedSecrets"
DEFAULT_SERVICE_ACCOUNT = "default"  # what a pod without serviceAccountName runs as


def _allowed(value: str, patterns: list[str]) -> bool:
    # Shell-style globs: `*` matches across `/`, so "registry.example.com/team/*" allows a whole prefix.
    return any(fnmatchcase(value, p) for p in patterns)


def secrets_of(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, Secret name) of every Secret the job's pods would read."""
    out: list[tuple[str, str]] = []
    if (spec.get("hfTokenSecretRef") or {}).get("name"):
        out.append(("spec.hfTokenSecretRef.name", spec["hfTokenSecretRef"]["name"]))
    for i, src in enumerate(spec.get("envFrom") or []):
        if (src.get("secretRef") or {}).get("name"):
            out.append((f"spec.envFrom[{i}].secretRef.name", src["secretRef"]["name"]))
    for i, var in enumerate(spec.get("env") or []):
        ref = (var.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name"):
            out.append((f"spec.env[{i}].valueFrom.secretKeyRef.name", ref["name"]))
    return out


def violations(spec: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """One message per field that breaks the operator's allowlists, each naming the field, the value, the
    allowlist and the fix. The profiles' default images (the operator's own configuration) are always allowed:
    only spec.image is checked."""
    policy: Mapping[str, Any] = config.get("policy") or {}
    out: list[str] = []
    images: list[str] = list(policy.get(IMAGES) or [])
    if images and spec.get("image") and not _allowed(str(spec["image"]), images):
        out.append(
            f"spec.image {spec['image']!r} is not allowed by the operator's policy.{IMAGES} {images}: "
            "use a matching image, or leave spec.image empty for the profile's default"
        )
    accounts: list[str] = list(policy.get(SERVICE_ACCOUNTS) or [])
    account = str(spec.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT)
    if accounts and not _allowed(account, accounts):
        out.append(
            f"spec.serviceAccountName {account!r} is not allowed by the operator's "
            f"policy.{SERVICE_ACCOUNTS} {accounts}: name one of those ServiceAccounts"
        )
    secrets: list[str] = list(policy.get(SECRETS) or [])
    for field, name in secrets_of(spec) if secrets else []:
        if not _allowed(name, secrets):
            out.append(
                f"{field} {name!r} is not allowed by the operator's policy.{SECRETS} {secrets}: "
                "reference one of those Secrets"
            )
    return out


def check_config(config: Mapping[str, Any]) -> list[str]:
    """Problems with the config file's `policy:` block (the operator refuses to start with any)."""
    policy = config.get("policy")
    if policy is None:
        return []
    if not isinstance(policy, Mapping):
        return ["policy: expected a mapping with allowedImages, allowedServiceAccounts and allowedSecrets"]
    out = [
        f"policy.{k}: unknown key (known: {IMAGES}, {SERVICE_ACCOUNTS}, {SECRETS})"
        for k in policy
        if k not in (IMAGES, SERVICE_ACCOUNTS, SECRETS)
    ]
    for k in (IMAGES, SERVICE_ACCOUNTS, SECRETS):
        v = policy.get(k)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) and x for x in v)):
            out.append(f"policy.{k}: expected a list of non-empty strings (globs), got {v!r}")
    return out
