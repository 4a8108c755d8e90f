"""Evaluate the simplest CEL rules of the CRDs in Python, to test what they refuse without
an API server: boolean logic (``&&``, ``||``, ``!`` before ``has(`` or ``(``), comparisons,
``has(self.a.b)``, paths from ``self``, number, string and boolean literals. Anything else
(method calls, macros, ``?:``, ``oldSelf``) raises ``NotImplementedError``: such a rule is
not tested this way. Not CEL's semantics in every corner (Python's comparisons of mixed
types differ), only enough for rules written in that subset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tests.manifests.celcost import _tokens

_SAME = {"==", "!=", "<", "<=", ">", ">=", "(", ")"}


def _has(value: Any, path: Sequence[str]) -> bool:
    for name in path:
        if not isinstance(value, Mapping) or name not in value:
            return False
        value = value[name]
    return True


def _get(value: Any, path: Sequence[str]) -> Any:
    for name in path:
        if not isinstance(value, Mapping) or name not in value:
            raise LookupError(f"no such key: {name}")  # CEL: an evaluation error
        value = value[name]
    return value


def evaluate(rule: str, self: Any) -> bool:
    """``rule`` with ``self`` bound to ``self``.

    Raises:
        NotImplementedError: the rule is outside the subset above.
        LookupError: it reads a field that is absent (CEL's "no such key").
    """
    tokens, out, i = _tokens(rule), [], 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("self", "has"):
            has = token == "has"
            start = i + 2 if has else i
            if has and tokens[i + 1 : i + 3] != ["(", "self"]:
                raise NotImplementedError(rule)
            path, j = [], start + 1
            while j + 1 < len(tokens) and tokens[j] == ".":
                path.append(tokens[j + 1])
                j += 2
            if j < len(tokens) and tokens[j] == "(":
                raise NotImplementedError(f"a call in {rule!r}")
            if has:
                if tokens[j] != ")":
                    raise NotImplementedError(rule)
                j += 1
            out.append(f"{'_has' if has else '_get'}(self, {path!r})")
            i = j
            continue
        if token == "!":
            if tokens[i + 1] not in ("has", "("):
                raise NotImplementedError(f"'!' before {tokens[i + 1]!r} in {rule!r}")
            out.append("not")
        elif token in ("&&", "||"):
            out.append("and" if token == "&&" else "or")
        elif token in ("true", "false"):
            out.append(token.capitalize())
        elif token in _SAME or token[:1] in "'\"" or token[:1].isdigit():
            out.append(token)
        else:
            raise NotImplementedError(f"{token!r} in {rule!r}")
        i += 1
    return bool(eval(" ".join(out), {"_has": _has, "_get": _get}, {"self": self}))
