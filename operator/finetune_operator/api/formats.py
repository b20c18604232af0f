"""Kubernetes value formats, each written once as a regular expression, a Python predicate and, where a pattern
alone cannot say it, a CEL snippet. schema.py puts the patterns into the CRD, podrules.py the CEL snippets;
admission runs the predicates, so `ftjob render` and the API server agree.

The API server matches an OpenAPI `pattern` and CEL's `matches()` with Go's RE2, as an unanchored search. Python's
`re` differs on a few points, so every pattern here is checked through `re2_search`, which means what RE2 means:
`$` is the end of the text (Python's also matches before a trailing newline), and no pattern uses the classes
whose meaning differs (`\\s`, `\\d`, `\\w`, `\\b`: Unicode in Python, ASCII in RE2); they are spelled out instead.

The formats are Kubernetes' own (k8s.io/apimachinery/pkg/util/validation and resource.Quantity), so a spec that
passes here also passes the pod's validation when the operator creates the pods.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation

# resource.Quantity: signed number, then a binary SI suffix, a decimal SI suffix or a decimal exponent.
QUANTITY = r"^[+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
QUANTITY_MAX_LENGTH = 64
# DNS-1123 subdomain (object names such as ServiceAccounts, Secrets, claims; scheduler names).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_SUBDOMAIN_MAX = 253
# DNS-1123 label (namespaces, and in a Pod the names of containers, volumes and their mounts' volumes).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_MAX = 63
# Label value (also Kueue's queue name, which becomes a label value); the empty string is a valid value.
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_VALUE_MAX = 63
# Qualified name (label keys, taint keys, resource names): an optional DNS subdomain prefix and '/', then a name
# of at most 63 characters. The prefix's 253-character bound is checked apart (see qualified_name_cel).
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
QUALIFIED_NAME_MAX = DNS_SUBDOMAIN_MAX + 1 + 63
# Environment variable names: any printable ASCII except '=' (Kubernetes' relaxed rule, GA since 1.34).
ENV_NAME = r"^[ -<>-~]+$"
ENV_NAME_MAX = 256
# ConfigMap and Secret keys.
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
CONFIG_KEY_MAX = 253
# What Go's unicode.IsSpace calls space (strings.TrimSpace, which the pod's image rule uses): written out, since
# RE2's \s is ASCII only and Python's is wider still.
# Spelled with RE2's escapes, not the characters themselves: YAML tools differ on raw NEL or LINE SEPARATOR in a
# string (kustomize drops a NEL), and the CRD copies must mean the same everywhere.
UNICODE_SPACES = r"\t\n\v\f\r \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}"
# Container images: no whitespace anywhere (the pod's rule is no leading or trailing whitespace; inner
# whitespace never names a pullable image).
IMAGE = f"^[^{UNICODE_SPACES}]+$"
# s3://<bucket>[/<prefix>]: a bucket name as boto3 accepts it (botocore's VALID_BUCKET), which the runtime's
# upload and checkpoint sync use; `s3:///x` (no bucket) is refused by the runtime only after training started.
S3_URL = r"^s3://[-A-Za-z0-9._]{1,255}(/|$)"
# The Neuron compile cache (NEURON_COMPILE_CACHE_URL): such an S3 URL, or an absolute path.
NEURON_CACHE_URL = r"^(s3://[-A-Za-z0-9._]{1,255}(/|$)|/.)"
# A software stack's name (spec.hardware.stack); which names a profile offers is its data (profiles/*.yaml).
STACK_NAME = r"^[a-z][a-z0-9-]*$"

# A container's mountPath (spec.podTemplate): absolute, without '.', '..' or empty segments and without a trailing
# '/', so that one directory has one spelling and comparing paths as strings says whether one lies under another
# (the operator's own mount paths are reserved), and without control characters. Stricter than the Pod's own
# rule (any non-empty string).
_CHAR = r"[^/\x{0}-\x{1f}\x{7f}]"
_SEGMENT = rf"([^/.\x{{0}}-\x{{1f}}\x{{7f}}]{_CHAR}*|[.][^/.\x{{0}}-\x{{1f}}\x{{7f}}]{_CHAR}*|[.][.]{_CHAR}+)"
MOUNT_PATH = f"^(/{_SEGMENT})+$"
# A mount's subPath, as the Pod's validation has it (validateLocalDescendingPath): relative, no '..' segment.
SUB_PATH = f"^({_SEGMENT}|[.])(/({_SEGMENT}|[.])?)*$"

# What each pattern means, for `ftjob render`'s messages (the API server quotes the pattern itself).
PATTERN_HINTS = {
    DNS_SUBDOMAIN: "use a DNS subdomain: lower-case letters, digits, '-' and '.', starting and ending with a "
    "letter or digit (e.g. my-name)",
    LABEL_VALUE: "use a label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
    "or digit, or empty",
    ENV_NAME: "use printable ASCII characters other than '='",
    CONFIG_KEY: "use letters, digits, '-', '_' and '.'",
    IMAGE: "remove the whitespace",
    DNS_LABEL: "use a DNS label: at most 63 lower-case letters, digits and '-', starting and ending with a letter "
    "or digit (e.g. data)",
    MOUNT_PATH: "use an absolute path without '.', '..' or empty segments and without a trailing '/' (e.g. /data)",
    SUB_PATH: "use a relative path without '..' segments (e.g. train/2026)",
    S3_URL: "use s3://<bucket>/<prefix> with a bucket name of letters, digits, '.', '-' and '_' "
    "(e.g. s3://my-bucket/results)",
    NEURON_CACHE_URL: "use s3://<bucket>/<prefix> (a bucket name of letters, digits, '.', '-' and '_') or an "
    "absolute path such as /cache/neuron",
    STACK_NAME: "use a stack name of the profile (lower-case letters, digits and '-', e.g. native)",
}

# Resource names a container may request without a domain prefix (the rest carry one, e.g. nvidia.com/gpu).
NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage")
HUGEPAGES_PREFIX = "hugepages-"


_RE2_ONLY = re.compile(r"\\[sSdDwWbBAzZ]")
_RE2_HEX = re.compile(r"\\x\{([0-9A-Fa-f]{1,6})\}")


@functools.cache
def _python_pattern(pattern: str) -> re.Pattern[str]:
    """`pattern` (RE2 syntax) for Python's re, meaning what RE2 means: each unescaped `$` outside a character
    class becomes `\\Z` (the end of the text; Python's `$` also matches before a trailing newline)."""
    if _RE2_ONLY.search(pattern):
        raise ValueError(f"pattern {pattern!r} uses a class whose meaning differs between RE2 and Python")
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            wide = _RE2_HEX.match(pattern, i)
            if wide:  # RE2's \x{HHHH}: Python spells it \uHHHH or \UHHHHHHHH
                code = int(wide.group(1), 16)
                out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
                i = wide.end()
                continue
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]" or out[-1] == "[" or out[-1] == "[^"
            out.append(ch if ch != "[" else "\\[")
        elif ch == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                continue
            out.append(ch)
        elif ch == "$":
            out.append(r"\Z")
        else:
            out.append(ch)
        i += 1
    return re.compile("".join(out))


def re2_search(pattern: str, value: str) -> bool:
    """What the API server's `pattern` and CEL's `value.matches(pattern)` say: an unanchored RE2 search."""
    return _python_pattern(pattern).search(value) is not None


def matches(pattern: str, value: object) -> bool:
    return isinstance(value, str) and re2_search(pattern, value)


def parse_quantity(q: str) -> Decimal:
    """A Kubernetes quantity as a Decimal ('7500m' -> 7.5, '2k' -> 2000, '1Gi' -> 1073741824). Raises ValueError
    for anything that is not a quantity."""
    if not matches(QUANTITY, q) or len(q) > QUANTITY_MAX_LENGTH:
        raise ValueError(f"{q!r} is not a Kubernetes quantity")
    m = re.fullmatch(r"([+-]?[0-9.]+)(.*)", q)
    assert m is not None  # QUANTITY matched
    number, suffix = m.group(1), m.group(2)
    binary = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
    decimal = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
    try:
        value = Decimal(number)
        if suffix in binary:
            return value * (Decimal(1024) ** binary[suffix])
        if suffix in decimal:
            return value.scaleb(decimal[suffix])
        return value.scaleb(int(suffix[1:]))
    except (InvalidOperation, ValueError, OverflowError) as e:
        raise ValueError(f"{q!r} is not a Kubernetes quantity") from e


def is_quantity(q: object) -> bool:
    """What CEL's isQuantity() accepts (resource.ParseQuantity)."""
    if not isinstance(q, str):
        return False
    try:
        parse_quantity(q)
    except ValueError:
        return False
    return True


def is_qualified_name(v: object) -> bool:
    if not matches(QUALIFIED_NAME, v):
        return False
    assert isinstance(v, str)
    return "/" not in v or v.index("/") <= DNS_SUBDOMAIN_MAX


def qualified_name_cel(var: str) -> str:
    """CEL twin of is_qualified_name for the string expression `var`."""
    return f"({var}.matches('{QUALIFIED_NAME}') && (!{var}.contains('/') || {var}.indexOf('/') <= {DNS_SUBDOMAIN_MAX}))"


def is_label_value(v: object) -> bool:
    return matches(LABEL_VALUE, v) and len(str(v)) <= LABEL_VALUE_MAX


def is_extended_resource(name: str) -> bool:
    """Resources that cannot be overcommitted: requests must equal limits, in whole units (hugepages: any
    quantity, but also requested as limited)."""
    return name not in NATIVE_RESOURCES


def is_resource_name(name: object) -> bool:
    """A container resource name: cpu, memory, ephemeral-storage, hugepages-<size>, or a prefixed name outside
    the kubernetes.io namespace (extended resources such as aws.amazon.com/neuron)."""
    if not isinstance(name, str):
        return False
    if name in NATIVE_RESOURCES:
        return True
    if name.startswith(HUGEPAGES_PREFIX):
        size = name[len(HUGEPAGES_PREFIX) :]
        return is_quantity(size) and not size.startswith(("+", "-"))
    if "/" not in name or not is_qualified_name(name):
        return False
    domain = name.split("/")[0]
    return not (
        domain in ("kubernetes.io", "k8s.io")
        or domain.endswith((".kubernetes.io", ".k8s.io"))
        or name.startswith("requests.")
    )


def resource_name_cel(var: str) -> str:
    """CEL twin of is_resource_name."""
    native = "[" + ", ".join(f"'{n}'" for n in NATIVE_RESOURCES) + "]"
    size = f"{var}.substring({len(HUGEPAGES_PREFIX)})"
    domain = f"{var}.split('/')[0]"
    return (
        f"({var} in {native} || "
        f"({var}.startsWith('{HUGEPAGES_PREFIX}') && isQuantity({size}) && !{size}.startsWith('+') && "
        f"!{size}.startsWith('-')) || "
        f"(!{var}.startsWith('{HUGEPAGES_PREFIX}') && {var}.contains('/') && {qualified_name_cel(var)} && "
        f"!({domain} in ['kubernetes.io', 'k8s.io'] || {domain}.endsWith('.kubernetes.io') || "
        f"{domain}.endsWith('.k8s.io') || {var}.startsWith('requests.'))))"
    )
