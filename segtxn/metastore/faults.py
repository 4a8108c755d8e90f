"""A fault-injecting engine wrapper, for the tests of every component above the store.

Wrap any engine (``open_store(url, wrap=FaultInjector)``) and then, while the system runs:

- :meth:`FaultInjector.fail` makes chosen operations raise (``StoreUnavailable`` by
  default), optionally only for keys under a prefix, a number of times;
- :meth:`FaultInjector.delay` makes chosen operations slow;
- :meth:`FaultInjector.hold` parks the answers of chosen operations until the test lets
  them go, in the order it picks (an interleaving made on purpose, not hoped for);
- :meth:`FaultInjector.apply_late` fails chosen writes to their callers at once and
  applies them when the test lets them go (an etcd proposal still queued when the
  client's call gave up);
- :meth:`FaultInjector.count` counts chosen operations from now on (how many store calls
  an action cost);
- :meth:`FaultInjector.drop_watches` breaks every open watch stream (multiplexed ones
  too, and those still being created), as a lost connection would (the store must resume
  them without the caller noticing);
- :meth:`FaultInjector.expire_sessions` revokes leases behind the holders' backs, as a
  session timeout would.

Operations are named after the engine methods: ``range``, ``txn``, ``watch``,
``current_revision``, ``lease_grant``, ``lease_keepalive``, ``lease_revoke``. On a
multiplexed stream (``watch_many``) each watch created is a ``watch`` on its key: it is
counted, and a fault made for it breaks the whole stream, as a failed write on etcd's one
Watch call would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from segtxn.metastore.engine import (
    Compare,
    DeleteOp,
    Engine,
    GetOp,
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
from segtxn.metastore.errors import MetadataStoreError, StoreUnavailable
from segtxn.metastore.fault_holds import Hold, Late, _Call

OPERATIONS = frozenset(
    {"range", "txn", "watch", "current_revision", "lease_grant", "lease_keepalive", "lease_revoke"}
)


@dataclass
class Tally:
    """Calls of one operation (on keys under a prefix) since :meth:`FaultInjector.count`."""

    operation: str
    key_prefix: bytes | None
    calls: int = 0


@dataclass
class _Rule:
    operation: str
    key_prefix: bytes | None
    times: int | None  # None: until cleared
    error: MetadataStoreError | None
    delay_s: float
    before: bool  # txn only: fail before applying (True) or after applying (False)


_END = object()

Item = TypeVar("Item")


@dataclass(eq=False)
class _Link(Generic[Item]):
    """One watch connection between the inner engine and the store. Batches (or a
    multiplexed stream's replies), the stream's own failure, and its end all travel
    through one bounded queue."""

    queue: asyncio.Queue[Item | MetadataStoreError | object]
    pump: asyncio.Task[None] | None = None
    broken: bool = False

    async def run(self, stream: AsyncIterator[Item]) -> None:
        try:
            async for batch in stream:
                await self.queue.put(batch)
        except MetadataStoreError as e:
            await self.queue.put(e)
        else:
            await self.queue.put(_END)

    def cut(self) -> None:
        self.broken = True
        if self.pump is not None:
            self.pump.cancel()
        while not self.queue.empty():  # in flight on the wire: lost with the connection
            self.queue.get_nowait()
        self.queue.put_nowait(StoreUnavailable("injected: watch connection dropped"))

    async def receive(self) -> AsyncIterator[Item]:
        while True:
            item = await self.queue.get()
            if item is _END:
                return
            if isinstance(item, MetadataStoreError):
                raise item
            yield item  # type: ignore[misc]


class FaultInjector(Engine):
    """Wraps an engine and misbehaves on request. Every injected fault is counted in
    :attr:`injected` so tests can assert that it actually fired."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self._rules: list[_Rule] = []
        self._holds: list[Hold] = []
        self._lates: list[Late] = []
        self._tallies: list[Tally] = []
        self._links: set[_Link[Sequence[RawEvent]] | _Link[WatchReply]] = set()
        self._drops = 0
        """How many times :meth:`drop_watches` ran: a watch whose creation began under an
        older count was being created across a drop (see :meth:`_listed`)."""
        self._leases: set[int] = set()
        self.injected = 0

    # -- configuration -----------------------------------------------------------------

    def fail(
        self,
        operation: str,
        *,
        key_prefix: str | bytes | None = None,
        times: int | None = 1,
        error: MetadataStoreError | None = None,
        after_apply: bool = False,
    ) -> None:
        """Make ``operation`` raise ``error`` (default ``StoreUnavailable``).

        Args:
            key_prefix: only when the operation touches a key starting with this.
            times: how many times (None: until :meth:`clear`).
            after_apply: for ``txn``, apply it first and then raise, like a reply lost
                on the way back (the outcome is unknown to the caller).
        """
        self._add(
            operation,
            key_prefix=key_prefix,
            times=times,
            error=error or StoreUnavailable("injected fault"),
            delay_s=0.0,
            before=not after_apply,
        )

    def delay(
        self,
        operation: str,
        seconds: float,
        *,
        key_prefix: str | bytes | None = None,
        times: int | None = 1,
    ) -> None:
        """Make ``operation`` take ``seconds`` longer."""
        self._add(
            operation, key_prefix=key_prefix, times=times, error=None, delay_s=seconds, before=True
        )

    def hold(
        self,
        operation: str,
        *,
        key_prefix: str | bytes | None = None,
        times: int | None = 1,
        before: bool = False,
    ) -> Hold:
        """Park the answers of ``operation`` (``range`` or ``txn``; applied already) until
        the returned :class:`Hold` lets them go. :meth:`clear` stops holding new calls; it
        never lets parked ones go.

        Args:
            key_prefix: only when the operation touches a key starting with this.
            times: how many calls to hold (None: until :meth:`clear`).
            before: park the calls themselves, before the backend applies them (a write
                that reaches the store late), instead of their answers.
        """
        if operation not in ("range", "txn"):
            raise ValueError(f"only range and txn answers can be held, not {operation!r}")
        prefix = key_prefix.encode() if isinstance(key_prefix, str) else key_prefix
        hold = Hold(operation, prefix, times, before)
        self._holds.append(hold)
        return hold

    def apply_late(self, *, key_prefix: str | bytes | None = None, times: int | None = 1) -> Late:
        """Make ``txn`` calls (touching a key under ``key_prefix``) raise
        ``StoreUnavailable`` at once, unapplied, and apply each when the returned
        :class:`Late` releases it: a write whose client call failed (deadline exceeded, a
        dropped connection) though etcd still held it, to apply after the caller looked.
        The test must release them (:meth:`Late.applied`) before it ends."""
        prefix = key_prefix.encode() if isinstance(key_prefix, str) else key_prefix
        late = Late(prefix, times)
        self._lates.append(late)
        return late

    def count(self, operation: str, *, key_prefix: str | bytes | None = None) -> Tally:
        """Count the calls of ``operation`` (touching a key under ``key_prefix``, when
        given) from now on, in the returned :class:`Tally` (``clear`` does not stop it)."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; one of {sorted(OPERATIONS)}")
        prefix = key_prefix.encode() if isinstance(key_prefix, str) else key_prefix
        tally = Tally(operation, prefix)
        self._tallies.append(tally)
        return tally

    def clear(self) -> None:
        self._rules.clear()
        self._holds.clear()
        self._lates.clear()

    @property
    def open_watches(self) -> int:
        """Watch connections currently open through this wrapper."""
        return len(self._links)

    def drop_watches(self) -> int:
        """Break every open watch stream now, losing what was in flight on it; returns
        how many were broken.

        A watch still being created (its creation is a round trip to the backend, after
        the fault check and before it is listed as open) is broken too, as soon as it is
        created, and counted in :attr:`injected` then, not in the number returned: a
        connection lost during the creation breaks the watch made on it. Left alive, it
        missed whatever the test dropped the watches for (a compaction meanwhile, say).
        """
        self._drops += 1
        links, self._links = self._links, set()
        for link in links:
            link.cut()
        self.injected += len(links)
        return len(links)

    async def expire_sessions(self) -> int:
        """Revoke every lease granted through this wrapper; returns how many."""
        leases, self._leases = self._leases, set()
        for lease_id in leases:
            await self.inner.lease_revoke(lease_id)
        self.injected += len(leases)
        return len(leases)

    def _add(
        self,
        operation: str,
        *,
        key_prefix: str | bytes | None,
        times: int | None,
        error: MetadataStoreError | None,
        delay_s: float,
        before: bool,
    ) -> None:
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; one of {sorted(OPERATIONS)}")
        prefix = key_prefix.encode() if isinstance(key_prefix, str) else key_prefix
        self._rules.append(_Rule(operation, prefix, times, error, delay_s, before))

    def _listed(self, link: _Link[Sequence[RawEvent]] | _Link[WatchReply], drops: int) -> None:
        """List ``link`` as open, or break it at once when a drop came since its creation
        began (``drops`` was :attr:`_drops` then)."""
        if self._drops != drops:
            link.cut()
            self.injected += 1
        else:
            self._links.add(link)

    def _claim(self, operation: str, keys: Sequence[bytes]) -> list[tuple[Hold, _Call]]:
        """(When the operation is called, so in call order.) The holds its answer waits in."""
        claimed = [(h, c) for h in self._holds if (c := h._claim(operation, keys)) is not None]
        self.injected += len(claimed)
        return claimed

    @staticmethod
    async def _park(claimed: list[tuple[Hold, _Call]], *, before: bool) -> None:
        """Wait in the holds ``claimed`` that park calls ``before`` the backend, or after."""
        for hold, call in claimed:
            if hold.before == before:
                await hold._park(call)

    async def _inject(self, operation: str, keys: Sequence[bytes], *, before: bool = True) -> None:
        if before:
            for tally in self._tallies:
                if tally.operation == operation and (
                    tally.key_prefix is None or any(k.startswith(tally.key_prefix) for k in keys)
                ):
                    tally.calls += 1
        for rule in list(self._rules):
            if rule.operation != operation or rule.before != before:
                continue
            if rule.key_prefix is not None and not any(k.startswith(rule.key_prefix) for k in keys):
                continue
            if rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    self._rules.remove(rule)
            self.injected += 1
            if rule.delay_s:
                await asyncio.sleep(rule.delay_s)
            if rule.error is not None:
                raise rule.error

    # -- the engine --------------------------------------------------------------------

    async def range(self, lo: bytes, hi: bytes | None = None, *, limit: int = 0) -> RangeResult:
        await self._inject("range", [lo])
        claimed = self._claim("range", [lo])
        await self._park(claimed, before=True)
        result = await self.inner.range(lo, hi, limit=limit)
        await self._park(claimed, before=False)
        return result

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()
    ) -> TxnResult:
        keys = [c.key if isinstance(c, ModEquals) else c.lo for c in compares]
        keys += [op.key for op in success if isinstance(op, PutOp | DeleteOp | GetOp)]
        await self._inject("txn", keys)
        for late in self._lates:
            if late._take(keys, lambda: self.inner.txn(compares, success, failure)):
                self.injected += 1
                raise StoreUnavailable("injected: the call failed; the write is applied later")
        claimed = self._claim("txn", keys)
        await self._park(claimed, before=True)
        result = await self.inner.txn(compares, success, failure)
        await self._inject("txn", keys, before=False)
        await self._park(claimed, before=False)
        return result

    def watch(self, lo: bytes, hi: bytes | None, start_revision: int) -> WatchStream:
        return self._watch(lo, hi, start_revision)

    @asynccontextmanager
    async def _watch(
        self, lo: bytes, hi: bytes | None, start_revision: int
    ) -> AsyncIterator[AsyncIterator[Sequence[RawEvent]]]:
        """The inner stream, pumped through a small queue that a drop can cut."""
        await self._inject("watch", [lo])
        drops = self._drops
        async with self.inner.watch(lo, hi, start_revision) as stream:
            link: _Link[Sequence[RawEvent]] = _Link(asyncio.Queue(maxsize=8))
            link.pump = asyncio.create_task(link.run(stream), name=f"fault-watch-pump-{lo!r}")
            self._listed(link, drops)
            try:
                yield link.receive()
            finally:
                self._links.discard(link)
                link.pump.cancel()
                await asyncio.gather(link.pump, return_exceptions=True)

    def watch_many(self) -> WatchMuxStream:
        return self._watch_many()

    @asynccontextmanager
    async def _watch_many(self) -> AsyncIterator[WatchMux]:
        """The inner stream's replies, pumped through a small queue that a drop can cut."""
        await self._inject("watch", [])
        drops = self._drops
        async with self.inner.watch_many() as inner:
            link: _Link[WatchReply] = _Link(asyncio.Queue(maxsize=8))
            link.pump = asyncio.create_task(link.run(inner.replies()), name="fault-watch-many-pump")
            self._listed(link, drops)
            try:
                yield _FaultyMux(self, inner, link)
            finally:
                self._links.discard(link)
                link.pump.cancel()
                await asyncio.gather(link.pump, return_exceptions=True)

    async def current_revision(self) -> int:
        await self._inject("current_revision", [])
        return await self.inner.current_revision()

    async def lease_grant(self, ttl_s: float) -> tuple[int, float]:
        await self._inject("lease_grant", [])
        lease_id, ttl = await self.inner.lease_grant(ttl_s)
        self._leases.add(lease_id)
        return lease_id, ttl

    async def lease_keepalive(self, lease_id: int) -> float:
        await self._inject("lease_keepalive", [])
        return await self.inner.lease_keepalive(lease_id)

    async def lease_revoke(self, lease_id: int) -> None:
        await self._inject("lease_revoke", [])
        self._leases.discard(lease_id)
        await self.inner.lease_revoke(lease_id)

    async def compact(self, revision: int) -> None:
        await self.inner.compact(revision)

    async def close(self) -> None:
        await self.inner.close()


class _FaultyMux(WatchMux):
    """A multiplexed stream through the injector: each create is a ``watch`` operation."""

    def __init__(self, injector: FaultInjector, inner: WatchMux, link: _Link[WatchReply]) -> None:
        self._injector = injector
        self._inner = inner
        self._link = link

    async def create(self, watch_id: int, lo: bytes, hi: bytes | None, start_revision: int) -> None:
        self._check()
        try:
            await self._injector._inject("watch", [lo])
        except MetadataStoreError:
            self._injector._links.discard(self._link)
            self._link.cut()  # a request that fails on the wire breaks the stream
            raise
        await self._inner.create(watch_id, lo, hi, start_revision)

    async def cancel(self, watch_id: int) -> None:
        self._check()
        await self._inner.cancel(watch_id)

    def _check(self) -> None:
        if self._link.broken:
            raise StoreUnavailable("injected: watch connection dropped")

    def replies(self) -> AsyncIterator[WatchReply]:
        return self._link.receive()
