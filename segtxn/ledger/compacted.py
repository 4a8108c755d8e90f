"""Compacted logs: a managed ledger that holds a table, kept bounded by compaction.

Some logs are a table in disguise: each entry is the whole current value of one thing (a v4
transaction's state, a topic's latest transaction-buffer snapshot, an open transaction's
pending acks), so a later entry about the same thing supersedes an earlier one, and the
things themselves come and go. Appending for ever makes the log grow without bound and its
replay slower each time. A :class:`CompactedLog` is such a log: its owner keeps the table
in memory, appends each change, and now and then asks for a compaction, which in order:

1. holds the log alone (:class:`WriteGate`): no append is in flight, so the owner's
   memory is exactly what the durable entries say;
2. rolls the ledger over: the next entry starts a new ledger, the **cut**;
3. re-logs what the owner still needs (``keep()``: one entry per thing it keeps);
4. records the owner's ledger properties, if any (one CAS);
5. moves the log's cursor to just before the cut (one CAS): replay starts there from now
   on; the owner learns the new positions (``relogged``) and forgets what it dropped;
6. lets appends go on, and trims: the ledgers before the cut leave the metadata (one CAS),
   then their files go.

**Why a replay after it is the same.** From the cut on, the log starts with the value of
every thing kept, as it stood with nothing in flight, followed by every later change. A
crash (a SIGKILL) between the steps leaves, for the next owner's :meth:`CompactedLog.open`:

- before step 5: the cursor where it was; the replay reads the old entries and then the
  re-logged copies, equal to the values they follow: the same table;
- after step 5, before or during step 6: replay starts at the cut; the ledgers before it
  are trimmed, and files a trim's metadata CAS had already dropped are deleted, when the
  next owner opens the log.

Appends go through the gate, which they leave when their entry's write settles (not when
their caller stops waiting): the owner applies a change to memory in ``settled``, so a
cancelled caller's durable entry is in memory before a compaction reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from segtxn.ledger.cursor import ManagedCursor
from segtxn.ledger.errors import close_after_cut
from segtxn.ledger.logs import LogStorage
from segtxn.ledger.managed import ManagedLedger
from segtxn.ledger.metadata import LedgerSettings
from segtxn.ledger.position import Entry, Position
from segtxn.ledger.retention import RetentionPolicy
from segtxn.metastore import MetadataStore

CURSOR = "compaction"
"""A compacted log's one cursor: every entry at or before it is superseded."""
TRIM_SUPERSEDED = RetentionPolicy(retention_time_s=0)
"""Delete a ledger as soon as the cursor has passed it."""

Keep = Callable[[], Awaitable[Sequence[bytes]]]
"""What a compaction re-logs, read from the owner's memory while the log is held alone."""


