"""The v4 coordinator's transaction log (PIP-31), kept bounded by compaction.

**What it holds.** The holder of v4 coordinator id ``i`` owns the managed ledger
``__transaction_log_<i>``. Each entry is one transaction's whole state after a change (a
:class:`TxnMeta`): OPEN, new participants, COMMITTING / ABORTING / TIME_OUT, and
COMMITTED / ABORTED once the fan-out has succeeded. A transaction's latest entry is its
state.

**Who replays it.** The next holder of the id (:meth:`TxnLog.open`): every entry after the
log's ``compaction`` cursor, the latest per transaction winning. ``next_least`` is one past
the highest transaction number seen, and never below the ledger property
:data:`NEXT_LEAST`, so a number is never issued twice.

**Why it is compacted.** Without it the log grows by every transaction for ever and a
take-over replays all of it. PIP-31's coordinator trims its managed ledger; Kafka compacts
``__transaction_state``. Here, once ``compact_entries`` entries were appended since the last
compaction (and at least twice as many as the transactions it would keep, so a compaction
re-logs at most half of what it frees), :meth:`TxnLog.compact` does, in order:

1. hold the log alone (:class:`WriteGate`): no append is in flight, so ``txns`` is exactly
   what the durable entries say;
2. roll over: the next entry starts a new ledger, ``L``;
3. re-log the state of every transaction it keeps (not ended, or ended less than
   ``keep_ended_s`` ago: a repeated END_TXN still gets its answer) into ``L``;
4. record :data:`NEXT_LEAST` in the ledger's properties (one CAS);
5. move the cursor to just before ``L`` (one CAS): replay starts in ``L`` from then on;
   forget the transactions not kept; let appends go on;
6. trim: the ledgers before ``L`` leave the metadata (one CAS), then their files go.

**Why recovery stays correct.** From ``L`` on, the log starts with the state of every
transaction kept, as it stood with nothing in flight, followed by every later change: its
replay gives what replaying the whole log gives, minus the transactions that ended more than
``keep_ended_s`` before. A crash (a SIGKILL) between the steps leaves:

- before step 5: the cursor where it was; the replay reads the old entries and then the
  re-logged copies, which are equal to the states they follow: the same transactions;
- after step 5, before or during step 6: replay starts in ``L``; the ledgers before it (or
  the files a trim's metadata CAS had already dropped) are deleted by the next holder when
  it opens the log (:meth:`TxnLog._trim`);
- step 4 before 5: a transaction number is never reused, even once every transaction the
  log held has been dropped from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from segtxn.ledger import (
    LedgerSettings,
    LogStorage,
    ManagedCursor,
    ManagedLedger,
    Position,
    RetentionPolicy,
)
from segtxn.metastore import MetadataStore

OPEN, COMMITTING, ABORTING, TIME_OUT = "OPEN", "COMMITTING", "ABORTING", "TIME_OUT"
COMMITTED, ABORTED = "COMMITTED", "ABORTED"
FINAL = frozenset({COMMITTED, ABORTED})

CURSOR = "compaction"
"""The log's one cursor: every entry at or before it is superseded by what follows."""
NEXT_LEAST = "segtxn.v4.next_least"
"""Ledger property: no transaction number below it may be issued again."""
TRIM_SUPERSEDED = RetentionPolicy(retention_time_s=0)
"""Delete a ledger as soon as the cursor has passed it."""


def log_name(coordinator_id: int) -> str:
    return f"__transaction_log_{coordinator_id}"


class TxnMeta(msgspec.Struct, frozen=True):
    """One transaction as its log records it (each entry is its whole current state)."""

    txn: tuple[int, int]
    state: str
    timeout_ms: int
    created_ms: int
    partitions: list[str] = msgspec.field(default_factory=list)
    subscriptions: list[tuple[str, str]] = msgspec.field(default_factory=list)
    finalized_ms: int | None = None


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(TxnMeta).decode


