"""A static check that every CEL rule of a CRD works on bounded data, so that the API server
does not refuse the CRD for its rules' estimated cost (nothing here runs an API server).

Kubernetes estimates each rule's worst-case cost when the CRD is created or updated and
refuses a rule above ``StaticEstimatedCostLimit`` (10,000,000), and a CRD whose rules sum
above ten times that (kubernetes.io, "Validation rules", "Resource use by validation
functions"). It sizes data from the schema (k8s.io/apiextensions-apiserver's
``SchemaDeclType``): a string with ``maxLength: n`` is ``4n`` bytes; a string without
one, the keys of a map (which cannot have one) and ``metadata.name`` are as long as a
request (3 MiB); a list without ``maxItems`` or a map without ``maxProperties`` holds as
many elements as a request could. From cel-go's estimator: walking a string costs 0.1 per
byte, and a regex (``matches``) that times a quarter of the regex's length.

What :func:`problems` checks, for each rule (``x-kubernetes-validations``) of a schema:

- Every comprehension (``all``, ``exists``, ``exists_one``, ``map``, ``filter``) ranges
  over a list with ``maxItems`` or a map with ``maxProperties``: none over data bounded only
  by the request size, whatever its body.
- Every call whose cost grows with a string's length (``matches``, ``contains``,
  ``split``, ...) is on a string the rule names by a path (``self.a.b``, ``oldSelf.x``, or
  a comprehension's variable: a list's item, a map's key) and, priced as above and
  multiplied by the elements of every comprehension around it, stays within
  :data:`RULE_LIMIT`. ``matches`` needs a literal regex (its length is the price).
- Anything it cannot price is a problem, not a pass: a string call on an expression that
  is not such a path, a global-function form (``matches(s, r)``), a field the schema does
  not have, ``in`` (its cost is the list's length).

Its limits (it is a lexical scan of short rules, not CEL's type checker):

- Constant-cost operations are not counted (``size``, ``has``, ``int``, comparisons of
  numbers), nor the per-element cost of a comprehension's body beyond its string calls:
  a rule of many of them could add up where each is cheap. ``==`` on strings and lists and
  string ``+`` (linear in their sizes) are not counted either: ``self == oldSelf`` on an
  unbounded string is priced by Kubernetes at 0.1 per byte of a request, 314,573, far
  below the limit, but a rule could multiply it inside a comprehension.
- A comprehension's variable is known from its own ``x.all(v, ...)`` onward, by name, for
  the rest of the rule: two comprehensions binding one name to different things would be
  confused.
- Each rule is checked on its own; the per-CRD sum (rule cost times how many times its
  node can occur) is not computed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

REQUEST_BYTES = 3 * 1024 * 1024
UNBOUNDED_STRING = REQUEST_BYTES - 2
"""What Kubernetes assumes for a string without ``maxLength`` (and a map's keys)."""
RULE_LIMIT = 10_000_000
"""Kubernetes' ``StaticEstimatedCostLimit``: the most a rule's estimated cost may be."""
STRING_TRAVERSAL = 0.1
REGEX_LENGTH = 0.25

COMPREHENSIONS = {"all", "exists", "exists_one", "map", "filter"}
REGEX_CALLS = {"matches", "find", "findAll"}
STRING_CALLS = REGEX_CALLS | {
    "contains", "startsWith", "endsWith", "indexOf", "lastIndexOf", "split", "replace",
    "lowerAscii", "upperAscii", "trim", "substring", "charAt", "join", "format", "reverse",
}  # fmt: skip

_TOKEN = re.compile(
    r"""\s*(?:(?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|(?P<ident>[A-Za-z_]\w*)"""
    r"""|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}]))"""
)


@dataclass(frozen=True)
class Value:
    """What a path names: a schema node, or a map's key (a string of no bound)."""

    schema: Mapping[str, Any] | None
    """None: a map's key."""


def _tokens(rule: str) -> list[str]:
    out, pos = [], 0
    rule = rule.strip()
    while pos < len(rule):
        found = _TOKEN.match(rule, pos)
        if found is None or found.end() == pos:
            raise ValueError(f"cannot read {rule[pos:]!r}")
        out.append(found.group(0).strip())
        pos = found.end()
    return [t for t in out if t]


def _closing(tokens: list[str], open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(tokens)):
        if tokens[i] in ("(", "[", "{"):
            depth += 1
        elif tokens[i] in (")", "]", "}"):
            depth -= 1
        if depth == 0:
            return i
    return len(tokens) - 1


def _ident(token: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_]\w*", token))


def _with_meta(schema: Mapping[str, Any], root: bool) -> Mapping[str, Any]:
    """A resource root has ``metadata.name`` (and ``generateName``) for rules, unbounded."""
    if not root:
        return schema
    meta = {"type": "object", "properties": {"name": {"type": "string"},
                                             "generateName": {"type": "string"}}}  # fmt: skip
    return {**schema, "properties": {**schema.get("properties", {}), "metadata": meta}}


def string_bytes(value: Value) -> int:
    """The size Kubernetes assumes for a string value."""
    if value.schema is not None and "maxLength" in value.schema:
        return 4 * int(value.schema["maxLength"])
    return UNBOUNDED_STRING


def elements(schema: Mapping[str, Any]) -> int | None:
    """How many elements a list or map may hold, None when only the request bounds it."""
    bound = schema.get("maxItems" if schema.get("type") == "array" else "maxProperties")
    return None if bound is None else int(bound)


def problems(rule: str, node: Mapping[str, Any], *, root: bool = False) -> list[str]:
    """Why ``rule``, on schema ``node`` (``root``: a resource's root), may cost the API
    server more than it allows, or what this check cannot price; empty when it is sound
    by the rules of the module docstring."""
    try:
        tokens = _tokens(rule)
    except ValueError as e:
        return [str(e)]
    node = _with_meta(node, root)
    bound: dict[str, Value] = {}
    spans: list[tuple[int, int, int]] = []  # (open paren, close paren, elements)
    found: list[str] = []

    def resolve(start: int, end: int) -> Value | str:
        """The value of the path ``tokens[start:end]`` (``a.b.c``), or why not."""
        parts = tokens[start:end]
        if (
            not parts
            or not all(_ident(p) for p in parts[::2])
            or any(p != "." for p in parts[1::2])
        ):
            return f"{''.join(parts)!r} is not a path this check can follow"
        head, fields = parts[0], parts[2::2]
        value = Value(node) if head in ("self", "oldSelf") else bound.get(head)
        if value is None:
            return f"{head!r} is not self, oldSelf or a comprehension's variable"
        for field in fields:
            props = (value.schema or {}).get("properties", {})
            if field not in props:
                return f"{''.join(parts)!r}: no field {field!r} in the schema"
            value = Value(props[field])
        return value

    def receiver(dot: int) -> tuple[int, int]:
        """The path ending just before ``tokens[dot]`` (a ``.``): (start, end)."""
        start = dot - 1
        while start >= 2 and tokens[start - 1] == "." and _ident(tokens[start - 2]):
            start -= 2
        return start, dot

    for i, token in enumerate(tokens):
        if token == "in":
            found.append("'in' costs as much as the list is long: not priced by this check")
        if not (_ident(token) and i + 1 < len(tokens) and tokens[i + 1] == "("):
            continue
        method = i >= 1 and tokens[i - 1] == "."
        if token in STRING_CALLS | COMPREHENSIONS and not method:
            found.append(f"{token}(...) as a global function: not priced by this check")
            continue
        if not method or token not in STRING_CALLS | COMPREHENSIONS:
            continue
        start, end = receiver(i - 1)
        if start > 0 and tokens[start - 1] in (".", ")", "]"):
            found.append(f".{token}() on an expression, not a path: not priced by this check")
            continue
        value = resolve(start, end)
        if isinstance(value, str):
            found.append(value)
            continue
        if token in COMPREHENSIONS:
            schema = value.schema or {}
            count = elements(schema)
            where = "".join(tokens[start:end])
            item = schema.get("items") if schema.get("type") == "array" else None
            bound[tokens[i + 2] if i + 2 < len(tokens) else ""] = Value(item)  # a map's: its key
            if schema.get("type") not in ("array", "object"):
                found.append(f"{where}.{token}(): not a list or a map")
            elif count is None:
                kind = "maxItems" if schema.get("type") == "array" else "maxProperties"
                found.append(f"{where}.{token}() over data with no {kind}")
            else:
                spans.append((i + 1, _closing(tokens, i + 1), count))
            continue
        if value.schema is not None and value.schema.get("type") != "string":
            found.append(f".{token}() on {''.join(tokens[start:end])!r}, not a string")
            continue
        cost = math.ceil(string_bytes(value) * STRING_TRAVERSAL)
        if token in REGEX_CALLS:
            regex = tokens[i + 2] if i + 2 < len(tokens) else ""
            if regex[:1] not in ("'", '"'):
                found.append(f".{token}() with a regex that is not a literal")
                continue
            cost *= math.ceil((len(regex) - 2) * REGEX_LENGTH)
        for lo, hi, count in spans:
            if lo < i < hi:
                cost *= count
        if cost > RULE_LIMIT:
            found.append(
                f".{token}() on {''.join(tokens[start:end])!r} is estimated at {cost:,} "
                f"(the limit is {RULE_LIMIT:,}): bound it (maxLength, maxItems, maxProperties)"
            )
    return found


def rules(
    schema: Mapping[str, Any], path: str = ""
) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(path, rule, the node it is on) of every rule in ``schema``."""
    for rule in schema.get("x-kubernetes-validations", ()):
        yield path or ".", rule["rule"], schema
    for name, child in schema.get("properties", {}).items():
        yield from rules(child, f"{path}.{name}")
    if isinstance(schema.get("items"), Mapping):
        yield from rules(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from rules(schema["additionalProperties"], f"{path}{{}}")
