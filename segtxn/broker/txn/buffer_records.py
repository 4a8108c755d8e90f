"""What the v5 transaction buffer keeps in the metadata store, and the shapes it keeps it in.

- ``/txn-op/<txn>/w/<segment>``: a transaction's **writes record** on a segment (its entries
  are those with its id in ``first..last``), kept in memory as a :class:`WritesDraft` and
  rewritten through the op-record writer (segtxn/broker/txn/oprecords.py) when
  :class:`WritesRecords` says;
- ``/txn-buffer/<segment>``: the **resolved watermark** (:class:`BufferState`);
- ``/txn-aborted/<segment>/<txn>``: the **aborted index** (:class:`AbortedTxn`), what stays
  of an aborted transaction once its header and records are gone;
- ``/txn-orphans/<segment>/<position>``: entries whose record never landed (never shown).

See segtxn/broker/txn/buffer.py for the rules they serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec

from segtxn.broker.txn.oprecords import AppendInFlight, Draft, OpRecordWriter
from segtxn.ledger import Position
from segtxn.protocol.errors import ServerError
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T

STATE = "/txn-buffer/"
ABORTED = "/txn-aborted/"
ORPHANS = "/txn-orphans/"


class BufferState(msgspec.Struct, frozen=True):
    watermark: tuple[int, int] | None


class AbortedTxn(msgspec.Struct, frozen=True):
    first: tuple[int, int]
    last: tuple[int, int]


def as_position(p: tuple[int, int] | Position) -> Position:
    return Position(p[0], p[1])


def before(p: Position) -> Position:
    return Position(p.ledger_id, p.entry_id - 1)


def as_pair(p: Position) -> tuple[int, int]:
    return (p.ledger_id, p.entry_id)


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
        return T.WritesRecord(self.segment, as_pair(self.first), as_pair(self.last))

    def landed(self, record: T.OpRecord) -> None:
        assert isinstance(record, T.WritesRecord)
        self.durable = (as_position(record.first), as_position(record.last))

    @classmethod
    def recovered(cls, txn: TxnId, record: T.WritesRecord) -> WritesDraft:
        draft = cls(txn, record.segment, as_position(record.first))
        draft.extend(as_position(record.last))
        draft.landed(record)
        return draft


class WritesRecords:
    """The writes records of one segment: when each is rewritten, and what an append waits
    for before its entry counts as recorded."""

    def __init__(
        self, segment: str, ops: OpRecordWriter, *, has_entries: Callable[[TxnId], bool]
    ) -> None:
        self.segment = segment
        self._ops = ops
        self._has_entries = has_entries
        """Whether the buffer tracks entries of a transaction here (its record stays)."""
        self.drafts: dict[TxnId, WritesDraft] = {}

    def ahead(
        self, txn: TxnId, version: int, predicted: list[Position], appended: AppendInFlight
    ) -> asyncio.Future[None] | None:
        """Start the rewrite that covers the positions the ledger predicted for entries
        just queued, while they are being written: the store's round trip overlaps the
        disk's instead of following it. Sound because a prediction is never too high (no
        entry queued later is written at or before it, ``segtxn.ledger.Queued``): a record
        landing while OPEN covers only entries queued before its step began, as one written
        after the appends would. A too-low prediction (the ledger rolled over) leaves the
        entry uncovered, and :meth:`cover` rewrites the record once its position is known.

        Returns the step's future (``OpRecordWriter.submit``), or None if nothing is to be
        written ahead (``appended`` then ends: nothing of it joins a step now)."""
        draft = self.drafts.get(txn)
        if draft is None and predicted:
            draft = self.drafts[txn] = WritesDraft(txn, self.segment, predicted[0])
        if draft is None or draft.failed is not None or all(map(draft.covers, predicted)):
            appended.end()
            return None
        for position in predicted:
            draft.extend(position)
        return self._ops.submit(txn, version, draft, appended)

    async def cover(
        self,
        txn: TxnId,
        version: int,
        positions: list[Position],
        appended: AppendInFlight,
        ahead: asyncio.Future[None] | None,
    ) -> None:
        """Make the writes record cover ``positions`` (durable entries): nothing more to
        write when a landed one does (they were queued before that record's step began,
        so before its header check passed); otherwise a rewrite with a check that the
        header is still at ``version`` (the late-write race is settled there), shared with
        every append waiting for it. ``ahead`` is awaited first (its failure is this one's).

        Raises ServerError: see ``OpRecordWriter.write``.
        """
        try:
            if ahead is not None:
                await asyncio.shield(ahead)
            draft = self.drafts.get(txn)
            if draft is None:
                draft = self.drafts[txn] = WritesDraft(txn, self.segment, positions[0])
            if all(draft.covers(position) for position in positions):
                draft.refuse_if_failed()
                return
            for position in positions:
                draft.extend(position)
            await self._ops.write(txn, version, draft, appended)
        except ServerError:
            failed = self.drafts.get(txn)
            if failed is not None and not self._has_entries(txn) and failed.durable is None:
                del self.drafts[txn]  # nothing of it here: nothing to clean up
            raise
