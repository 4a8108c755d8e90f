"""What each endpoint of a broker or coordinator needs: one table, one lookup.

Every route of both applications is in :data:`RULES`, keyed by its method and its path
template (a segment's path, ``.../{topic}/{segment}...``, has its topic's rule). A route
that is not there is refused to everyone but superusers (:func:`rule_for` answers
:data:`UNCLASSIFIED`), and a test enumerates both applications' routes and fails on any
such one, so a new endpoint cannot be added without deciding who may call it.

The kinds of rule:

- ``open``: no credentials needed (the probes; ``/metrics`` unless protected);
- ``authenticated``: any valid token; the handler checks the rest (a transaction's calls:
  only the role that opened it, or a superuser, may touch it; joining topics to it needs
  ``produce``/``consume`` on each);
- ``namespace``: one of ``actions`` on the path's ``tenant/namespace`` (a consumer's
  ``consume`` also on the path's subscription, a reader's on every subscription: a grant's
  ``subscriptions`` patterns, :mod:`segtxn.auth.policy`);
- ``cluster``: one of ``actions`` on the whole cluster (a grant on ``*``);
- ``internal``: superusers only: the calls servers make to each other (ledger replicas, the
  v4 coordinator's END on each participant) with the cluster role's token.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from segtxn.auth.policy import Action

_ANY_USE = frozenset(Action)
_PRODUCE = frozenset({Action.PRODUCE})
_CONSUME = frozenset({Action.CONSUME})
_ADMIN = frozenset({Action.ADMIN})


class Kind(enum.Enum):
    OPEN = "open"
    AUTHENTICATED = "authenticated"
    NAMESPACE = "namespace"
    CLUSTER = "cluster"
    INTERNAL = "internal"


class About(enum.Enum):
    """Which subscription a ``consume`` rule is about (a grant may restrict its ``consume``
    to some subscriptions)."""

    NONE = "none"
    """No one subscription (lookups, stats): any ``consume`` grant on the namespace counts."""
    PATH = "path"
    """The one the path's ``{subscription}`` names (a consumer)."""
    EVERY = "every"
    """The topic as a whole, without a subscription (a reader)."""


@dataclass(frozen=True)
class Rule:
    kind: Kind
    actions: frozenset[Action] = frozenset()
    about: About = About.NONE


OPEN = Rule(Kind.OPEN)
AUTHENTICATED = Rule(Kind.AUTHENTICATED)
INTERNAL = Rule(Kind.INTERNAL)
UNCLASSIFIED = INTERNAL
"""A route missing from the table: superusers only (and a failing test)."""
METRICS = "/metrics"
"""Open unless the server is told to protect it (then a ``cluster`` ``admin`` rule)."""
PROTECTED_METRICS = Rule(Kind.CLUSTER, _ADMIN)


def _ns(actions: frozenset[Action], about: About = About.NONE) -> Rule:
    return Rule(Kind.NAMESPACE, actions, about)


_TOPIC = "/{domain}/{tenant}/{namespace}/{topic}"
_ADMIN_TOPIC = "/admin/v2" + _TOPIC
_SUB = _ADMIN_TOPIC + "/subscription/{subscription}"
_REPLICA_OPS = ("create", "append", "fence", "read", "delete", "stat", "discard")

