"""What the v5 transaction buffer keeps in the metadata store, and the shapes it keeps it in.

- ``/txn-op/<txn>/w/<segment>``: a transaction's **writes record** on a segment (its entries
  are those with its id in ``first..last``), kept in memory as a :class:`WritesDraft` and
  rewritten through the op-record writer (segtxn/broker/txn/oprecords.py);
- ``/txn-buffer/<segment>``: the **resolved watermark** (:class:`BufferState`);
- ``/txn-aborted/<segment>/<txn>``: the **aborted index** (:class:`AbortedTxn`), what stays
  of an aborted transaction once its header and records are gone;
- ``/txn-orphans/<segment>/<position>``: entries whose record never landed (never shown).

See segtxn/broker/txn/buffer.py for the rules they serve.
"""

from __future__ import annotations

import contextlib
from urllib.parse import quote

import msgspec

from segtxn.broker.txn.opdrafts import Draft
from segtxn.ledger import Position
from segtxn.metastore import MetadataStore, NotFound
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T

STATE = "/txn-buffer/"
ABORTED = "/txn-aborted/"
ORPHANS = "/txn-orphans/"


async def delete_records(store: MetadataStore, segment: str) -> None:
    """Delete a segment's watermark, aborted index and orphans (idempotent): its topic is
    deleted, or the segment retired. Left, they applied to a topic made again under the
    name, whose ledgers number their entries from ``1:0`` again: an old orphan at ``1:0``
    hid the new topic's first message for good."""
    quoted = quote(segment, safe="")
    for prefix in (f"{ABORTED}{quoted}/", f"{ORPHANS}{quoted}/"):
        await store.delete_range(prefix)
    with contextlib.suppress(NotFound):
        await store.delete(STATE + quoted)


class BufferState(msgspec.Struct, frozen=True):
    watermark: tuple[int, int] | None


class AbortedTxn(msgspec.Struct, frozen=True):
    first: tuple[int, int]
    last: tuple[int, int]


def as_position(p: tuple[int, int] | Position) -> Position:
    return Position(p[0], p[1])


def before(p: Position) -> Position:
    return Position(p.ledger_id, p.entry_id - 1)


class WritesDraft(Draft):
    """One transaction's writes record here: its entries are those with its id in
    ``first..last``; ``durable`` is the range a landed record covers."""

    def __init__(self, txn: TxnId, segment: str, position: Position) -> None:
        super().__init__(T.writes_key(txn, segment))
        self.segment = segment
        self.first = self.last = position
        self.durable: tuple[Position, Position] | None = None

    def covers(self, position: Position) -> bool:
        return self.durable is not None and self.durable[0] <= position <= self.durable[1]

    def extend(self, position: Position) -> None:
        self.first, self.last = min(self.first, position), max(self.last, position)

    def snapshot(self) -> T.WritesRecord:
        return T.WritesRecord(self.segment, self.first.as_pair(), self.last.as_pair())

    def landed(self, record: T.OpRecord) -> None:
        assert isinstance(record, T.WritesRecord)
        self.durable = (as_position(record.first), as_position(record.last))

    @classmethod
    def recovered(cls, txn: TxnId, record: T.WritesRecord) -> WritesDraft:
        draft = cls(txn, record.segment, as_position(record.first))
        draft.extend(as_position(record.last))
        draft.landed(record)
        return draft
