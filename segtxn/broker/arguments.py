"""The arguments of admin requests and data-plane frames, checked against the limits once,
at the edge.

Each function raises ``ServerError`` (InvalidArgument / InvalidTopicName / InvalidMessage /
MessageTooLarge) with a message that says what was wrong; nothing behind it needs to check
again. The limits are in :mod:`segtxn.protocol.limits` (and docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from segtxn.ledger import Position
from segtxn.protocol import preconditions
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Ack, Nack, Redeliver, Send
from segtxn.protocol.limits import (
    MAX_BATCH_SENDS,
    MAX_I64,
    MAX_MESSAGE_IDS,
    MAX_MESSAGE_KEY_BYTES,
    MAX_MESSAGE_METADATA_BYTES,
    MAX_PROPERTIES,
    MAX_U64,
    parse_int,
    parse_position,
    properties_problem,
)
from segtxn.protocol.names import Domain, InvalidTopicName, TopicName, check_list_part
from segtxn.protocol.preconditions import PropertyPrecondition
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


def delete_precondition(request: web.Request, name: TopicName) -> PropertyPrecondition | None:
    """The property precondition of a topic's ``DELETE`` (``ifProperty`` with
    ``ifPropertyValue`` or ``ifPropertyAbsent``: :mod:`segtxn.protocol.preconditions`), None
    when it names none.

    Raises:
        ServerError(InvalidArgument): a malformed one (the message names the parameter).
        ServerError(NotAllowed): one on anything but a scalable topic: only a scalable
            topic's deletion checks it in the step that commits to it (broker/deletion.py).
    """
    try:
        precondition = preconditions.from_query(lambda key: request.query.getall(key, []))
    except ValueError as e:
        raise ServerError(ErrorName.INVALID_ARGUMENT, str(e)) from e
    if precondition is not None and name.domain is not Domain.TOPIC:
        raise ServerError(
            ErrorName.NOT_ALLOWED,
            f"{name}: a deletion takes a property precondition on a scalable topic "
            "(topic://) only; a persistent topic keeps its properties in its ledger, where "
            "its deletion cannot check them in the step that commits to it, and a segment is "
            "deleted only with its topic",
        )
    return precondition


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
    if not text:
        raise ServerError(ErrorName.INVALID_ARGUMENT, "to: earliest, latest or LEDGER:ENTRY?")
    position = Position(*parse_position(text, "to"))
    if position > next_position:
        raise ServerError(
            ErrorName.INVALID_ARGUMENT,
            f"to={position} is beyond the end of the topic (its next message is "
            f"{next_position}); use latest",
        )
    return position


def _json_kind(value: object) -> str:
    """What a decoded JSON value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"


def property_updates(body: object) -> dict[str, str]:
    """A ``PUT .../properties`` body: a JSON object of strings within the limits (the
    limits on the whole set are checked again where the update is applied)."""
    if not isinstance(body, dict):
        raise ServerError(ErrorName.INVALID_ARGUMENT, "properties are a JSON object of strings")
    for key, value in body.items():
        if not isinstance(value, str):
            raise ServerError(
                ErrorName.INVALID_ARGUMENT,
                f"properties are a JSON object of strings: {key[:64]!r} is {_json_kind(value)}",
            )
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


# ---------------------------------------------------------------------- frames


