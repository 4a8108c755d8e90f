"""The metadata store: the contract every segtxn component writes its shared state through.

PIP-471 needs three things a plain key-value store lacks, and this class adds all three on
top of any :class:`~segtxn.metastore.engine.Engine`:

- **sequential keys**: ``put(prefix, value, sequential=True)`` appends a store-assigned,
  strictly increasing, zero-padded number to ``prefix``;
- **secondary indexes**: ``put(..., indexes={"name": key})`` maintains one index entry per
  name *in the same atomic step* as the record, and removes the old ones, so an index entry
  is never observable out of step with its record; ``index_range`` and ``watch_index``
  query and follow them;
- **partition keys**: accepted as a co-location hint. Neither shipped backend partitions
  its keyspace (memory is one process, etcd one Raft group), so the hint changes nothing
  for them; it is part of the contract so that a partitioned backend can honour it.

Every write is a compare-and-set on versions the store knows, and every atomic step is
exactly one engine transaction. To know which index entries a write must remove, the store
remembers the index entries of the records it has recently read or written (a bounded
cache: :mod:`segtxn.metastore.cache`). The cache is only ever a guess: every transaction
compares the ``mod_revision`` of each key it touches, and a failed compare reads the truth
in the same round trip and tries again (for unconditional writes) or raises (for
conditional ones). How an atomic step becomes that transaction is
:mod:`segtxn.metastore.plan`, applied by :mod:`segtxn.metastore.commits`; how a watch
outlives a broken connection,
:mod:`segtxn.metastore.watch` (and many point watches on one stream,
:mod:`segtxn.metastore.points`).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import cast

from segtxn.metastore import keys as K
from segtxn.metastore import ranges
from segtxn.metastore.cache import ABSENT, KeyCache, Known
from segtxn.metastore.commits import Commits
from segtxn.metastore.engine import (
    Engine,
    KeyValue,
    RawEvent,
)
from segtxn.metastore.engine import EventKind as RawKind
from segtxn.metastore.errors import InvalidArgument, StoreClosed
from segtxn.metastore.plan import Plan
from segtxn.metastore.points import PointWatches
from segtxn.metastore.records import (
    Delete,
    EventKind,
    IndexEntry,
    IndexEvent,
    IndexListing,
    Listing,
    Op,
    Put,
    Record,
    WatchEvent,
)
from segtxn.metastore.session import Session
from segtxn.metastore.settings import StoreSettings
from segtxn.metastore.watch import resumable

log = logging.getLogger(__name__)


class MetadataStore:
    """Async metadata store over one engine. Create it with
    :func:`segtxn.metastore.open_store`; close it with :meth:`close` (or ``async with``).

    All methods raise ``StoreClosed`` after :meth:`close`, ``StoreUnavailable`` when the
    backend cannot be reached (a write's outcome is then unknown), and ``InvalidKey`` /
    ``TooLarge`` / ``TooManyOperations`` for requests that can never succeed.
    """

    def __init__(
        self, engine: Engine, settings: StoreSettings | None = None, *, owns_engine: bool = True
    ) -> None:
        """Args:
        engine: the backend.
        settings: limits and tuning.
        owns_engine: close the engine with the store. Several store clients may share one
            engine (e.g. components of one process on one memory engine); only the owner
            closes it.
        """
        self.engine = engine
        self._owns_engine = owns_engine
        self.settings = settings or StoreSettings()
        self._cache = KeyCache(self.settings.cache_entries)
        self._commits = Commits(self._cache, self.settings)
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._closed = False

    # ================================================================== reads

    async def get(self, key: str) -> Record | None:
        """The record at ``key``, or None if there is none."""
        return (await self.get_at(key))[0]

    async def get_at(self, key: str) -> tuple[Record | None, int]:
        """The record at ``key`` (None if there is none) and the revision it was read at:
        a watch from that revision + 1 misses no later change, even of a record left alone
        longer than the store keeps history."""
        raw = K.check_key(key)
        result = await self._engine().range(raw)
        return (self._record(result.kvs[0]) if result.kvs else None), result.revision

    async def list_prefix(self, prefix: str, *, limit: int = 0) -> Listing:
        """Records whose keys start with ``prefix``, in key order.

        Args:
            prefix: a key prefix (must start with ``/``).
            limit: at most this many records (0: all); ``Listing.more`` tells if cut short.
        """
        raw = K.check_key(prefix, what="prefix")
        return await self._list(raw, K.prefix_end(raw), limit)

    async def list_range(self, lo: str, hi: str, *, limit: int = 0) -> Listing:
        """Records with ``lo <= key < hi``, in key order (see :meth:`list_prefix`)."""
        raw_lo, raw_hi = K.check_range(lo, hi)
        return await self._list(raw_lo, raw_hi, limit)

    async def _list(self, lo: bytes, hi: bytes, limit: int) -> Listing:
        if limit < 0:
            raise InvalidArgument("limit must be >= 0")
        result = await self._engine().range(lo, hi, limit=limit)
        return Listing([self._record(kv) for kv in result.kvs], result.revision, result.more)

    async def index_range(
        self,
        index: str,
        lo: str | int | Sequence[str | int] = (),
        hi: str | int | Sequence[str | int] | None = None,
        *,
        limit: int = 0,
    ) -> IndexListing:
        """Entries of ``index`` in index-key order (ties in primary-key order).

        With ``hi=None`` it returns the entries whose index key starts with the components
        of ``lo`` (``index_range("by-seg", ("s1",))`` matches ``("s1",)`` and
        ``("s1", 7)``); otherwise the half-open range ``[lo, hi)`` of index keys.
        """
        if limit < 0:
            raise InvalidArgument(f"limit must be >= 0, not {limit}")
        name, raw_lo, raw_hi = K.checked_index_bounds(index, lo, hi)
        result = await self._engine().range(raw_lo, raw_hi, limit=limit)
        entries = [self._index_entry(name, kv) for kv in result.kvs]
        return IndexListing(entries, result.revision, result.more)

    async def index_pages(
        self,
        index: str,
        lo: str | int | Sequence[str | int] = (),
        hi: str | int | Sequence[str | int] | None = None,
        *,
        page: int = 500,
    ) -> AsyncIterator[list[IndexEntry]]:
        """:meth:`index_range` in pages of at most ``page`` entries, one request each (its
        entries, copies of their records, may exceed what one answer may carry). A page
        starts after the last entry of the one before; changes meanwhile may be missed."""
        if page < 1:
            raise InvalidArgument(f"page must be >= 1, not {page}")
        name, raw_lo, raw_hi = K.checked_index_bounds(index, lo, hi)
        while True:
            result = await self._engine().range(raw_lo, raw_hi, limit=page)
            if result.kvs:
                yield [self._index_entry(name, kv) for kv in result.kvs]
            if not result.more or not result.kvs:
                return
            raw_lo = result.kvs[-1].key + b"\x00"  # the smallest key after the last one

    async def revision(self) -> int:
        """The store's current revision."""
        return await self._engine().current_revision()

    # ================================================================== writes

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int | None = None,
        sequential: bool = False,
        partition_key: str | None = None,
        indexes: Mapping[str, str | int | tuple[str | int, ...]] | None = None,
        session: Session | None = None,
    ) -> Record:
        """Write one record, and its index entries, atomically.

        Args:
            key: the key; with ``sequential=True``, the prefix to which the store appends a
                20-digit number above any assigned there (until :meth:`delete_range` empties it).
            value: at most ``settings.max_value_bytes`` bytes.
            expected_version: None writes unconditionally; ``MUST_NOT_EXIST`` (0) creates;
                a version makes the write a compare-and-set against it.
            partition_key: co-location hint (see the module docstring).
            indexes: index name -> index key for every index the record belongs to. Entries
                of indexes not named are removed; an empty mapping removes them all.
            session: makes the record ephemeral: it, and its index entries, are deleted
                when the session ends.

        Returns:
            The record as stored (its ``version`` is the revision of this write).

        Raises:
            AlreadyExists: ``expected_version=MUST_NOT_EXIST`` and the key exists.
            NotFound: a version was expected and the key does not exist.
            BadVersion: the key exists at another version.
            SessionExpired: ``session`` has expired.
        """
        op = Put(key, value, expected_version, sequential, partition_key, indexes, session)
        return cast(Record, (await self.commit([op]))[0])

    async def delete(self, key: str, *, expected_version: int | None = None) -> None:
        """Delete one record and its index entries atomically.

        Raises:
            NotFound: the key does not exist.
            BadVersion: ``expected_version`` was given and the key is at another version.
        """
        await self.commit([Delete(key, expected_version)])

    async def commit(self, ops: Sequence[Op]) -> list[Record | None]:
        """Apply several puts, deletes and checks as one atomic step: all or none.

        The step fails, changing nothing, with the error of the first operation whose
        expectation does not hold (same errors as :meth:`put` / :meth:`delete`; a
        :class:`Check` that fails raises ``BadVersion``/``NotFound``/``AlreadyExists``).
        A step may touch a key only once and needs at most 128 physical operations
        (each record, each index entry written or removed, and each sequence counter
        counts one); more raises ``TooManyOperations``.

        Returns:
            One item per op: the written Record for a Put, None for Delete and Check.
        """
        if not ops:
            return []
        return await self._commits.apply(self._engine(), Plan.validate(ops, self.settings))

    async def delete_range(self, lo: str, hi: str | None = None) -> int:
        """Delete every record with ``lo <= key < hi`` (``hi=None``: every key starting
        with ``lo``), with their index entries, and forget the sequence counters of
        prefixes it left empty (numbering starts again at 1; never below a surviving key).

        Each record disappears atomically with its index entries. The range as a whole is
        deleted in one atomic step when its records have at most about 120 index entries in
        all; a larger range is deleted in several steps, so a concurrent reader may see it
        partly deleted (never a record without its index entries, or the reverse).

        Returns:
            The number of records deleted.
        """
        if hi is None:
            raw_lo = K.check_key(lo, what="prefix")
            raw_hi = K.prefix_end(raw_lo)
        else:
            raw_lo, raw_hi = K.check_range(lo, hi)
        return await ranges.delete_range(
            self._engine(), self._cache, raw_lo, raw_hi, self.settings.max_attempts
        )

    # ================================================================== watches

    def watch(
        self, key: str, *, from_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Follow one key. Use as ``async with store.watch(k) as events: async for e in
        events``.

        Args:
            from_revision: the first revision to report (inclusive). None: changes after
                the store's current revision. To follow what a read returned, pass the
                revision the read was made at plus one (a listing's ``revision + 1``).
                ``record.version + 1`` misses nothing either, but it is the revision of
                the record's last write: for a record left alone longer than the store
                keeps history, the watch ends with ``Compacted`` at once.

        The stream survives connection loss: the store re-establishes it from the last
        revision it delivered, so the caller sees every change exactly once, in revision
        order. It ends by raising ``Compacted`` if the history it needs is gone (re-read
        and watch again), or ``StoreClosed``.
        """
        raw = K.check_key(key)
        return self._watch_records(raw, None, from_revision)

    def watch_prefix(
        self, prefix: str, *, from_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Follow every key that starts with ``prefix`` (see :meth:`watch`)."""
        raw = K.check_key(prefix, what="prefix")
        return self._watch_records(raw, K.prefix_end(raw), from_revision)

    def watch_range(
        self, lo: str, hi: str, *, from_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Follow every key in ``[lo, hi)`` (see :meth:`watch`)."""
        raw_lo, raw_hi = K.check_range(lo, hi)
        return self._watch_records(raw_lo, raw_hi, from_revision)

    def watch_index(
        self,
        index: str,
        lo: str | int | Sequence[str | int] = (),
        hi: str | int | Sequence[str | int] | None = None,
        *,
        from_revision: int | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[IndexEvent]]:
        """Follow the entries of ``index`` selected as in :meth:`index_range`."""
        name = K.check_index_name(index)
        lo_key = K.normalize_index_key(lo)
        hi_key = None if hi is None else K.normalize_index_key(hi)
        raw_lo, raw_hi = K.index_bounds(name, lo_key, hi_key)
        return self._watch_index(name, raw_lo, raw_hi, from_revision)

    @asynccontextmanager
    async def _watch_records(
        self, lo: bytes, hi: bytes | None, from_revision: int | None
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        async with resumable(
            self._engine(), lo, hi, from_revision, self.settings.watch_retry_max_s
        ) as raw_events:
            yield self._record_events(raw_events)

    async def _record_events(
        self, raw_events: AsyncIterator[RawEvent]
    ) -> AsyncIterator[WatchEvent]:
        async for e in raw_events:
            yield self._watch_event(e)

    def _watch_event(self, e: RawEvent) -> WatchEvent:
        if e.kind is RawKind.DELETE:
            self._cache.remember(e.key, ABSENT)
            return WatchEvent(EventKind.DELETE, e.key.decode(), e.mod_revision, None)
        kv = KeyValue(e.key, e.value, e.create_revision, e.mod_revision, e.lease)
        return WatchEvent(EventKind.PUT, e.key.decode(), e.mod_revision, self._record(kv))

    def point_watches(
        self, on_event: Callable[[WatchEvent], None], on_compacted: Callable[[str], None]
    ) -> PointWatches:
        """Many single-key watches on one multiplexed stream, each resumed from its own
        last revision (see :class:`~segtxn.metastore.points.PointWatches`); start it."""
        return PointWatches(
            self._engine(),
            self._watch_event,
            on_event,
            on_compacted,
            self.settings.watch_retry_max_s,
        )

    @asynccontextmanager
    async def _watch_index(
        self, name: bytes, lo: bytes, hi: bytes, from_revision: int | None
    ) -> AsyncIterator[AsyncIterator[IndexEvent]]:
        async with resumable(
            self._engine(), lo, hi, from_revision, self.settings.watch_retry_max_s
        ) as raw_events:
            yield self._index_events(name, raw_events)

    async def _index_events(
        self, name: bytes, raw_events: AsyncIterator[RawEvent]
    ) -> AsyncIterator[IndexEvent]:
        async for e in raw_events:
            ikey, primary = K.split_index_entry_key(name, e.key)
            if e.kind is RawKind.DELETE:
                yield IndexEvent(EventKind.DELETE, ikey, primary, e.mod_revision, None)
            else:
                entry = IndexEntry(ikey, primary, e.value, e.mod_revision)
                yield IndexEvent(EventKind.PUT, ikey, primary, e.mod_revision, entry)

    # ================================================================== sessions

    async def open_session(self, ttl_s: float = 10.0) -> Session:
        """Create a session (lease) with a keep-alive task; close it when done.

        Backends may round the TTL up (etcd grants whole seconds, at least 1).
        """
        if ttl_s <= 0:
            raise InvalidArgument("a session TTL must be positive")
        sent = asyncio.get_running_loop().time()
        lease_id, granted = await self._engine().lease_grant(ttl_s)
        session = Session(self.engine, lease_id, granted, sent)
        self._sessions.add(session)
        return session

    # ================================================================== lifecycle

    async def compact(self, revision: int) -> None:
        """Drop history before ``revision``: watches that need it fail with Compacted."""
        await self._engine().compact(revision)

    async def close(self) -> None:
        """Close sessions (revoking their leases) and the backend. Idempotent; raises only
        a cancellation (and what closing the engine raises).

        A session whose close fails (its revocation refused, say) is still stopped (its
        keep-alive cancelled, ``expired`` set: its lease expires in the store by itself);
        the failures are logged once, at WARNING, and the other sessions and the engine
        are closed all the same. (Only ``StoreUnavailable`` was caught, inside the
        session: any other error was raised out of here, the later sessions' keep-alives
        ran on and the engine, its connection and tasks, was never closed.)
        """
        if self._closed:
            return
        self._closed = True
        try:
            failed: list[str] = []
            for session in list(self._sessions):
                try:
                    await session.close()
                except Exception as e:
                    failed.append(f"{session.lease_id:#x}: {type(e).__name__}: {e}")
            if failed:
                log.warning(
                    "closing the store: %d session(s) not revoked (their leases expire by "
                    "themselves): %s",
                    len(failed),
                    "; ".join(failed),
                )
        finally:
            if self._owns_engine:
                await self.engine.close()

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ================================================================== internals

    def _engine(self) -> Engine:
        if self._closed:
            raise StoreClosed("the metadata store is closed")
        return self.engine

    def _record(self, kv: KeyValue) -> Record:
        value, indexes = K.unpack_value(kv.value)
        self._cache.remember(kv.key, Known(kv.mod_revision, kv.create_revision, indexes))
        return Record(
            kv.key.decode(),
            value,
            kv.mod_revision,
            kv.create_revision,
            {n: K.decode_index_key(ik) for n, ik in indexes.items()},
            kv.lease,
        )

    def _index_entry(self, name: bytes, kv: KeyValue) -> IndexEntry:
        ikey, primary = K.split_index_entry_key(name, kv.key)
        return IndexEntry(ikey, primary, kv.value, kv.mod_revision)
