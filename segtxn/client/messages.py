"""What the client hands to applications."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Message", "MessageId"]


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
