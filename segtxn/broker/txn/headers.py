"""The broker's view of transaction headers, kept current by a watch.

Participants learn every outcome from the store, never from the coordinator (PIP-471). A
broker keeps one cache of the headers its segments care about, kept current in one of two
ways (:class:`HeaderWatch`, the broker's ``--header-watch``):

- ``prefix`` (the default): one watch on the ``/txn/`` prefix. It sees every header change
  in the cluster, which also lets the first send of a transaction find its header without a
  read (below), but its work grows with all transactions, not with this broker's.
- ``scoped``: one point watch per header somebody here listens to, as PIP-471 describes,
  all on one multiplexed stream (:class:`~segtxn.metastore.points.PointWatches`). A watch
  starts at the revision its header was read at + 1, and goes when nobody listens any more
  (the outcome materialized, :meth:`HeaderCache.forget`): the broker's watch work follows
  its own load. A header nobody listens to is read, never cached.

In prefix mode the watch starts before any header is read, so a change made after a read
is always seen; events older than what the cache holds are ignored. Listeners registered
for a transaction are called, on the watch task, with every newer header (or ``None``
once it is deleted). If the watch's history is compacted, every watched header is read
again (in scoped mode, that one header), and no store error after start-up ends the watch
(it is retried): see :meth:`HeaderCache._follow` and :meth:`HeaderCache._refresh`.

In prefix mode the watch also sees transactions being opened. The newest
:data:`RECENT_OPEN` OPEN headers nobody has asked about yet are kept (dropped when the
watch reports them ended), so the first send of a transaction usually finds its header
here instead of reading it: a header does not change while OPEN, and a stale one fails the
op record's version check anyway.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from segtxn.exposition import Count
from segtxn.metastore import (
    Compacted,
    EventKind,
    MetadataStore,
    StoreAccessDenied,
    StoreClosed,
    StoreUnavailable,
    WatchEvent,
)
from segtxn.metastore.points import PointWatches
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T

log = logging.getLogger(__name__)

Listener = Callable[[TxnId, "T.TxnHeader | None"], None]

RECENT_OPEN = 10_000
"""OPEN headers kept from the watch before anyone asks (about 2 MB)."""

RETRY_MIN_S = 0.01
"""The first pause before asking an unavailable store again (it doubles each time)."""


class HeaderWatch(enum.Enum):
    """How a broker's header cache follows the headers (see the module docstring)."""

    PREFIX = "prefix"
    SCOPED = "scoped"


@dataclass
class _Entry:
    header: T.TxnHeader | None
    version: int
    """Store revision the header was read or changed at (0: known absent)."""


