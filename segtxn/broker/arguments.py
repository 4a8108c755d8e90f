"""The arguments of admin requests, checked against the limits once, at the edge.

Each function raises ``ServerError`` (InvalidArgument / InvalidTopicName) with a message that
says what was wrong; nothing behind it needs to check again. The limits are in
:mod:`segtxn.protocol.limits` (and docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from segtxn.ledger import Position
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import parse_int, parse_position, properties_problem
from segtxn.protocol.names import Domain, InvalidTopicName, TopicName, check_list_part
from segtxn.topics.model import MAX_INITIAL_SEGMENTS

LISTED_DOMAINS = (Domain.PERSISTENT.value, Domain.TOPIC.value)


def segments_to_create(request: web.Request, name: TopicName) -> int:
    """``?segments=N`` of a create: 1..256 for a ``topic://``; never for a persistent topic
    (silently ignoring it would create something other than what was asked for)."""
    given = request.query.get("segments")
    if name.domain is not Domain.TOPIC:
        if given is not None:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT,
                f"{name}: only scalable topics (topic://) have segments; "
                "leave segments out for a persistent topic",
            )
        return 1
    if given is None:
        return 1
    return parse_int(given, "segments", lo=1, hi=MAX_INITIAL_SEGMENTS)


def listed_namespace(request: web.Request) -> tuple[str, str, str]:
    """``(domain, tenant, namespace)`` of a list path: a listable domain and valid parts
    (``..``, ``.`` and other names no topic can have are refused, not answered with [])."""
    info = request.match_info
    domain = info["domain"]
    if domain not in LISTED_DOMAINS:
        raise ServerError(
            ErrorName.INVALID_TOPIC_NAME,
            f"topics are listed by domain persistent or topic, not {domain[:40]!r}",
        )
    try:
        tenant = check_list_part("tenant", info["tenant"])
        namespace = check_list_part("namespace", info["namespace"])
    except InvalidTopicName as e:
        raise ServerError(ErrorName.INVALID_TOPIC_NAME, str(e)) from e
    return domain, tenant, namespace


def reset_target(text: str, next_position: Position) -> str | Position:
    """Where ``reset?to=`` moves a subscription: ``earliest``, ``latest`` or a position at
    or before the next one the topic will write (a later one would hide future messages)."""
    if text in ("earliest", "latest"):
        return text
    position = Position(*parse_position(text, "to"))
    if position > next_position:
        raise ServerError(
            ErrorName.INVALID_ARGUMENT,
            f"to={position} is beyond the end of the topic (its next message is "
            f"{next_position}); use latest",
        )
    return position


def property_updates(body: object) -> dict[str, str]:
    """A ``PUT .../properties`` body: a JSON object of strings within the limits (the
    limits on the whole set are checked again where the update is applied)."""
    if not isinstance(body, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in body.items()
    ):
        raise ServerError(ErrorName.INVALID_ARGUMENT, "properties are a JSON object of strings")
    check_properties(body)
    return body


def changed_properties(
    current: Mapping[str, str], updates: Mapping[str, str], removals: tuple[str, ...]
) -> dict[str, str]:
    """The property set after an update (what the limits are checked on)."""
    properties = {**current, **updates}
    for key in removals:
        properties.pop(key, None)
    return properties


def check_properties(properties: Mapping[str, str]) -> None:
    """Raise ServerError(InvalidArgument) unless the property set is within the limits."""
    problem = properties_problem(properties)
    if problem is not None:
        raise ServerError(ErrorName.INVALID_ARGUMENT, problem)