class WriteGate:
    """Appends share the log; a compaction holds it alone.

    An append enters before it queues its entry and leaves once the entry's write has
    settled, not when its caller stops waiting: a cancelled caller's entry is still
    written, and the compaction must not read memory before that entry is applied to it.
    Appends wait at the gate while a compaction holds it.
    """

    def __init__(self) -> None:
        self._writers = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._alone = asyncio.Lock()

    async def enter(self) -> None:
        while not self._open.is_set():
            await self._open.wait()
        self._writers += 1  # no await since the check: a compaction sees this writer
        self._idle.clear()

    def leave(self) -> None:
        self._writers -= 1
        if not self._writers:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Hold the log with no append in flight, new ones waiting until this ends."""
        async with self._alone:
            self._open.clear()
            try:
                await self._idle.wait()
                yield
            finally:
                self._open.set()


@dataclass(frozen=True)
class Compaction:
    """What one :meth:`CompactedLog.compact` did."""

    relogged: int
    trimmed_ledgers: int
    trimmed_entries: int


class CompactedLog:
    """A managed ledger used as a table (see the module docstring). Open with
    :meth:`open`; one owner at a time."""

    def __init__(self, ledger: ManagedLedger, cursor: ManagedCursor, storage: LogStorage) -> None:
        self.ledger = ledger
        self._cursor = cursor
        self._storage = storage
        self.since_compaction = 0
        """Entries after the cursor: what the next owner would replay."""
        self._gate = WriteGate()
        self._compacting = asyncio.Lock()

    @classmethod
    async def open(
        cls, name: str, store: MetadataStore, storage: LogStorage, settings: LedgerSettings
    ) -> CompactedLog:
        """Open (creating if needed) the log ``name``, finishing the trim of a compaction
        a crash interrupted. Then :meth:`replay` it.

        Raises:
            LedgerError: as :meth:`ManagedLedger.open`.
            MetadataStoreError: the store failed.
        """
        ledger = await ManagedLedger.open(name, store, storage, settings)
        try:
            cursor = await ledger.open_cursor(CURSOR, start="earliest")
            compacted = cls(ledger, cursor, storage)
            await compacted._trim()
            # what a crash during a trim left behind (nothing reads it now)
            await asyncio.to_thread(storage.delete_leftovers, ledger.name, ledger.ledger_ids[0])
        except BaseException:  # failed or stopped mid-way: nothing else would close it
            await close_after_cut(ledger.close(), name)  # (raising what cut it, not this)
            raise
        return compacted

    async def replay(self) -> AsyncIterator[list[Entry]]:
        """The entries after the cursor, in order, a batch at a time (call once, after
        :meth:`open`, before appending)."""
        start = self.ledger.position_after(self._cursor.mark_delete)
        while start is not None:
            entries = await self.ledger.read(start, max_entries=1000, max_bytes=64 << 20)
            if not entries:
                return
            self.since_compaction += len(entries)
            yield entries
            start = self.ledger.position_after(entries[-1].position)

    # ------------------------------------------------------------------ appends

    async def append(
        self,
        payload: bytes,
        settled: Callable[[Position], None] | None = None,
        *,
        admit: Callable[[], None] | None = None,
    ) -> Position:
        """Append one entry; returns its position once it is durable.

        Args:
            settled: called with the position once the entry is durable, before this
                returns, even if the caller stopped waiting: apply the change to memory
                here, so a compaction never reads memory without it.
            admit: called once the gate lets this append in, right before the entry is
                queued, with no await in between; it may refuse by raising (nothing is
                appended). A change made to memory here is seen by no compaction before
                the entry settles; the caller undoes it if this then raises.

        Raises:
            LedgerError: the write failed (``settled`` is not called).
        """
        await self._gate.enter()
        try:
            if admit is not None:
                admit()
            written = await self.ledger.enqueue(payload)
        except BaseException:
            self._gate.leave()
            raise
        written.add_done_callback(lambda done: self._settled(done, settled))
        return await asyncio.shield(written)  # (after _settled: callbacks run in order)

    def _settled(
        self, written: asyncio.Future[Position], settled: Callable[[Position], None] | None
    ) -> None:
        self._gate.leave()
        if written.cancelled() or written.exception() is not None:
            return
        self.since_compaction += 1
        if settled is not None:
            settled(written.result())

    # ------------------------------------------------------------------ compaction

    @property
    def compacting(self) -> bool:
        return self._compacting.locked()

    def due(self, threshold: int, kept: int) -> bool:
        """Whether ``threshold`` entries were appended since the last compaction, and at
        least twice as many as the ``kept`` things it would re-log (so a compaction
        re-logs at most half of what it frees). A threshold of 0 or less: never."""
        if threshold <= 0 or self.compacting:
            return False
        return self.since_compaction >= max(threshold, 2 * kept)

    async def compact(
        self,
        keep: Keep,
        *,
        properties: Callable[[], Mapping[str, str]] | None = None,
        relogged: Callable[[list[Position]], None] | None = None,
    ) -> Compaction:
        """Steps 1-6 of the module docstring; one compaction at a time.

        Args:
            keep: the entries to re-log (read from memory: nothing is in flight).
            properties: ledger properties to record before the cursor moves.
            relogged: called with the positions of the re-logged entries, in order, once
                the cursor has moved and before any append goes on: the owner points its
                index at them and forgets what it did not keep.

        Raises:
            LedgerError, MetadataStoreError: a step failed. What it leaves replays to the
                same table (the module docstring says why); the next compaction starts
                over.
        """
        async with self._compacting:
            async with self._gate.alone():
                cut = await self.ledger.roll_over()
                payloads = await keep()
                writes = [await self.ledger.enqueue(payload) for payload in payloads]
                positions = [await written for written in writes]
                if properties is not None:
                    await self.ledger.update_properties(properties())
                await self._cursor.ack_cumulative(Position(cut.ledger_id, cut.entry_id - 1))
                self.since_compaction = len(positions)
                if relogged is not None:
                    relogged(positions)
            ledgers, entries = await self._trim()
        return Compaction(len(positions), ledgers, entries)

    async def _trim(self) -> tuple[int, int]:
        """Delete the ledgers the cursor has passed; returns (ledgers, entries) deleted."""
        result = await self.ledger.trim(TRIM_SUPERSEDED)
        return len(result.ledgers), result.entries

    # ------------------------------------------------------------------ state

    @property
    def entries(self) -> int:
        """Entries after the cursor (what the next owner would replay)."""
        return self.ledger.count_after(self._cursor.mark_delete)

    @property
    def size_bytes(self) -> int:
        """Bytes of the ledgers the log retains."""
        return self.ledger.retained_bytes()

    async def close(self) -> None:
        await self.ledger.close()
