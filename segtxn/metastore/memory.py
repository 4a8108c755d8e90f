"""The embedded ``memory://`` backend: an in-process, multi-version key-value engine.

This is a product backend, not a test double: ``segtxn standalone`` runs on it, and it
passes the same conformance suite as etcd. It keeps one global revision, a bounded window
of history for watches (older history is compacted away, exactly like an etcd server with
auto-compaction), and leases that expire on the event loop's clock. Nothing is persisted:
the process is the store.

Every call yields to the event loop once before it runs, as a network round trip would: a
task writing in a loop cannot starve the others, and concurrent callers interleave the way
they do against etcd (which is what the conformance suite's race tests rely on).

Watch delivery never polls: each write hands its events to the watchers whose range
matches (point watchers are found by a dict lookup, range watchers by a bounds check). A
watcher that falls more than ``max_pending_events`` behind drops its buffer and re-reads
from history, or fails with ``Compacted`` if that history is gone. A multiplexed stream
(``watch_many``) is the same watchers sharing one wake-up: each write marks the watches it
touched, so a stream of thousands of point watches does work only for those.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from sortedcontainers import SortedDict

from segtxn.metastore.engine import (
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    Compare,
    DeleteOp,
    Engine,
    EventKind,
    GetOp,
    KeyValue,
    ModEquals,
    PutOp,
    RangeResult,
    RawEvent,
    TxnOp,
    TxnResult,
    WatchMux,
    WatchMuxStream,
    WatchReply,
    WatchStream,
)
from segtxn.metastore.errors import (
    Compacted,
    InvalidArgument,
    SessionExpired,
    StoreClosed,
    TooLarge,
    TooManyOperations,
)


@dataclass(eq=False)
class _Watcher:
    lo: bytes
    hi: bytes | None
    next_revision: int
    pending: deque[list[RawEvent]] = field(default_factory=deque)
    pending_events: int = 0
    lagging: bool = False
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    on_wake: Callable[[], None] | None = None
    """Called with every wake-up (a multiplexed stream learns which watch has news)."""

    def wake(self) -> None:
        self.wakeup.set()
        if self.on_wake is not None:
            self.on_wake()

    def matches(self, key: bytes) -> bool:
        if self.hi is None:
            return key == self.lo
        return self.lo <= key < self.hi


@dataclass(eq=False)
class _Lease:
    ttl_s: float
    timer: asyncio.TimerHandle | None
    keys: set[bytes] = field(default_factory=set)


class MemoryEngine(Engine):
    """In-process engine. All methods must be called from one event loop."""

    def __init__(self, *, history_revisions: int = 100_000, max_pending_events: int = 10_000):
        self._data: SortedDict[bytes, KeyValue] = SortedDict()
        self._revision = 1
        self._history: deque[tuple[int, list[RawEvent]]] = deque()
        self._compacted = 1  # oldest revision a watch may start from
        self._history_revisions = history_revisions
        self._max_pending = max_pending_events
        self._point_watchers: dict[bytes, set[_Watcher]] = {}
        self._range_watchers: set[_Watcher] = set()
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(0x1000)
        self._closed = False

    # -- reads -------------------------------------------------------------------------

    async def range(self, lo: bytes, hi: bytes | None = None, *, limit: int = 0) -> RangeResult:
        await asyncio.sleep(0)
        self._check_open()
        if hi is None:
            kv = self._data.get(lo)
            return RangeResult([kv] if kv else [], self._revision, False)
        kvs: list[KeyValue] = []
        more = False
        for key in self._data.irange(lo, hi, inclusive=(True, False)):
            if limit and len(kvs) == limit:
                more = True
                break
            kvs.append(self._data[key])
        return RangeResult(kvs, self._revision, more)

    async def current_revision(self) -> int:
        self._check_open()
        return self._revision

    # -- writes ------------------------------------------------------------------------

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnOp],
        failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        await asyncio.sleep(0)
        self._check_open()
        self._check_ops(compares, success)
        self._check_ops((), failure)
        ok = all(self._holds(c) for c in compares)
        ops = success if ok else failure
        return TxnResult(ok, *self._apply(ops))

    def _holds(self, compare: Compare) -> bool:
        if isinstance(compare, ModEquals):
            kv = self._data.get(compare.key)
            return (kv.mod_revision if kv else 0) == compare.revision
        return all(
            self._data[k].mod_revision <= compare.revision
            for k in self._data.irange(compare.lo, compare.hi, inclusive=(True, False))
        )

    def _check_ops(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> None:
        """etcd's rules for a transaction, so both engines refuse the same requests."""
        if len(compares) > MAX_TXN_OPS or len(ops) > MAX_TXN_OPS:
            raise TooManyOperations(f"too many operations in txn request (limit {MAX_TXN_OPS})")
        size = sum(
            len(op.key) + len(op.value) if isinstance(op, PutOp) else len(op.key) for op in ops
        )
        if size > MAX_REQUEST_BYTES:
            raise TooLarge(f"request is too large ({size} > {MAX_REQUEST_BYTES} bytes)")
        puts: set[bytes] = set()
        for op in ops:
            if isinstance(op, PutOp):
                if op.key in puts:
                    raise InvalidArgument(f"duplicate key {op.key!r} given in txn request")
                puts.add(op.key)
                if op.lease and op.lease not in self._leases:
                    raise SessionExpired(f"lease {op.lease:#x} does not exist")
        for op in ops:
            if isinstance(op, DeleteOp) and any(
                k == op.key if op.range_end is None else op.key <= k < op.range_end for k in puts
            ):
                raise InvalidArgument(f"a put and a delete overlap at {op.key!r} in one txn")

    def _apply(self, ops: Sequence[TxnOp]) -> tuple[int, list[KeyValue | int | None]]:
        revision = self._revision + 1
        events: list[RawEvent] = []
        results: list[KeyValue | int | None] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._data.get(op.key))
            elif isinstance(op, PutOp):
                old = self._data.get(op.key)
                if old is not None and old.lease and old.lease != op.lease:
                    self._leases[old.lease].keys.discard(op.key)
                created = old.create_revision if old else revision
                self._data[op.key] = KeyValue(op.key, op.value, created, revision, op.lease)
                if op.lease:
                    self._leases[op.lease].keys.add(op.key)
                events.append(
                    RawEvent(EventKind.PUT, op.key, op.value, revision, created, op.lease)
                )
                results.append(None)
            else:
                results.append(self._delete(op, revision, events))
        if not events:
            return self._revision, results
        self._revision = revision
        self._record(revision, events)
        return revision, results

    def _delete(self, op: DeleteOp, revision: int, events: list[RawEvent]) -> int:
        if op.range_end is None:
            keys = [op.key] if op.key in self._data else []
        else:
            keys = list(self._data.irange(op.key, op.range_end, inclusive=(True, False)))
        for key in keys:
            old = self._data.pop(key)
            if old.lease and old.lease in self._leases:
                self._leases[old.lease].keys.discard(key)
            events.append(RawEvent(EventKind.DELETE, key, b"", revision, old.create_revision))
        return len(keys)

    def _record(self, revision: int, events: list[RawEvent]) -> None:
        self._history.append((revision, events))
        while len(self._history) > self._history_revisions:
            self._history.popleft()
            self._compacted = self._history[0][0]
        for watcher in self._interested(events):
            matching = [e for e in events if watcher.matches(e.key)]
            if watcher.lagging:
                watcher.wake()
                continue
            watcher.pending.append(matching)
            watcher.pending_events += len(matching)
            if watcher.pending_events > self._max_pending:
                watcher.pending.clear()
                watcher.pending_events = 0
                watcher.lagging = True
            watcher.wake()

    def _interested(self, events: list[RawEvent]) -> set[_Watcher]:
        found: set[_Watcher] = set()
        for event in events:
            found.update(self._point_watchers.get(event.key, ()))
        for watcher in self._range_watchers:
            if watcher not in found and any(watcher.matches(e.key) for e in events):
                found.add(watcher)
        return found

    # -- watches -----------------------------------------------------------------------

    def watch(self, lo: bytes, hi: bytes | None, start_revision: int) -> WatchStream:
        return self._watch(lo, hi, start_revision)

    @asynccontextmanager
    async def _watch(
        self, lo: bytes, hi: bytes | None, start_revision: int
    ) -> AsyncIterator[AsyncIterator[Sequence[RawEvent]]]:
        watcher = self._register(lo, hi, start_revision)
        try:
            yield self._iterate(watcher)
        finally:
            self._unregister(watcher)

    def _register(
        self,
        lo: bytes,
        hi: bytes | None,
        start_revision: int,
        on_wake: Callable[[], None] | None = None,
    ) -> _Watcher:
        """Raises Compacted (``start_revision`` is gone) or StoreClosed."""
        self._check_open()
        start = start_revision or self._revision + 1
        if start < self._compacted:
            raise Compacted(self._compacted)
        watcher = _Watcher(lo, hi, start, lagging=start <= self._revision, on_wake=on_wake)
        if hi is None:
            self._point_watchers.setdefault(lo, set()).add(watcher)
        else:
            self._range_watchers.add(watcher)
        return watcher

    def _unregister(self, watcher: _Watcher) -> None:
        if watcher.hi is None:
            group = self._point_watchers.get(watcher.lo)
            if group is not None:
                group.discard(watcher)
                if not group:
                    del self._point_watchers[watcher.lo]
        else:
            self._range_watchers.discard(watcher)

    async def _iterate(self, watcher: _Watcher) -> AsyncIterator[Sequence[RawEvent]]:
        while True:
            self._check_open()
            batch = self._take(watcher)
            if batch is None:
                watcher.wakeup.clear()
                await watcher.wakeup.wait()
            elif batch:
                yield batch

    def _take(self, watcher: _Watcher) -> list[RawEvent] | None:
        """The watcher's next batch (maybe empty), or None when it has nothing to say.
        Raises Compacted when it lagged behind the retained history."""
        if watcher.lagging:
            watcher.lagging = False
            batch = self._replay(watcher)
        elif watcher.pending:
            batch = watcher.pending.popleft()
            watcher.pending_events -= len(batch)
        else:
            return None
        batch = [e for e in batch if e.mod_revision >= watcher.next_revision]
        if batch:
            watcher.next_revision = batch[-1].mod_revision + 1
        return batch

    def watch_many(self) -> WatchMuxStream:
        return self._watch_many()

    @asynccontextmanager
    async def _watch_many(self) -> AsyncIterator[WatchMux]:
        self._check_open()
        mux = _MemoryMux(self)
        try:
            yield mux
        finally:
            for watcher in mux.watchers.values():
                self._unregister(watcher)

    def _replay(self, watcher: _Watcher) -> list[RawEvent]:
        """Events for ``watcher`` from history, from its next revision to now."""
        if watcher.next_revision < self._compacted:
            raise Compacted(self._compacted)
        # Everything from now on arrives through `pending`; start it afresh.
        watcher.pending.clear()
        watcher.pending_events = 0
        out: list[RawEvent] = []
        if not self._history:
            return out
        first = self._history[0][0]
        # history holds one entry per revision, consecutive
        for revision, events in itertools.islice(
            self._history, max(0, watcher.next_revision - first), None
        ):
            if revision >= watcher.next_revision:
                out.extend(e for e in events if watcher.matches(e.key))
        return out

    # -- leases ------------------------------------------------------------------------

    async def lease_grant(self, ttl_s: float) -> tuple[int, float]:
        self._check_open()
        lease_id = next(self._lease_ids)
        lease = _Lease(ttl_s, None)
        self._leases[lease_id] = lease
        self._arm(lease_id, lease)
        return lease_id, ttl_s

    def _arm(self, lease_id: int, lease: _Lease) -> None:
        if lease.timer is not None:
            lease.timer.cancel()
        loop = asyncio.get_running_loop()
        lease.timer = loop.call_later(lease.ttl_s, self._expire, lease_id)

    def _expire(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None or self._closed:
            return
        if lease.timer is not None:
            lease.timer.cancel()
        ops = [DeleteOp(k) for k in sorted(lease.keys)]
        self._apply(ops)

    async def lease_keepalive(self, lease_id: int) -> float:
        self._check_open()
        lease = self._leases.get(lease_id)
        if lease is None:
            return 0.0
        self._arm(lease_id, lease)
        return lease.ttl_s

    async def lease_revoke(self, lease_id: int) -> None:
        self._check_open()
        self._expire(lease_id)

    # -- maintenance -------------------------------------------------------------------

    async def compact(self, revision: int) -> None:
        self._check_open()
        if revision > self._revision:
            raise InvalidArgument(f"cannot compact at future revision {revision}")
        while self._history and self._history[0][0] < revision:
            self._history.popleft()
        self._compacted = max(self._compacted, min(revision, self._revision + 1))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lease in self._leases.values():
            if lease.timer is not None:
                lease.timer.cancel()
        for watcher in [*self._range_watchers, *itertools.chain(*self._point_watchers.values())]:
            watcher.wakeup.set()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the memory store is closed")


class _MemoryMux(WatchMux):
    """Watchers of one engine sharing one wake-up: each tells the stream it has news, so a
    reply costs a dict lookup however many watches the stream carries."""

    def __init__(self, engine: MemoryEngine) -> None:
        self._engine = engine
        self.watchers: dict[int, _Watcher] = {}
        self._ready: dict[int, None] = {}
        """Watches with something to say, in the order they said it (an ordered set)."""
        self._compacted: dict[int, int] = {}
        self._wakeup = asyncio.Event()

    def _news(self, watch_id: int) -> None:
        self._ready[watch_id] = None
        self._wakeup.set()

    async def create(self, watch_id: int, lo: bytes, hi: bytes | None, start_revision: int) -> None:
        await asyncio.sleep(0)  # a request on the wire
        try:
            watcher = self._engine._register(
                lo, hi, start_revision, on_wake=lambda: self._news(watch_id)
            )
        except Compacted as e:
            self._compacted[watch_id] = e.compacted_revision
            self._news(watch_id)
            return
        self.watchers[watch_id] = watcher
        if watcher.lagging:
            self._news(watch_id)

    async def cancel(self, watch_id: int) -> None:
        await asyncio.sleep(0)
        self._engine._check_open()
        watcher = self.watchers.pop(watch_id, None)
        if watcher is not None:
            self._engine._unregister(watcher)

    async def replies(self) -> AsyncIterator[WatchReply]:
        while True:
            self._engine._check_open()
            if not self._ready:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            watch_id = next(iter(self._ready))
            del self._ready[watch_id]
            if watch_id in self._compacted:
                yield WatchReply(watch_id, compacted=self._compacted.pop(watch_id))
                continue
            watcher = self.watchers.get(watch_id)
            if watcher is None:
                continue  # cancelled
            try:
                batch = self._engine._take(watcher)
            except Compacted as e:
                self._engine._unregister(self.watchers.pop(watch_id))
                yield WatchReply(watch_id, compacted=e.compacted_revision)
                continue
            if watcher.lagging or watcher.pending:
                self._ready[watch_id] = None  # more to say: after the others' turn
            if batch:
                yield WatchReply(watch_id, batch)
