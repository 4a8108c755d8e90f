"""Every CEL rule of every CRD works on bounded data (:mod:`tests.manifests.celcost`), so
the API server does not refuse a CRD for its rules' estimated cost; and the check itself
catches what it is for."""

from __future__ import annotations

from typing import Any

import pytest

from tests.manifests.celcost import RULE_LIMIT, problems, rules
from tests.manifests.test_crds import crds

ROLES_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "array"}}


@pytest.mark.parametrize("crd", crds(), ids=lambda c: c["metadata"]["name"])
def test_every_rule_of_every_crd_is_over_bounded_data(crd: dict[str, Any]) -> None:
    found = []
    for version in crd["spec"]["versions"]:
        for path, rule, node in rules(version["schema"]["openAPIV3Schema"]):
            found += [f"{path}: {rule}: {p}" for p in problems(rule, node, root=path == ".")]
    assert found == []


@pytest.mark.parametrize(
    ("rule", "node", "complaint"),
    [
        # The rule the SegtxnCluster CRD had on spec.security.roles (the review's S4):
        # unbounded map, and a regex on its keys, which no schema can bound.
        (
            "self.all(r, r.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(r) <= 40)",
            ROLES_MAP,
            "no maxProperties",
        ),
        (
            "self.all(r, r.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))",
            {**ROLES_MAP, "maxProperties": 64},
            "estimated at",
        ),
        ("self.exists(x, x == 'a')", {"type": "array", "items": {"type": "string"}}, "maxItems"),
        (
            "self.s.contains('x') && self.l.all(x, x.contains(self.s))",
            {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "l": {"type": "array", "maxItems": 100, "items": {"type": "string"}},
                },
            },
            "estimated at",
        ),
        ("matches(self, 'a')", {"type": "string", "maxLength": 5}, "global function"),
        ("self.lowerAscii().matches('a')", {"type": "string"}, "not a path"),
        ("self.nope.matches('a')", {"type": "object", "properties": {}}, "no field 'nope'"),
        ("'a' in self", {"type": "array", "maxItems": 3, "items": {"type": "string"}}, "'in'"),
    ],
)
def test_the_check_refuses_unbounded_or_unpriced_rules(
    rule: str, node: dict[str, Any], complaint: str
) -> None:
    assert any(complaint in p for p in problems(rule, node)), problems(rule, node)


@pytest.mark.parametrize(
    ("rule", "node"),
    [
        ("self.all(r, size(r) <= 40)", {**ROLES_MAP, "maxProperties": 64}),
        (
            "self.all(x, x.matches('^[a-z]+$'))",
            {"type": "array", "maxItems": 64, "items": {"type": "string", "maxLength": 40}},
        ),
        ("self == oldSelf", {"type": "string"}),
        (
            "!has(self.r) || int(self.r.split('/')[1]) <= 3",
            {"type": "object", "properties": {"r": {"type": "string", "maxLength": 5}}},
        ),
    ],
)
def test_the_check_passes_bounded_rules(rule: str, node: dict[str, Any]) -> None:
    assert problems(rule, node) == []


def test_a_root_rule_on_the_name_is_priced_as_kubernetes_does() -> None:
    """``metadata.name`` has no maxLength for the estimator: a regex on it at the root,
    evaluated once, is within the limit; inside a comprehension it would not be."""
    root = {"type": "object", "properties": {}}
    assert problems("self.metadata.name.matches('^[a-z0-9]{1,40}$')", root, root=True) == []
    assert RULE_LIMIT < 10 * 314_573 * 4  # ten such names would not be