def check_send(send: Send, max_message_bytes: int) -> None:
    """One message of a ``send`` or ``send_batch``: its seq, sizes and numbers.

    Raises:
        ServerError(InvalidMessage): a number out of range, too many properties.
        ServerError(MessageTooLarge): the payload, or the key and properties, too large for
            the entry that stores them.
    """
    if send.seq < 0:
        raise ServerError(ErrorName.INVALID_MESSAGE, f"seq must be >= 0, not {send.seq}")
    if len(send.payload) > max_message_bytes:
        raise ServerError(
            ErrorName.MESSAGE_TOO_LARGE,
            f"payload of {len(send.payload)} bytes exceeds {max_message_bytes}",
        )
    if send.event_time_ms is not None and not 0 <= send.event_time_ms <= MAX_I64:
        raise ServerError(
            ErrorName.INVALID_MESSAGE, f"event_time_ms must be in 0..{MAX_I64} (ms since 1970)"
        )
    if send.txn is not None:
        check_txn(send.txn, ErrorName.INVALID_MESSAGE)
    key = 0 if send.key is None else _utf8_length(send.key)
    if key > MAX_MESSAGE_KEY_BYTES:
        raise ServerError(
            ErrorName.MESSAGE_TOO_LARGE, f"a key of {key} bytes; at most {MAX_MESSAGE_KEY_BYTES}"
        )
    if not send.properties:  # (most sends: no sum to make)
        return
    if len(send.properties) > MAX_PROPERTIES:
        raise ServerError(
            ErrorName.INVALID_MESSAGE,
            f"{len(send.properties)} properties; at most {MAX_PROPERTIES}",
        )
    metadata = key + sum(_utf8_length(k) + _utf8_length(v) for k, v in send.properties.items())
    if metadata > MAX_MESSAGE_METADATA_BYTES:
        raise ServerError(
            ErrorName.MESSAGE_TOO_LARGE,
            f"key and properties take {metadata} bytes; at most {MAX_MESSAGE_METADATA_BYTES}",
        )


def _utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8, without encoding an ASCII string (``isascii`` reads a
    flag CPython keeps: O(1))."""
    return len(text) if text.isascii() else len(text.encode())


def check_batch(sends: list[Send]) -> None:
    """Raises ServerError(InvalidMessage) for a batch of no sends (it would get no answer
    at all: each send is answered, and there is none) or of more than MAX_BATCH_SENDS."""
    if not sends:
        raise ServerError(ErrorName.INVALID_MESSAGE, "a send_batch of no sends")
    if len(sends) > MAX_BATCH_SENDS:
        raise ServerError(
            ErrorName.INVALID_MESSAGE, f"{len(sends)} sends in a batch; at most {MAX_BATCH_SENDS}"
        )


def check_consumer_frame(frame: Ack | Nack | Redeliver) -> None:
    """Counts and numbers of an ``ack``, ``nack`` or ``redeliver`` (message ids themselves
    are checked against the topic: an unknown one is InvalidArgument there).

    Raises:
        ServerError(InvalidArgument)
    """
    check_request_id(frame.request_id)
    if isinstance(frame, Ack | Nack) and len(frame.message_ids) > MAX_MESSAGE_IDS:
        raise ServerError(
            ErrorName.INVALID_ARGUMENT,
            f"{len(frame.message_ids)} message ids in one frame; at most {MAX_MESSAGE_IDS}",
        )
    if isinstance(frame, Ack | Redeliver):
        check_txn(frame.txn, ErrorName.INVALID_ARGUMENT)
    if isinstance(frame, Ack) and frame.epoch is not None and not 0 <= frame.epoch <= MAX_I64:
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"epoch must be in 0..{MAX_I64}")


def check_request_id(request_id: int) -> None:
    """Raise ServerError(InvalidArgument) for a frame's ``request_id`` outside 0..2^64-1
    (of a consumer's frame, of a producer's ``commit``: refused before it is acted on)."""
    if not 0 <= request_id <= MAX_U64:
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"request_id must be in 0..{MAX_U64}")


def check_txn(txn: tuple[int, int] | None, name: ErrorName) -> None:
    """Refuse (as ``name``) a transaction id in a frame whose halves are not 64-bit."""
    if txn is not None and not (0 <= txn[0] <= MAX_U64 and 0 <= txn[1] <= MAX_U64):
        # (two halves: the frame's type says so; no generator: this runs for every send)
        raise ServerError(name, f"a transaction id is two numbers in 0..{MAX_U64}, not {txn}")
