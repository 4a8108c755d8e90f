"""How a message is stored: one managed-ledger entry per message, msgpack-encoded."""

from __future__ import annotations

import msgspec


class StoredMessage(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A message as its ledger entry holds it. Untracked by the garbage collector, as
    frames are (:class:`segtxn.protocol.frames.Frame`): numbers, strings and bytes only,
    and one is made for every message written and every one delivered."""

    producer_name: str
    sequence_id: int
    publish_time_ms: int
    payload: bytes
    key: str | None = None
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    event_time_ms: int | None = None
    txn: tuple[int, int] | None = None
    """The transaction this message was written in (most, least), if any."""
    marker: str | None = None
    """A v4 transaction marker (``COMMIT`` / ``ABORT`` of ``txn``), never delivered."""
    producer_use: int = 0
    """Which use of ``producer_name`` wrote it, for de-duplication's replay (0: not
    numbered, written before uses were; see segtxn/broker/dedup.py, "A name used again")."""


def marker_entry(txn: tuple[int, int], action: str, now_ms: int) -> bytes:
    """PIP-31's commit/abort marker: an entry in the topic's own ledger."""
    return encode_entry(StoredMessage("", -1, now_ms, b"", txn=txn, marker=action))


encode_entry = msgspec.msgpack.Encoder().encode
decode_entry = msgspec.msgpack.Decoder(StoredMessage).decode