class HeaderCache:
    """The transaction headers this broker's segments follow (see the module docstring)."""

    def __init__(
        self,
        store: MetadataStore,
        mode: HeaderWatch = HeaderWatch.PREFIX,
        events: Count | None = None,
    ) -> None:
        """``events``: counts the header changes the watch delivers (the broker's
        ``segtxn_txn_header_events_total``)."""
        self._store = store
        self.mode = mode
        self._events = events if events is not None else Count()
        self._entries: dict[TxnId, _Entry] = {}
        self._listeners: dict[TxnId, dict[Listener, bool]] = {}
        """Who follows each header, and whether the listener materializes (see ``listen``)."""
        self._held: dict[TxnId, int] = {}
        """Transactions whose materializing listeners wait (``hold``), and by how many holds."""
        self._deferred: dict[TxnId, list[T.TxnHeader | None]] = {}
        """Headers the materializing listeners of a held transaction have yet to hear, oldest
        first (kept until they heard them, even once the hold is released)."""
        self._recent: dict[TxnId, _Entry] = {}
        """OPEN headers the watch reported that nobody here has asked about (oldest first)."""
        self._reads: dict[TxnId, asyncio.Future[tuple[T.TxnHeader | None, int]]] = {}
        """Store reads in flight, shared by everyone asking for the same header."""
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self._points: PointWatches | None = (
            store.point_watches(self._on_point_event, self._on_compacted)
            if mode is HeaderWatch.SCOPED
            else None
        )
        """Scoped mode: the point watches, one per header in ``_watched``."""
        self._watched: set[TxnId] = set()
        self._stale: set[TxnId] = set()
        """Scoped mode: headers whose watch's history was compacted, to read again."""
        self._stale_ready = asyncio.Event()

    @property
    def events_seen(self) -> int:
        """Header changes this cache's watch has delivered (and decoded) so far."""
        return self._events.value

    @property
    def point_watches(self) -> int:
        """Scoped mode: how many headers are watched now (0 in prefix mode)."""
        return len(self._watched)

    async def start(self) -> None:
        """Start the watch; return once it is established.

        Raises:
            MetadataStoreError: the watch could not be established (the store did not
                answer); the watch task has ended.
        """
        if self._points is not None:
            await self._points.start()
            self._task = asyncio.create_task(self._refresh(self._points), name="txn-header-refresh")
            return
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
        if self._points is not None:
            await self._points.close()

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
                        self._on_event(event)
                        start = event.revision + 1
            except Compacted:
                compacted = True
            except StoreClosed:
                return
            except (StoreUnavailable, StoreAccessDenied) as e:  # (access may come back)
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

    def _on_event(self, event: WatchEvent) -> None:
        self._events.add(1)
        txn = T.txn_of_header_key(event.key)
        header = (
            T.decode_header(event.record.value)
            if event.kind is EventKind.PUT and event.record is not None
            else None
        )
        self._apply(txn, header, event.revision)

    # ------------------------------------------------------------------ scoped mode

    def _on_point_event(self, event: WatchEvent) -> None:
        if T.txn_of_header_key(event.key) in self._watched:
            self._on_event(event)

    def _on_compacted(self, key: str) -> None:
        """A header's point watch lost its history (it has ended): read it again."""
        txn = T.txn_of_header_key(key)
        if txn in self._watched:
            self._watched.discard(txn)
            self._stale.add(txn)
            self._stale_ready.set()

    async def _refresh(self, points: PointWatches) -> None:
        """Scoped mode: read again each header whose watch was compacted, and watch it
        from that read. A store that does not answer is asked again after a pause that
        grows to the store's ``watch_retry_max_s``; nothing but closing ends this task."""
        pause_s = RETRY_MIN_S
        while True:
            if not self._stale:
                self._stale_ready.clear()
                await self._stale_ready.wait()
                continue
            txn = next(iter(self._stale))
            self._stale.discard(txn)  # a compaction of the watch the read opens comes anew
            try:
                await self._read_and_watch(points, txn, refresh=True)
            except StoreClosed:
                return
            except (StoreUnavailable, StoreAccessDenied) as e:  # (access may come back)
                self._stale.add(txn)
                log.warning("transaction header %s could not be read again (%s); retrying", txn, e)
                await asyncio.sleep(pause_s)
                pause_s = min(pause_s * 2, self._store.settings.watch_retry_max_s)
                continue
            pause_s = RETRY_MIN_S

    async def _read_and_watch(
        self, points: PointWatches, txn: TxnId, *, refresh: bool = False
    ) -> tuple[T.TxnHeader | None, int]:
        """Scoped mode: read a header; while somebody listens, cache it and watch it from
        the revision after the read. ``refresh``: after a compaction, an absent header is
        recorded at the read's revision so that listeners hear of its deletion."""
        record, revision = await self._store.get_at(T.header_key(txn))
        header = None if record is None else T.decode_header(record.value)
        version = 0 if record is None else record.version
        if txn not in self._listeners:  # nobody (any more): not cached, not watched
            return header, version
        if refresh:
            self._apply(txn, header, revision if record is None else version)
        else:
            entry = self._entries.setdefault(txn, _Entry(None, -1))
            if entry.version < version or entry.version < 0:
                self._entries[txn] = _Entry(header, version)
        if txn not in self._watched:
            self._watched.add(txn)
            points.add(T.header_key(txn), revision + 1)
        entry = self._entries[txn]
        return entry.header, entry.version

    # ------------------------------------------------------------------ the cache

    def _apply(self, txn: TxnId, header: T.TxnHeader | None, version: int) -> None:
        entry = self._entries.get(txn)
        if entry is None:  # nobody here has asked about this transaction (yet)
            if self._points is not None:
                return  # scoped: a watch cancelled as this change was on its way
            self._recent.pop(txn, None)
            if header is not None and header.state is TxnState.OPEN:
                self._recent[txn] = _Entry(header, version)
                if len(self._recent) > RECENT_OPEN:
                    del self._recent[next(iter(self._recent))]
            return
        if entry.version >= version:
            return  # older than what we hold
        self._entries[txn] = _Entry(header, version)
        listeners = self._listeners.get(txn)
        if not listeners:
            return
        deferring = txn in self._held or txn in self._deferred
        for listener, materializes in list(listeners.items()):
            if not (deferring and materializes):
                _call(listener, txn, header)
        if deferring and any(listeners.values()):
            self._deferred.setdefault(txn, []).append(header)

    def hold(self, txn: TxnId) -> None:
        """Keep the header changes of ``txn`` from its materializing listeners until
        :meth:`release`; the cache itself and the other listeners stay current.

        A one-step commit holds its transaction while it is decided and answered: the
        store's watch event for the COMMITTED header usually reaches the broker before the
        answer to the step that wrote it, and at 64 segments their materializations took
        0.84 ms of the commit's 3.2 (bench/txn.py (a)); held, they run just after the
        answer is on its way instead. They still run, in order, on the same loop.
        """
        self._held[txn] = self._held.get(txn, 0) + 1

    def release(self, txn: TxnId) -> None:
        """End one :meth:`hold`. When none is left, the materializing listeners hear what
        they missed, in order, soon after (``call_soon``: after what the caller does next
        without awaiting, such as queueing the commit's answer); a change arriving before
        then waits behind them."""
        left = self._held[txn] - 1
        if left:
            self._held[txn] = left
            return
        del self._held[txn]
        if txn in self._deferred:
            asyncio.get_running_loop().call_soon(self._catch_up, txn)

    def _catch_up(self, txn: TxnId) -> None:
        if txn in self._held:
            return  # held again meanwhile: its release catches up
        for header in self._deferred.pop(txn, ()):
            for listener, materializes in list(self._listeners.get(txn, {}).items()):
                if materializes:
                    _call(listener, txn, header)

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
        if entry is None and self._points is None:  # (scoped: cached only for listeners)
            self._entries[txn] = _Entry(None, -1)
        reading = self._reads.get(txn)
        if reading is None:
            reading = self._reads[txn] = asyncio.ensure_future(self._read(txn))
            reading.add_done_callback(lambda done: self._read_done(txn, done))
        return await asyncio.shield(reading)

    async def _read(self, txn: TxnId) -> tuple[T.TxnHeader | None, int]:
        if self._points is not None:
            return await self._read_and_watch(self._points, txn)
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

    def listen(self, txn: TxnId, listener: Listener, *, materializes: bool = False) -> None:
        """Call ``listener`` with every newer header of ``txn`` (register before ``get``).

        ``materializes``: the listener applies the outcome to local state (a segment's
        transaction buffer, a subscription's pending acks); its calls wait while the
        transaction is held (:meth:`hold`). Others are called at once."""
        self._listeners.setdefault(txn, {})[listener] = materializes
        self._entries.setdefault(txn, _Entry(None, -1))

    def forget(self, txn: TxnId, listener: Listener) -> None:
        """Stop calling ``listener``; drop the cached header once nobody listens (and, in
        scoped mode, its point watch)."""
        listeners = self._listeners.get(txn)
        if listeners is not None:
            listeners.pop(listener, None)
            if not listeners:
                del self._listeners[txn]
                self._deferred.pop(txn, None)
                self._entries.pop(txn, None)
                if txn in self._watched and self._points is not None:
                    self._watched.discard(txn)
                    self._points.cancel(T.header_key(txn))


def _call(listener: Listener, txn: TxnId, header: T.TxnHeader | None) -> None:
    try:
        listener(txn, header)
    except Exception:
        log.exception("a header listener for %s failed", txn)
