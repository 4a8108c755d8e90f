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
cache). The cache is only ever a guess: every transaction compares the ``mod_revision`` of
each key it touches, and a failed compare reads the truth in the same round trip and tries
again (for unconditional writes) or raises (for conditional ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import cast

import msgspec

from segtxn.metastore import keys as K
from segtxn.metastore.engine import (
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    Compare,
    DeleteOp,
    Engine,
    GetOp,
    KeyValue,
    ModEquals,
    PutOp,
    RangeUnchangedSince,
    RawEvent,
    TxnOp,
)
from segtxn.metastore.engine import EventKind as RawKind
from segtxn.metastore.errors import (
    AlreadyExists,
    BadVersion,
    InvalidArgument,
    NotFound,
    StoreClosed,
    StoreUnavailable,
    TooLarge,
    TooManyOperations,
)
from segtxn.metastore.records import (
    MUST_NOT_EXIST,
    Check,
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

log = logging.getLogger(__name__)

_PLAIN = b"\x00"
_INDEXED = b"\x01"
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(tuple[bytes, dict[str, bytes]])


@dataclass(frozen=True)
class StoreSettings:
    """Limits and tuning of one store client."""

    max_value_bytes: int = 1024 * 1024
    """A record value larger than this is refused with ``TooLarge`` (etcd's request limit
    is 1.5 MiB, and an indexed record's value is also copied into each index entry)."""
    request_timeout_s: float = 5.0
    cache_entries: int = 65_536
    """Records whose index entries the store remembers (see module docstring)."""
    max_attempts: int = 64
    """Retries of an unconditional write that keeps losing races before StoreUnavailable."""
    watch_retry_max_s: float = 2.0
    """Longest pause between attempts to re-establish a broken watch."""


@dataclass(frozen=True, slots=True)
class _Known:
    """What the store believes about one physical key."""

    mod: int
    created: int
    indexes: Mapping[str, bytes]  # index name -> encoded index key


_ABSENT = _Known(0, 0, {})


def _pack(value: bytes, indexes: Mapping[str, bytes]) -> bytes:
    if not indexes:
        return _PLAIN + value
    return _INDEXED + _encoder.encode((value, dict(indexes)))


def _unpack(raw: bytes) -> tuple[bytes, dict[str, bytes]]:
    if raw[:1] == _INDEXED:
        value, indexes = _decoder.decode(raw[1:])
        return value, indexes
    return raw[1:], {}


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
        self._known: OrderedDict[bytes, _Known] = OrderedDict()
        self._seq_locks = [asyncio.Lock() for _ in range(64)]
        self._counters: OrderedDict[bytes, int] = OrderedDict()  # prefix -> last number
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._closed = False

    # ================================================================== reads

    async def get(self, key: str) -> Record | None:
        """The record at ``key``, or None if there is none."""
        raw = K.check_key(key)
        result = await self._engine().range(raw)
        return self._record(result.kvs[0]) if result.kvs else None

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
        name = K.check_index_name(index)
        lo_key = K.normalize_index_key(lo)
        hi_key = None if hi is None else K.normalize_index_key(hi)
        raw_lo, raw_hi = K.index_bounds(name, lo_key, hi_key)
        result = await self._engine().range(raw_lo, raw_hi, limit=max(0, limit))
        entries = [self._index_entry(name, kv) for kv in result.kvs]
        return IndexListing(entries, result.revision, result.more)

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
                20-digit number larger than any it assigned under that prefix before.
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
        plan = _Plan.validate(ops, self.settings)
        # Sequential puts under one prefix are serialised within this client, so that
        # they do not race each other for the prefix's counter (other clients still may;
        # the counter's compare-and-set arbitrates).
        stripes = sorted({hash(p) % len(self._seq_locks) for p in plan.sequential_prefixes})
        async with contextlib.AsyncExitStack() as stack:
            for i in stripes:
                await stack.enter_async_context(self._seq_locks[i])
            return await self._commit_planned(plan)

    async def _commit_planned(self, plan: _Plan) -> list[Record | None]:
        engine = self._engine()
        for _attempt in range(self.settings.max_attempts):
            to_read = plan.must_read(self._known)
            if to_read:
                result = await engine.txn([], [GetOp(raw) for raw in to_read])
                self._learn_all(to_read, result.results)
                plan.raise_if_expectation_fails(self._known, only=set(to_read))
            txn = plan.build(self._known, self._counters)
            result = await engine.txn(txn.compares, txn.success, txn.failure)
            if result.succeeded:
                return self._applied(plan, txn, result.revision)
            self._learn_all(txn.compared, result.results)
            plan.raise_if_expectation_fails(self._known)
            self._skip_taken_sequence_numbers(plan, txn)
        raise StoreUnavailable(
            f"gave up after {self.settings.max_attempts} attempts lost to concurrent writers"
        )

    def _skip_taken_sequence_numbers(self, plan: _Plan, txn: _Txn) -> None:
        for step in plan.steps:
            if step.sequential:
                raw, _ = txn.written[id(step)]
                if self._known.get(raw, _ABSENT).mod:
                    taken = int(raw[len(step.raw) :])
                    self._counters[step.raw] = max(self._counters.get(step.raw, 0), taken)

    def _applied(self, plan: _Plan, txn: _Txn, revision: int) -> list[Record | None]:
        out: list[Record | None] = []
        for step in plan.steps:
            op = step.op
            if isinstance(op, Check):
                out.append(None)
                continue
            raw, before = txn.written[id(step)]
            if isinstance(op, Delete):
                self._remember(raw, _ABSENT)
                out.append(None)
                continue
            created = before.created if before.mod else revision
            encoded = {name: K.encode_index_key(k) for name, k in step.indexes.items()}
            self._remember(raw, _Known(revision, created, encoded))
            lease = op.session.lease_id if op.session else 0
            out.append(Record(raw.decode(), op.value, revision, created, step.indexes, lease))
        for prefix, last in txn.counters.items():
            self._counters[prefix] = last
            self._counters.move_to_end(prefix)
            self._remember(K.sequence_counter_key(prefix), _Known(revision, revision, {}))
        return out

    async def delete_range(self, lo: str, hi: str | None = None) -> int:
        """Delete every record with ``lo <= key < hi`` (``hi=None``: every key starting
        with ``lo``), with their index entries, and forget the sequence counters of
        prefixes inside the range (sequential keys under them start again from 1).

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
        engine = self._engine()
        deleted = failures = 0
        while True:
            result = await engine.range(raw_lo, raw_hi, limit=MAX_TXN_OPS)
            if not result.kvs:
                break
            chosen: list[tuple[KeyValue, list[bytes]]] = []
            ops = 0
            for kv in result.kvs:
                _, indexes = _unpack(kv.value)
                entries = [K.index_entry_key(n.encode(), ik, kv.key) for n, ik in indexes.items()]
                if chosen and ops + 1 + len(entries) > MAX_TXN_OPS:
                    break
                chosen.append((kv, entries))
                ops += 1 + len(entries)
            index_ops: list[TxnOp] = [DeleteOp(e) for _, entries in chosen for e in entries]
            compares: list[Compare]
            if not result.more and len(chosen) == len(result.kvs) and len(index_ops) < MAX_TXN_OPS:
                # the whole range fits in one step
                compares = [RangeUnchangedSince(raw_lo, raw_hi, result.revision)]
                success: list[TxnOp] = [DeleteOp(raw_lo, raw_hi), *index_ops]
            else:
                compares = [ModEquals(kv.key, kv.mod_revision) for kv, _ in chosen]
                success = [DeleteOp(kv.key) for kv, _ in chosen] + index_ops
            txn = await engine.txn(compares, success)
            if not txn.succeeded:  # something in the range changed under us: read it again
                failures += 1
                if failures >= self.settings.max_attempts:
                    raise StoreUnavailable(
                        f"delete_range gave up after {failures} attempts lost to writers"
                    )
                continue
            failures = 0
            for kv, _ in chosen:
                self._remember(kv.key, _ABSENT)
            deleted += len(chosen)
        await self._delete_counters(raw_lo, raw_hi)
        return deleted

    async def _delete_counters(self, lo: bytes, hi: bytes) -> None:
        """Forget the sequence counters of prefixes whose whole key range is in [lo, hi)."""
        engine = self._engine()
        found = await engine.range(K.sequence_counter_key(lo), K.sequence_counter_key(hi))
        root = len(K.SEQUENCE_ROOT)
        covered = [kv.key for kv in found.kvs if K.prefix_end(kv.key[root:]) <= hi]
        for i in range(0, len(covered), MAX_TXN_OPS):
            chunk = covered[i : i + MAX_TXN_OPS]
            await engine.txn([], [DeleteOp(k) for k in chunk])
            for key in chunk:
                self._counters.pop(key[root:], None)
                self._known.pop(key, None)

    # ================================================================== watches

    def watch(
        self, key: str, *, from_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Follow one key. Use as ``async with store.watch(k) as events: async for e in
        events``.

        Args:
            from_revision: the first revision to report (inclusive). None: changes after
                the store's current revision. After ``get``, pass ``record.version + 1``
                to miss nothing since the read.

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
        async with self._resumable(lo, hi, from_revision) as raw_events:
            yield self._record_events(raw_events)

    async def _record_events(
        self, raw_events: AsyncIterator[RawEvent]
    ) -> AsyncIterator[WatchEvent]:
        async for e in raw_events:
            if e.kind is RawKind.DELETE:
                self._remember(e.key, _ABSENT)
                yield WatchEvent(EventKind.DELETE, e.key.decode(), e.mod_revision, None)
            else:
                kv = KeyValue(e.key, e.value, e.create_revision, e.mod_revision, e.lease)
                yield WatchEvent(EventKind.PUT, e.key.decode(), e.mod_revision, self._record(kv))

    @asynccontextmanager
    async def _watch_index(
        self, name: bytes, lo: bytes, hi: bytes, from_revision: int | None
    ) -> AsyncIterator[AsyncIterator[IndexEvent]]:
        async with self._resumable(lo, hi, from_revision) as raw_events:
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

    @asynccontextmanager
    async def _resumable(
        self, lo: bytes, hi: bytes | None, from_revision: int | None
    ) -> AsyncIterator[AsyncIterator[RawEvent]]:
        engine = self._engine()
        start = from_revision if from_revision is not None else await engine.current_revision() + 1
        if start < 1:
            raise InvalidArgument("from_revision must be >= 1")
        stream = _ResumableWatch(engine, lo, hi, start, self.settings.watch_retry_max_s)
        await stream.open()
        try:
            yield stream.events()
        finally:
            await stream.close()

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
        """Close sessions (revoking their leases) and the backend. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for session in list(self._sessions):
            await session.close()
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

    def _learn_all(self, raws: Sequence[bytes], found: Sequence[KeyValue | int | None]) -> None:
        for raw, kv in zip(raws, found, strict=True):
            self._learn(raw, None if isinstance(kv, int) else kv)

    def _learn(self, raw: bytes, kv: KeyValue | None) -> None:
        if kv is None:
            self._remember(raw, _ABSENT)
            if raw.startswith(K.SEQUENCE_ROOT):
                self._counters.pop(raw[len(K.SEQUENCE_ROOT) :], None)
            return
        if raw.startswith(K.SEQUENCE_ROOT):
            prefix = raw[len(K.SEQUENCE_ROOT) :]
            self._counters[prefix] = int(kv.value or b"0")
            self._remember(raw, _Known(kv.mod_revision, kv.create_revision, {}))
            return
        _, indexes = _unpack(kv.value)
        self._remember(raw, _Known(kv.mod_revision, kv.create_revision, indexes))

    def _remember(self, raw: bytes, known: _Known) -> None:
        self._known[raw] = known
        self._known.move_to_end(raw)
        while len(self._known) > self.settings.cache_entries:
            self._known.popitem(last=False)
        while len(self._counters) > self.settings.cache_entries:
            self._counters.popitem(last=False)

    def _record(self, kv: KeyValue) -> Record:
        value, indexes = _unpack(kv.value)
        self._remember(kv.key, _Known(kv.mod_revision, kv.create_revision, indexes))
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


# ====================================================================== planning


@dataclass(eq=False)
class _Step:
    op: Op
    raw: bytes  # the physical key (the prefix, for a sequential put)
    indexes: dict[str, K.IndexKey]

    @property
    def sequential(self) -> bool:
        return isinstance(self.op, Put) and self.op.sequential


@dataclass
class _Txn:
    compares: list[Compare]
    success: list[TxnOp]
    failure: list[TxnOp]
    compared: list[bytes]
    written: dict[int, tuple[bytes, _Known]]  # id(step) -> (physical key, state before)
    counters: dict[bytes, int]  # prefix -> last number assigned


class _Plan:
    """A validated atomic step, turned into one engine transaction per attempt."""

    def __init__(self, steps: list[_Step]) -> None:
        self.steps = steps
        self.sequential_prefixes = sorted({s.raw for s in steps if s.sequential})

    @classmethod
    def validate(cls, ops: Sequence[Op], settings: StoreSettings) -> _Plan:
        steps: list[_Step] = []
        seen: set[bytes] = set()
        for op in ops:
            if not isinstance(op, Put | Delete | Check):
                raise InvalidArgument(f"not a store operation: {op!r}")
            sequential = isinstance(op, Put) and op.sequential
            raw = K.check_key(op.key, what="prefix" if sequential else "key")
            if op.expected_version is not None and op.expected_version < 0:
                raise InvalidArgument("expected_version must be >= 0")
            if isinstance(op, Delete) and op.expected_version == MUST_NOT_EXIST:
                raise InvalidArgument("a delete cannot expect the key not to exist")
            indexes = cls._validate_put(op, settings) if isinstance(op, Put) else {}
            if not sequential:
                if raw in seen:
                    raise InvalidArgument(f"key {op.key!r} appears twice in one atomic step")
                seen.add(raw)
            steps.append(_Step(op, raw, indexes))
        return cls(steps)

    @staticmethod
    def _validate_put(op: Put, settings: StoreSettings) -> dict[str, K.IndexKey]:
        if not isinstance(op.value, bytes):
            raise InvalidArgument(f"value for {op.key!r} must be bytes")
        if len(op.value) > settings.max_value_bytes:
            raise TooLarge(
                f"value for {op.key!r} is {len(op.value)} bytes; "
                f"the limit is {settings.max_value_bytes}"
            )
        if op.sequential and op.expected_version is not None:
            raise InvalidArgument("a sequential put always creates: no expected_version")
        if op.partition_key is not None and not isinstance(op.partition_key, str):
            raise InvalidArgument("partition_key must be a str")
        if op.session is not None:
            op.session.check()
        indexes: dict[str, K.IndexKey] = {}
        for name, ikey in (op.indexes or {}).items():
            K.check_index_name(name)
            indexes[name] = K.normalize_index_key(ikey)
            K.encode_index_key(indexes[name])
        return indexes

    def must_read(self, known: Mapping[bytes, _Known]) -> list[bytes]:
        """Keys whose current state (and index entries) the step must know for sure:
        deletes, and compare-and-sets whose expected version the cache does not hold."""
        out = []
        for step in self.steps:
            op = step.op
            if isinstance(op, Delete) and op.expected_version is None:
                # a cached absence is no proof: the delete must report NotFound truthfully
                if known.get(step.raw, _ABSENT).mod == 0:
                    out.append(step.raw)
            elif isinstance(op, Put | Delete) and (op.expected_version or 0) > 0:
                state = known.get(step.raw)
                if state is None or state.mod != op.expected_version:
                    out.append(step.raw)
        return out

    def build(self, known: Mapping[bytes, _Known], counter_values: Mapping[bytes, int]) -> _Txn:
        txn = _Txn([], [], [], [], {}, {})
        size = 0

        def compare(raw: bytes, mod: int) -> None:
            txn.compares.append(ModEquals(raw, mod))
            txn.compared.append(raw)

        for prefix in self.sequential_prefixes:
            counter_key = K.sequence_counter_key(prefix)
            compare(counter_key, known.get(counter_key, _ABSENT).mod)
            txn.counters[prefix] = counter_values.get(prefix, 0)

        for step in self.steps:
            op = step.op
            if isinstance(op, Check):
                compare(step.raw, op.expected_version)
                continue
            if isinstance(op, Put) and op.sequential:
                txn.counters[step.raw] += 1
                raw = K.sequential_key(op.key, txn.counters[step.raw]).encode()
                state = _ABSENT
                compare(raw, 0)  # never overwrite: a counter reset must not reuse a key
            else:
                raw = step.raw
                state = known.get(raw, _ABSENT)
                if op.expected_version == MUST_NOT_EXIST:
                    state = _ABSENT
                compare(raw, state.mod)
            txn.written[id(step)] = (raw, state)
            old = {K.index_entry_key(n.encode(), ik, raw) for n, ik in state.indexes.items()}
            if isinstance(op, Delete):
                txn.success.append(DeleteOp(raw))
                txn.success += [DeleteOp(e) for e in sorted(old)]
                continue
            lease = op.session.lease_id if op.session else 0
            encoded = {n: K.encode_index_key(ik) for n, ik in step.indexes.items()}
            new = {K.index_entry_key(n.encode(), ik, raw) for n, ik in encoded.items()}
            txn.success.append(PutOp(raw, _pack(op.value, encoded), lease))
            txn.success += [PutOp(e, op.value, lease) for e in sorted(new)]
            txn.success += [DeleteOp(e) for e in sorted(old - new)]
            size += len(raw) + len(op.value) * (1 + len(new)) + sum(map(len, new))

        for prefix, last in txn.counters.items():
            txn.success.append(PutOp(K.sequence_counter_key(prefix), str(last).encode()))

        if len(txn.success) > MAX_TXN_OPS or len(txn.compares) > MAX_TXN_OPS:
            raise TooManyOperations(
                f"this atomic step needs {len(txn.success)} physical operations and "
                f"{len(txn.compares)} compares; the limit is {MAX_TXN_OPS} each "
                "(a record counts 1, plus 1 per index entry written or removed)"
            )
        if size > MAX_REQUEST_BYTES:
            raise TooLarge(
                f"this atomic step writes {size} bytes; the limit is {MAX_REQUEST_BYTES} "
                "(an indexed value is copied into each of its index entries)"
            )
        txn.failure = [GetOp(raw) for raw in txn.compared]
        return txn

    def raise_if_expectation_fails(
        self, known: Mapping[bytes, _Known], only: set[bytes] | None = None
    ) -> None:
        """Given what the store just learned, raise the error of the first unmet
        expectation. ``only`` limits the check to freshly read keys: for the others the
        cache is a guess, and the transaction's compares decide."""
        for step in self.steps:
            op = step.op
            if step.sequential or (only is not None and step.raw not in only):
                continue
            actual = known.get(step.raw, _ABSENT).mod
            expected = op.expected_version
            if expected is None:
                if isinstance(op, Delete) and actual == 0 and step.raw in known:
                    raise NotFound(op.key)
                continue
            if expected == actual:
                continue
            if expected == MUST_NOT_EXIST:
                raise AlreadyExists(op.key, actual)
            if actual == 0:
                raise NotFound(op.key)
            raise BadVersion(op.key, expected, actual)


# ====================================================================== watches


class _ResumableWatch:
    """An engine watch that re-establishes itself after connection loss.

    Invariant: every event with revision >= ``start`` is delivered exactly once, in
    revision order. Engines deliver whole revisions (etcd does not split a revision's
    events unless asked to fragment), so after a break it resumes from the revision after
    the last one delivered. A quiet watch resumes from its start; if compaction has passed
    that point meanwhile, it ends with ``Compacted`` and the caller re-reads.
    """

    def __init__(
        self, engine: Engine, lo: bytes, hi: bytes | None, start: int, retry_max_s: float
    ) -> None:
        self._engine = engine
        self._lo, self._hi = lo, hi
        self._next = start
        self._retry_max_s = retry_max_s
        self._stack: contextlib.AsyncExitStack | None = None
        self._iter: AsyncIterator[Sequence[RawEvent]] | None = None

    async def open(self) -> AsyncIterator[Sequence[RawEvent]]:
        """(Re-)establish the engine watch from the first revision not yet delivered."""
        await self._close_stream()
        stack = contextlib.AsyncExitStack()
        try:
            stream = await stack.enter_async_context(
                self._engine.watch(self._lo, self._hi, self._next)
            )
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._iter = stack, stream
        return stream

    async def _close_stream(self) -> None:
        stack, self._stack, self._iter = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def close(self) -> None:
        await self._close_stream()

    async def events(self) -> AsyncIterator[RawEvent]:
        delay = 0.01
        while True:
            try:
                stream = self._iter or await self.open()
                batch = await anext(stream)
            except StoreUnavailable as e:
                log.warning("watch on %r broke (%s); resuming", self._lo, e)
                await self._close_stream()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
                continue
            except StopAsyncIteration:
                return
            delay = 0.01
            for event in batch:
                if event.mod_revision < self._next:
                    continue  # already delivered before a reconnect
                yield event
            self._next = max(self._next, batch[-1].mod_revision + 1)
