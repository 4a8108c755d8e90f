"""Who may do what: roles mapped to actions per tenant and namespace, plus superuser roles.

A policy is a small YAML (or JSON) file, read once at start-up::

    superusers: [segtxn-cluster, ops]        # every action everywhere, any transaction
    roles:
      orders-app:
        - {resource: acme/orders, actions: [produce, consume]}
        - {resource: "acme/*", actions: [consume], subscriptions: ["orders-*"]}
      auditor:
        - {resource: "*", actions: [consume]}

A *resource* is ``tenant/namespace``, ``tenant/*`` (every namespace of the tenant) or ``*``
(everything, including the calls about the whole cluster, such as ``/metrics`` when it is
protected). The actions are ``produce`` (producers, joining topics to a transaction),
``consume`` (consumers, readers, joining subscriptions to a transaction) and ``admin``
(creating, deleting and changing topics and subscriptions). A role the file does not name
may do nothing but what every authenticated caller may (open a transaction, find the
coordinators). Pulsar's model, without its per-topic grants.

A grant may name ``subscriptions``: patterns (``*`` matches any run of characters) that
restrict its ``consume`` to the subscriptions they match, so that one application cannot
attach to, acknowledge in or take messages from another's subscription on the same topic.
Without the key a grant's ``consume`` covers every subscription, as before the key existed.
A reader (which reads a topic without a subscription) and any call about *every*
subscription need a grant that covers every name (no ``subscriptions``, or the pattern
``*``). The key restricts ``consume`` only: ``produce`` and ``admin`` in the same grant are
not about subscriptions.

The file is parsed into frozen dataclasses; anything it cannot mean (an unknown action, a
resource of another shape, a key it does not know) is an :class:`AuthConfigError` naming
the file and the place, so a typo never grants or denies silently.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from segtxn.auth.tokens import AuthConfigError, Principal


class Action(enum.StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


Scope = tuple[str, str] | None
"""What a call is about: ``(tenant, namespace)``, or None for the cluster as a whole."""

EVERY_SUBSCRIPTION = "*"
"""The subscription a reader's call is about: all of them (no subscription name has a
``*``), so only a grant whose patterns match every name covers it."""

_PATTERN = re.compile(r"[A-Za-z0-9_.:=*-]{1,64}")


@dataclass(frozen=True)
class Grant:
    """``actions`` on ``resource`` (``*``, ``tenant/*`` or ``tenant/namespace``); its
    ``consume`` only on the subscriptions ``subscriptions`` match (None: on every one)."""

    resource: str
    actions: frozenset[Action]
    subscriptions: tuple[str, ...] | None = None
    _matcher: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.subscriptions is not None:
            alternatives = "|".join(
                ".*".join(map(re.escape, p.split("*"))) for p in self.subscriptions
            )
            object.__setattr__(self, "_matcher", re.compile(f"(?:{alternatives})", re.DOTALL))

    def covers(self, action: Action, scope: Scope, subscription: str | None = None) -> bool:
        """Whether this grant allows ``action`` on ``scope``; ``subscription``: the one the
        call is about (:data:`EVERY_SUBSCRIPTION` for a reader), None when it is about none."""
        if action not in self.actions or not self._on(scope):
            return False
        if action is not Action.CONSUME or subscription is None or self._matcher is None:
            return True
        return self._matcher.fullmatch(subscription) is not None

    def _on(self, scope: Scope) -> bool:
        if self.resource == "*":
            return True
        if scope is None:
            return False
        tenant, _, namespace = self.resource.partition("/")
        return tenant == scope[0] and namespace in ("*", scope[1])


@dataclass(frozen=True)
class Policy:
    superusers: frozenset[str] = frozenset()
    roles: Mapping[str, tuple[Grant, ...]] = field(default_factory=dict)

    def principal(self, role: str, expires_s: float | None = None) -> Principal:
        return Principal(role, superuser=role in self.superusers, expires_s=expires_s)

    def allows(
        self,
        principal: Principal,
        actions: frozenset[Action],
        scope: Scope,
        subscription: str | None = None,
    ) -> bool:
        """Whether ``principal`` may do any of ``actions`` on ``scope`` (and, for
        ``consume``, on ``subscription``: see :meth:`Grant.covers`)."""
        if principal.superuser:
            return True
        grants = self.roles.get(principal.role, ())
        return any(g.covers(a, scope, subscription) for g in grants for a in actions)

    @classmethod
    def load(cls, path: Path) -> Policy:
        """Read and check a policy file (see the module docstring).

        Raises:
            AuthConfigError: unreadable, not YAML/JSON, or not a policy; names the place.
        """
        try:
            data = yaml.safe_load(path.read_text("utf-8"))
        except OSError as e:
            raise AuthConfigError(f"{path}: cannot be read: {e.strerror or e}") from e
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise AuthConfigError(f"{path}: not YAML or JSON: {e}") from e
        return cls.parse(data, str(path))

    @classmethod
    def parse(cls, data: Any, source: str = "policy") -> Policy:
        """A policy from parsed YAML/JSON (``source`` names it in errors).

        Raises:
            AuthConfigError: not a policy.
        """

        def fail(where: str, what: str) -> AuthConfigError:
            return AuthConfigError(f"{source}: {where}: {what}")

        if not isinstance(data, dict):
            raise fail("top level", "expected a mapping with 'superusers' and 'roles'")
        unknown = set(data) - {"superusers", "roles"}
        if unknown:
            raise fail("top level", f"unknown keys {sorted(map(str, unknown))}")
        supers = data.get("superusers") or []
        if not isinstance(supers, list) or not all(_is_role(r) for r in supers):
            raise fail("superusers", "expected a list of role names")
        roles_data = data.get("roles") or {}
        if not isinstance(roles_data, dict):
            raise fail("roles", "expected a mapping of role name to a list of grants")
        roles: dict[str, tuple[Grant, ...]] = {}
        for role, grants in roles_data.items():
            if not _is_role(role):
                raise fail("roles", f"{role!r} is not a role name")
            if not isinstance(grants, list):
                raise fail(f"roles.{role}", "expected a list of {resource, actions}")
            roles[role] = tuple(_grant(g, f"roles.{role}[{i}]", fail) for i, g in enumerate(grants))
        return cls(frozenset(supers), roles)


def _is_role(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip()) and value == value.strip()


def _grant(data: Any, where: str, fail: Any) -> Grant:
    if not isinstance(data, dict) or not {"resource", "actions"} <= set(data) <= _GRANT_KEYS:
        raise fail(where, "expected {resource: ..., actions: [...], subscriptions: [...]}")
    resource, actions = data["resource"], data["actions"]
    if not isinstance(resource, str) or not _is_resource(resource):
        raise fail(where, f"resource {resource!r}: expected '*', 'tenant/*' or 'tenant/namespace'")
    known = ", ".join(a.value for a in Action)
    if not isinstance(actions, list) or not actions:
        raise fail(where, f"actions: expected a non-empty list of {known}")
    try:
        parsed = frozenset(Action(a) for a in actions)
    except ValueError:
        raise fail(where, f"actions {actions!r}: each one of {known}") from None
    if "subscriptions" not in data:
        return Grant(resource, parsed)
    patterns = data["subscriptions"]
    if (
        not isinstance(patterns, list)
        or not patterns
        or not all(isinstance(p, str) and _PATTERN.fullmatch(p) for p in patterns)
    ):
        raise fail(
            where,
            f"subscriptions {patterns!r}: expected a non-empty list of subscription names, "
            "'*' matching any characters (letters, digits, _.:=-*)",
        )
    if Action.CONSUME not in parsed:
        raise fail(where, "subscriptions restrict 'consume', which the grant does not give")
    return Grant(resource, parsed, tuple(patterns))


_GRANT_KEYS = {"resource", "actions", "subscriptions"}


def _is_resource(text: str) -> bool:
    if text == "*":
        return True
    tenant, slash, namespace = text.partition("/")
    return bool(slash) and _is_part(tenant) and (namespace == "*" or _is_part(namespace))


def _is_part(text: str) -> bool:
    return bool(text) and "*" not in text and "/" not in text and not text.isspace()
