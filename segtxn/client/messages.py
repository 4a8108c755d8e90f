"""What the client hands to applications, and the check of what applications hand it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from segtxn.protocol.limits import MAX_I64

__all__ = ["Message", "MessageId", "check_outgoing"]


class MessageId(NamedTuple):
    """Where a message is stored: the topic or segment, and its position there."""

    topic: str
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.ledger_id}:{self.entry_id}"


@dataclass(frozen=True)
class Message:
    message_id: MessageId
    value: bytes
    key: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    publish_time_ms: int = 0
    event_time_ms: int | None = None
    producer_name: str = ""
    sequence_id: int = -1
    redelivery_count: int = 0
    """How many times the subscription delivered it before (0: the first time)."""
    epoch: int = 0
    """The subscription's delivery epoch it came in: a rewind starts a new one, and the
    broker refuses to let a transaction acknowledge a message from an earlier epoch."""
    subscription: str | None = None
    """The subscription that delivered it (None: a reader's): only a consumer of that
    subscription may acknowledge it."""


def check_outgoing(value: object, key: object, properties: object, event_time_ms: object) -> None:
    """Refuse a message the broker could not even read, before it is queued: sends travel
    together in one frame, and a frame the broker cannot decode is refused whole, so one
    property of the wrong type would fail every send beside it (after the send timeout,
    with an outcome unknown). Limits (sizes, counts) are the broker's to check, message by
    message.

    Raises:
        TypeError: ``value`` is not bytes, ``key`` not a str or None, ``properties`` not a
            mapping of str to str, or ``event_time_ms`` not an int or None.
        ValueError: ``event_time_ms`` outside 0..2**63-1 (milliseconds since 1970).
    """
    if not isinstance(value, bytes):
        raise TypeError(f"a message value is bytes, not {type(value).__name__}")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"a message key is a str or None, not {type(key).__name__}")
    if properties is not None:
        if not isinstance(properties, Mapping):
            raise TypeError(f"message properties are a mapping, not {type(properties).__name__}")
        for name, text in properties.items():
            if not isinstance(name, str) or not isinstance(text, str):
                raise TypeError(
                    f"message properties map str to str, not {type(name).__name__} to "
                    f"{type(text).__name__} ({name!r}: {text!r})"
                )
    if event_time_ms is not None:
        if not isinstance(event_time_ms, int) or isinstance(event_time_ms, bool):
            raise TypeError(f"event_time_ms is an int or None, not {type(event_time_ms).__name__}")
        if not 0 <= event_time_ms <= MAX_I64:
            raise ValueError(f"event_time_ms must be in 0..{MAX_I64} (ms since 1970)")
