"""A segment's orphans: transactional entries whose op record never landed.

An orphan is never shown, whatever its transaction's outcome (the buffer's invariant in
segtxn/broker/txn/buffer.py). It is recorded at ``/txn-orphans/<segment>/<position>``
before its send fails, so a broker that loads the segment later knows it too. When that put
fails, the orphan is **unsettled**: it is known here only, the read horizon stays before it
(:meth:`Orphans.floor`) and the buffer's clean-up retries the put (:meth:`Orphans.settle`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from urllib.parse import quote

from segtxn.broker.entry import decode_entry
from segtxn.broker.txn.buffer_records import ORPHANS, before
from segtxn.ledger import ManagedLedger, Position
from segtxn.metastore import MetadataStore, MetadataStoreError, NotFound
from segtxn.protocol.txn import TxnId

log = logging.getLogger(__name__)


class Orphans:
    def __init__(self, segment: str, store: MetadataStore) -> None:
        self._segment = segment
        self._store = store
        self._prefix = f"{ORPHANS}{quote(segment, safe='')}/"
        self._positions: set[Position] = set()
        self._unsettled: set[tuple[TxnId, Position]] = set()

    def __contains__(self, position: Position) -> bool:
        return position in self._positions

    def floor(self) -> Position | None:
        """The last entry before the first unsettled orphan (None: all settled)."""
        if not self._unsettled:
            return None
        return before(min(position for _, position in self._unsettled))

    @property
    def unsettled(self) -> bool:
        return bool(self._unsettled)

    async def load(self) -> None:
        """Learn the recorded orphans (a segment being loaded)."""
        listing = await self._store.list_prefix(self._prefix)
        for item in listing.records:
            ledger, _, entry = item.key.rsplit("/", 1)[1].partition("-")
            self._positions.add(Position(int(ledger, 16), int(entry, 16)))

    async def add_all(self, txn: TxnId, positions: list[Position]) -> None:
        """Make ``positions`` orphans. All of them are orphans (never shown) before the
        first put: a cancel during one (a broker stopping) must not leave a later one
        showing once its transaction commits; those not yet put are then left unsettled.
        So are they once a put fails for the store (the clean-up retries them): a put tried
        for each, with etcd silent, cost a request timeout each, and a broker's stop waits
        for this orphaning (:meth:`~segtxn.broker.txn.oprecords.OpRecordWriter.settled_by`)."""
        self._positions.update(positions)
        for n, position in enumerate(positions):
            try:
                await self._put(txn, position)
            except BaseException as e:
                self._unsettled.update((txn, rest) for rest in positions[n:])
                if not isinstance(e, MetadataStoreError):
                    raise
                log.warning(
                    "%s: %d orphan(s) from %s not yet recorded; retrying",
                    self._segment, len(positions) - n, position,
                )  # fmt: skip
                return

    async def add(self, txn: TxnId, position: Position) -> None:
        """Make ``position`` an orphan; if the store fails it stays unsettled."""
        self._positions.add(position)
        try:
            await self._put(txn, position)
        except MetadataStoreError:
            log.warning("%s: orphan %s not yet recorded; retrying", self._segment, position)
            self._unsettled.add((txn, position))

    async def settle(self) -> bool:
        """Record the unsettled orphans; whether any was (the horizon may move).

        Raises:
            MetadataStoreError: the store failed (those not yet recorded stay unsettled).
        """
        settled = False
        for txn, position in sorted(self._unsettled, key=lambda item: item[1]):
            await self._put(txn, position)
            self._unsettled.discard((txn, position))
            settled = True
        return settled

    async def trimmed(self, first: Position) -> None:
        """Forget the orphans before ``first`` (their ledgers are trimmed): an unsettled one
        too, which held the read horizon before entries that are gone and would have been
        recorded after them."""
        self._unsettled = {(t, p) for t, p in self._unsettled if p >= first}
        for position in [p for p in self._positions if p < first]:
            self._positions.discard(position)
            with contextlib.suppress(NotFound):
                await self._store.delete(self._key(position))

    async def _put(self, txn: TxnId, position: Position) -> None:
        await self._store.put(self._key(position), str(txn).encode())

    def _key(self, position: Position) -> str:
        return f"{self._prefix}{position.ledger_id:016x}-{position.entry_id:016x}"

    async def find(
        self,
        ledger: ManagedLedger,
        after: Position | None,
        covered: Callable[[TxnId, Position], bool],
    ) -> None:
        """Record as orphans the transactional entries of ``ledger`` after ``after`` (None:
        all) that ``covered`` says no writes record of their transaction covers: what a
        crash between an append and its record left (a recovery's scan of the unresolved
        tail)."""
        start = ledger.first_position() if after is None else ledger.position_after(after)
        while start is not None:
            entries = await ledger.read(start, max_entries=1000, max_bytes=64 << 20)
            if not entries:
                return
            for entry in entries:
                message = decode_entry(entry.payload)
                if message.txn is None:
                    continue
                txn = TxnId(*message.txn)
                if covered(txn, entry.position) or entry.position in self:
                    continue
                log.warning(
                    "%s: %s of %s is not covered by its writes record: an orphan",
                    self._segment,
                    entry.position,
                    txn,
                )
                await self.add(txn, entry.position)
            start = ledger.position_after(entries[-1].position)