class WriteGate:
    """Appends share the log; a compaction holds it alone.

    An append enters before it queues its entry and leaves once the entry's write has
    settled, not when its caller stops waiting: a cancelled caller's entry is still
    written, and the compaction must not take its snapshot before that entry's state is
    in memory. Appends wait at the gate while a compaction holds it.
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
    """What one :meth:`TxnLog.compact` did."""

    kept: int
    """Transactions re-logged (live, or ended within ``keep_ended_s``)."""
    dropped: int
    """Ended transactions forgotten (the log and memory no longer hold them)."""
    trimmed_ledgers: int
    trimmed_entries: int


class TxnLog:
    """One coordinator id's log and the transactions it holds (see the module docstring).
    Open with :meth:`open`; one owner at a time (the id's lease holder)."""

    def __init__(
        self,
        ledger: ManagedLedger,
        cursor: ManagedCursor,
        storage: LogStorage,
        *,
        compact_entries: int,
        keep_ended_s: float,
    ) -> None:
        self.ledger = ledger
        self._cursor = cursor
        self._storage = storage
        self._compact_entries = compact_entries
        self._keep_ended_s = keep_ended_s
        self.txns: dict[int, TxnMeta] = {}
        """Every transaction the log holds, by ``least``: its latest durable state."""
        self.next_least = 0
        self.replayed = 0
        """Entries the open replayed."""
        self.since_compaction = 0
        """Entries after the cursor (what a take-over would replay)."""
        self._gate = WriteGate()
        self._compacting = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        name: str,
        store: MetadataStore,
        storage: LogStorage,
        settings: LedgerSettings,
        *,
        compact_entries: int,
        keep_ended_s: float,
    ) -> TxnLog:
        """Open the log, replay it, and finish any compaction a crash interrupted.

        Raises:
            LedgerError: the ledger cannot be opened or read (``LedgerFenced``: another
                holder took it over meanwhile).
            MetadataStoreError: the store failed.
        """
        ledger = await ManagedLedger.open(name, store, storage, settings)
        try:
            cursor = await ledger.open_cursor(CURSOR, start="earliest")
            txn_log = cls(
                ledger,
                cursor,
                storage,
                compact_entries=compact_entries,
                keep_ended_s=keep_ended_s,
            )
            await txn_log._replay()
            await txn_log._trim()
            await asyncio.to_thread(txn_log._delete_leftovers)  # nothing reads them now
        except BaseException:  # failed or stopped mid-way: nothing else would close it
            await ledger.close()
            raise
        return txn_log

    async def _replay(self) -> None:
        self.next_least = int(self.ledger.properties.get(NEXT_LEAST, "0"))
        start = self.ledger.position_after(self._cursor.mark_delete)
        while start is not None:
            entries = await self.ledger.read(start, max_entries=1000, max_bytes=64 << 20)
            if not entries:
                break
            for entry in entries:
                meta = _decode(entry.payload)
                self.txns[meta.txn[1]] = meta
                self.next_least = max(self.next_least, meta.txn[1] + 1)
            self.replayed += len(entries)
            start = self.ledger.position_after(entries[-1].position)
        self.since_compaction = self.replayed

    # ------------------------------------------------------------------ appends

    def take_least(self) -> int:
        """A new transaction number (never one issued before, by this holder or any)."""
        least = self.next_least
        self.next_least += 1
        return least

    async def append(self, meta: TxnMeta) -> None:
        """Log a transaction's new state; once durable it is its state in ``txns`` (even
        if the caller stopped waiting meanwhile).

        Raises:
            LedgerError: the write failed; ``txns`` is unchanged.
        """
        await self._gate.enter()
        try:
            written = await self.ledger.enqueue(_encode(meta))
        except BaseException:
            self._gate.leave()
            raise
        written.add_done_callback(functools.partial(self._settled, meta))
        await asyncio.shield(written)  # (runs after _settled: callbacks run in order)

    def _settled(self, meta: TxnMeta, written: asyncio.Future[Position]) -> None:
        self._gate.leave()
        if not written.cancelled() and written.exception() is None:
            self.txns[meta.txn[1]] = meta
            self.since_compaction += 1

    # ------------------------------------------------------------------ compaction

    @property
    def compacting(self) -> bool:
        return self._compacting.locked()

    @property
    def due(self) -> bool:
        """Whether the log has grown enough since its last compaction to compact it."""
        if self._compact_entries <= 0 or self.compacting:
            return False
        return self.since_compaction >= max(self._compact_entries, 2 * len(self.txns))

    async def compact(self, *, now_ms: int | None = None) -> Compaction:
        """Steps 1-6 of the module docstring; one compaction at a time.

        Raises:
            LedgerError, MetadataStoreError: a step failed. What it leaves is recovered
                correctly (the module docstring says why); the next compaction starts over.
        """
        async with self._compacting:
            now = int(time.time() * 1000) if now_ms is None else now_ms
            horizon = now - self._keep_ended_s * 1000
            async with self._gate.alone():
                cut = await self.ledger.roll_over()
                kept = [
                    m
                    for m in self.txns.values()
                    if m.state not in FINAL or (m.finalized_ms or 0) >= horizon
                ]
                writes = [await self.ledger.enqueue(_encode(meta)) for meta in kept]
                for written in writes:
                    await written
                await self.ledger.update_properties({NEXT_LEAST: str(self.next_least)})
                await self._cursor.ack_cumulative(Position(cut.ledger_id, cut.entry_id - 1))
                keep = {m.txn[1] for m in kept}
                dropped = [least for least in self.txns if least not in keep]
                for least in dropped:
                    del self.txns[least]
                self.since_compaction = len(kept)
            ledgers, entries = await self._trim()
        return Compaction(len(kept), len(dropped), ledgers, entries)

    async def _trim(self) -> tuple[int, int]:
        """Delete the ledgers the cursor has passed; returns (ledgers, entries) deleted."""
        result = await self.ledger.trim(TRIM_SUPERSEDED)
        return len(result.ledgers), result.entries

    def _delete_leftovers(self) -> int:
        """Delete the files a crash during a trim left behind (at open: nothing reads).

        A trim removes its ledgers from the metadata, then deletes their files oldest
        first; a crash in between leaves the newest of them, right below the first ledger
        the metadata names (ledger ids only grow). Scan down from there to the first
        absent file."""
        ledger_id = self.ledger.ledger_ids[0] - 1
        deleted = 0
        while ledger_id > 0 and self._storage.exists(self.ledger.name, ledger_id):
            self._storage.delete(self.ledger.name, ledger_id)
            deleted += 1
            ledger_id -= 1
        return deleted

    # ------------------------------------------------------------------ state

    @property
    def entries(self) -> int:
        """Entries a take-over would replay (those after the cursor)."""
        return self.ledger.count_after(self._cursor.mark_delete)

    @property
    def size_bytes(self) -> int:
        """Bytes of the ledgers the log retains."""
        return self.ledger.retained_bytes()

    async def close(self) -> None:
        await self.ledger.close()
