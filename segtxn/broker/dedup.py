"""Producer de-duplication: a resent (producer name, sequence id) is stored once.

The broker remembers, per producer name, the highest sequence id it has stored and the
positions of the most recent ones. A send whose id is not above that is a duplicate: it is
not stored again, and the producer gets the original message id when it is still known.
A send whose original is still being written waits for that write.

Each producer's state also holds its :class:`~segtxn.broker.ordering.SendOrder`: kept here,
with the rest of what the broker knows of a producer name, it outlives the producer's
connection, so a reconnected producer's sends are stored after its old connection's.

The state is snapshotted to ``/dedup/<quoted topic>`` every ``snapshot_every`` messages;
after a restart the snapshot is loaded and the entries written after it are replayed, so
a producer reconnecting to a restarted broker is de-duplicated too.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from urllib.parse import quote

import msgspec

from segtxn.broker.entry import decode_entry
from segtxn.broker.ordering import SendOrder
from segtxn.ledger import ManagedLedger, Position
from segtxn.metastore import MetadataStore

PREFIX = "/dedup/"
RECENT_PER_PRODUCER = 1024


class DedupSnapshot(msgspec.Struct, frozen=True):
    position: tuple[int, int] | None
    """Every entry up to here is reflected in ``producers``."""
    producers: dict[str, int]
    """producer name -> highest stored sequence id."""


class ProducerState:
    def __init__(self, last: int) -> None:
        self.last = last
        self.recent: OrderedDict[int, Position] = OrderedDict()
        self.in_flight: dict[int, asyncio.Future[Position]] = {}
        self.order = SendOrder()
        """The turns of this producer's sends: they are stored in the order they arrive."""

    def stored(self, seq: int, position: Position) -> None:
        self.last = max(self.last, seq)
        self.recent[seq] = position
        while len(self.recent) > RECENT_PER_PRODUCER:
            self.recent.popitem(last=False)


class Deduplication:
    def __init__(self, topic: str, store: MetadataStore, snapshot_every: int) -> None:
        self._key = PREFIX + quote(topic, safe="")
        self._store = store
        self._every = snapshot_every
        self.producers: dict[str, ProducerState] = {}
        self._since_snapshot = 0
        self._position: Position | None = None

    def state(self, producer: str) -> ProducerState:
        state = self.producers.get(producer)
        if state is None:
            state = self.producers[producer] = ProducerState(-1)
        return state

    async def recover(self, ledger: ManagedLedger) -> None:
        """Load the snapshot and replay every entry written after it."""
        record = await self._store.get(self._key)
        start = ledger.first_position()
        if record is not None:
            snapshot = msgspec.json.decode(record.value, type=DedupSnapshot)
            for name, last in snapshot.producers.items():
                self.state(name).last = last
            if snapshot.position is not None:
                start = ledger.position_after(Position(*snapshot.position))
        while start is not None:
            entries = await ledger.read(start, max_entries=1000, max_bytes=64 << 20)
            if not entries:
                break
            for entry in entries:
                message = decode_entry(entry.payload)
                if message.marker is not None:  # a v4 transaction marker: no producer's
                    continue
                self.state(message.producer_name).stored(message.sequence_id, entry.position)
            self._position = entries[-1].position
            start = ledger.position_after(entries[-1].position)

    def note_stored(self, producer: str, seq: int, position: Position) -> bool:
        """Record a stored message; True when a snapshot is due."""
        self.state(producer).stored(seq, position)
        if self._position is None or position > self._position:
            self._position = position
        self._since_snapshot += 1
        return self._since_snapshot >= self._every

    async def snapshot(self) -> None:
        self._since_snapshot = 0
        at = self._position
        position = None if at is None else (at.ledger_id, at.entry_id)
        body = DedupSnapshot(position, {n: s.last for n, s in self.producers.items()})
        await self._store.put(self._key, msgspec.json.encode(body))

    async def delete(self) -> None:
        await self._store.delete_range(self._key, self._key + "\x01")
