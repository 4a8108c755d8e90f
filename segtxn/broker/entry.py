"""How a message is stored: one managed-ledger entry per message, msgpack-encoded."""

from __future__ import annotations

import msgspec


class StoredMessage(msgspec.Struct, array_like=True, frozen=True):
    producer_name: str
    sequence_id: int
    publish_time_ms: int
    payload: bytes
    key: str | None = None
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    event_time_ms: int | None = None
    txn: tuple[int, int] | None = None
    """The transaction this message was written in (most, least), if any."""


encode_entry = msgspec.msgpack.Encoder().encode
decode_entry = msgspec.msgpack.Decoder(StoredMessage).decode
