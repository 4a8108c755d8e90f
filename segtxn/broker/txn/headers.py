"""The broker's view of transaction headers, kept current by a watch.

Participants learn every outcome from the store, never from the coordinator (PIP-471). A
broker keeps one cache of the headers its segments care about and one watch on the
``/txn/`` prefix that keeps the cache current (PIP-471 speaks of one point-watch per cached
header; a single prefix watch has the same semantics with one stream instead of thousands).

The watch starts before any header is read, so a change made after a read is always seen;
events older than what the cache holds are ignored. Listeners registered for a transaction
are called, on the watch task, with every newer header (or ``None`` once it is deleted).
If the watch's history is compacted, every watched header is read again, and no store
error after start-up ends the watch (it is retried): see :meth:`HeaderCache._follow`.

The watch also sees transactions being opened. The newest :data:`RECENT_OPEN` OPEN headers
nobody has asked about yet are kept (dropped when the watch reports them ended), so the
first send of a transaction usually finds its header here instead of reading it: a header
does not change while OPEN, and a stale one fails the op record's version check anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from segtxn.metastore import Compacted, EventKind, MetadataStore, StoreClosed, StoreUnavailable
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T

log = logging.getLogger(__name__)

Listener = Callable[[TxnId, "T.TxnHeader | None"], None]

RECENT_OPEN = 10_000
"""OPEN headers kept from the watch before anyone asks (about 2 MB)."""

RETRY_MIN_S = 0.01
"""The first pause before asking an unavailable store again (it doubles each time)."""


@dataclass
class _Entry:
    header: T.TxnHeader | None
    version: int
    """Store revision the header was read or changed at (0: known absent)."""


class HeaderCache:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._entries: dict[TxnId, _Entry] = {}
        self._listeners: dict[TxnId, set[Listener]] = {}
        self._recent: dict[TxnId, _Entry] = {}
        """OPEN headers the watch reported that nobody here has asked about (oldest first)."""
        self._reads: dict[TxnId, asyncio.Future[tuple[T.TxnHeader | None, int]]] = {}
        """Store reads in flight, shared by everyone asking for the same header."""
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()

    async def start(self) -> None:
        """Start the watch; return once it is established.

        Raises:
            MetadataStoreError: the watch could not be established (the store did not
                answer); the watch task has ended.
        """
        self._task = asyncio.create_task(self._follow(), name="txn-header-watch")
        started = asyncio.create_task(self._started.wait(), name="txn-header-watch-started")
        try:
            await asyncio.wait({self._task, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
            await asyncio.gather(started, return_exceptions=True)
        if not self._started.is_set():
            self._task.result()  # it ended before the watch was up: raise what ended it
            raise StoreClosed("the header watch ended before it started")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _follow(self) -> None:
        """Keep the cache current until the store is closed.

        Once the watch is up, no store error ends this task: it is how the broker learns
        every outcome, and nobody awaits it. The watch resumes by itself after a lost
        connection; what it cannot do alone is done here. When the history it would
        resume from is compacted, the watched headers are read again and the watch is
        opened after those reads; when the store does not answer either step, it is asked
        again after a pause that grows to the store's ``watch_retry_max_s``.
        """
        start: int | None = None
        compacted = False
        pause_s = RETRY_MIN_S
        while True:
            try:
                if compacted:
                    start = await self._reread()
                    compacted = False
                async with self._store.watch_prefix(T.HEADERS, from_revision=start) as events:
                    self._started.set()
                    pause_s = RETRY_MIN_S
                    async for event in events:
                        txn = T.txn_of_header_key(event.key)
                        header = (
                            T.decode_header(event.record.value)
                            if event.kind is EventKind.PUT and event.record is not None
                            else None
                        )
                        self._apply(txn, header, event.revision)
                        start = event.revision + 1
            except Compacted:
                compacted = True
            except StoreClosed:
                return
            except StoreUnavailable as e:
                if not self._started.is_set():
                    raise  # start() reports it: a broker without the watch does not start
                log.warning("the transaction header watch could not resume (%s); retrying", e)
                await asyncio.sleep(pause_s)
                pause_s = min(pause_s * 2, self._store.settings.watch_retry_max_s)

    async def _reread(self) -> int:
        """After compaction: read every watched header again; watch from after the reads."""
        revision = await self._store.revision()
        self._recent.clear()  # their ends may be among the events lost
        for txn in list(self._listeners):
            record = await self._store.get(T.header_key(txn))
            if record is None:
                self._apply(txn, None, revision)
            else:
                self._apply(txn, T.decode_header(record.value), record.version)
        return revision + 1

    def _apply(self, txn: TxnId, header: T.TxnHeader | None, version: int) -> None:
        entry = self._entries.get(txn)
        if entry is None:  # nobody here has asked about this transaction (yet)
            self._recent.pop(txn, None)
            if header is not None and header.state is TxnState.OPEN:
                self._recent[txn] = _Entry(header, version)
                if len(self._recent) > RECENT_OPEN:
                    del self._recent[next(iter(self._recent))]
            return
        if entry.version >= version:
            return  # older than what we hold
        self._entries[txn] = _Entry(header, version)
        for listener in list(self._listeners.get(txn, ())):
            try:
                listener(txn, header)
            except Exception:
                log.exception("a header listener for %s failed", txn)

    async def get(self, txn: TxnId) -> tuple[T.TxnHeader | None, int]:
        """The header (None if absent) and its version; cached after the first read.

        Callers asking while a read of ``txn`` is in flight share it: a hundred sends of a
        new transaction arriving together cost one store read, not a hundred. A
        placeholder is cached before the read, so a change the watch reports while the read
        is in flight is kept rather than overwritten by the older read.

        Raises:
            MetadataStoreError: the read failed (every caller sharing it gets the error).
        """
        entry = self._entries.get(txn)
        if entry is not None and entry.version >= 0:
            return entry.header, entry.version
        recent = self._recent.pop(txn, None)
        if recent is not None:  # opened lately, as the watch reported: no read needed
            self._entries[txn] = recent
            return recent.header, recent.version
        if entry is None:
            self._entries[txn] = _Entry(None, -1)
        reading = self._reads.get(txn)
        if reading is None:
            reading = self._reads[txn] = asyncio.ensure_future(self._read(txn))
            reading.add_done_callback(lambda done: self._read_done(txn, done))
        return await asyncio.shield(reading)

    async def _read(self, txn: TxnId) -> tuple[T.TxnHeader | None, int]:
        record = await self._store.get(T.header_key(txn))
        entry = self._entries.setdefault(txn, _Entry(None, -1))
        read_version = 0 if record is None else record.version
        if entry.version < read_version or entry.version < 0:
            header = None if record is None else T.decode_header(record.value)
            entry = self._entries[txn] = _Entry(header, read_version)
        return entry.header, entry.version

    def _read_done(self, txn: TxnId, done: asyncio.Future[tuple[T.TxnHeader | None, int]]) -> None:
        if self._reads.get(txn) is done:
            del self._reads[txn]
        if not done.cancelled():
            done.exception()  # retrieved: the callers (if any are left) re-raise it

    def cached(self, txn: TxnId) -> T.TxnHeader | None:
        """The header as last seen, without a read (None: not known here)."""
        entry = self._entries.get(txn) or self._recent.get(txn)
        return None if entry is None else entry.header

    def listen(self, txn: TxnId, listener: Listener) -> None:
        """Call ``listener`` with every newer header of ``txn`` (register before ``get``)."""
        self._listeners.setdefault(txn, set()).add(listener)
        self._entries.setdefault(txn, _Entry(None, -1))

    def forget(self, txn: TxnId, listener: Listener) -> None:
        """Stop calling ``listener``; drop the cached header once nobody listens."""
        listeners = self._listeners.get(txn)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self._listeners[txn]
                self._entries.pop(txn, None)