RULES: dict[tuple[str, str], Rule] = {
    # probes
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", METRICS): OPEN,
    # the broker's data plane
    ("GET", "/ws/v2/producer" + _TOPIC): _ns(_PRODUCE),
    ("GET", "/ws/v2/consumer" + _TOPIC + "/{subscription}"): _ns(_CONSUME, About.PATH),
    ("GET", "/ws/v2/reader" + _TOPIC): _ns(_CONSUME, About.EVERY),
    # lookups: whoever may use the namespace at all
    ("GET", "/lookup/v2/topic" + _TOPIC): _ns(_ANY_USE),
    ("GET", "/ws/v2/lookup" + _TOPIC): _ns(_ANY_USE),
    ("GET", "/lookup/v2/coordinators"): AUTHENTICATED,
    # topic administration: reads by any user of the namespace, changes by its admins
    ("GET", "/admin/v2/{domain}/{tenant}/{namespace}"): _ns(_ANY_USE),
    ("PUT", _ADMIN_TOPIC): _ns(_ADMIN),
    ("DELETE", _ADMIN_TOPIC): _ns(_ADMIN),
    ("GET", _ADMIN_TOPIC + "/stats"): _ns(_ANY_USE),
    ("GET", _ADMIN_TOPIC + "/subscriptions"): _ns(_ANY_USE),
    ("PUT", _SUB): _ns(_ADMIN),
    ("DELETE", _SUB): _ns(_ADMIN),
    ("POST", _SUB + "/reset"): _ns(_ADMIN),
    ("POST", _SUB + "/repair"): _ns(_ADMIN),
    ("GET", _ADMIN_TOPIC + "/properties"): _ns(_ANY_USE),
    ("PUT", _ADMIN_TOPIC + "/properties"): _ns(_ADMIN),
    ("DELETE", _ADMIN_TOPIC + "/properties"): _ns(_ADMIN),
    ("POST", _ADMIN_TOPIC + "/terminate"): _ns(_ADMIN),
    ("POST", _ADMIN_TOPIC + "/trim"): _ns(_ADMIN),
    ("POST", _ADMIN_TOPIC + "/load"): _ns(_ADMIN),
    ("POST", _ADMIN_TOPIC + "/split"): _ns(_ADMIN),
    ("POST", _ADMIN_TOPIC + "/merge"): _ns(_ADMIN),
    # the v4 coordinator ending a transaction on each participant
    ("POST", _ADMIN_TOPIC + "/txn/{txn}/end"): INTERNAL,
    ("POST", _SUB + "/txn/{txn}/end"): INTERNAL,
    # brokers as a whole (the operator's scale-down guard and drains)
    ("GET", "/admin/v2/brokers/{broker}/homes"): Rule(Kind.CLUSTER, _ADMIN),
    ("POST", "/admin/v2/brokers/{broker}/drain"): Rule(Kind.CLUSTER, _ADMIN),
    ("DELETE", "/admin/v2/brokers/{broker}/drain"): Rule(Kind.CLUSTER, _ADMIN),
    # ledger replicas: broker to broker
    **{("POST", f"/replica/v1/{op}"): INTERNAL for op in _REPLICA_OPS},
    # the coordinator: owner checks in the handlers
    ("POST", "/txn/v2/new"): AUTHENTICATED,
    ("GET", "/txn/v2/open"): Rule(Kind.CLUSTER, _ADMIN),
    ("GET", "/txn/v2/stats"): Rule(Kind.CLUSTER, _ADMIN),
    ("POST", "/txn/v2/{txn}/partitions"): AUTHENTICATED,
    ("POST", "/txn/v2/{txn}/subscriptions"): AUTHENTICATED,
    ("POST", "/txn/v2/{txn}/end"): AUTHENTICATED,
    ("POST", "/txn/v2/{txn}/commit"): AUTHENTICATED,
    ("GET", "/txn/v2/{txn}"): AUTHENTICATED,
}

_SEGMENT = re.compile(r"(?<=/\{topic\})/\{segment\}")


def rule_for(method: str, template: str, *, protect_metrics: bool = False) -> Rule:
    """The rule of the route ``method template`` (aiohttp's canonical path: ``{name}``
    for each variable part). HEAD is GET's; a segment's path is its topic's."""
    method = "GET" if method == "HEAD" else method
    if protect_metrics and template == METRICS:
        return PROTECTED_METRICS
    return RULES.get((method, _SEGMENT.sub("", template)), UNCLASSIFIED)


def classified(method: str, template: str) -> bool:
    """Whether the table names this route (the test over every route asks)."""
    method = "GET" if method == "HEAD" else method
    return (method, _SEGMENT.sub("", template)) in RULES
