"""Holding a transaction's header changes from the listeners that materialize them
(``HeaderCache.hold``, used while a one-step commit is decided and answered), on a real
store's watch: the cache and the other listeners stay current, the held listeners hear
every change after the release, in order, and a change arriving meanwhile waits behind
them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from segtxn.broker.txn.headers import HeaderCache, Listener
from segtxn.metastore import MetadataStore
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T
from tests.waiting import wait_until

TXN = TxnId(7, 1)
OPEN = T.TxnHeader(TxnState.OPEN, timeout_ms=2**40, created_ms=1)
COMMITTED = T.TxnHeader(TxnState.COMMITTED, timeout_ms=2**40, created_ms=1, finalized_ms=2)


@pytest.fixture
async def cache(store: MetadataStore) -> AsyncIterator[HeaderCache]:
    headers = HeaderCache(store)
    await headers.start()
    try:
        await store.put(T.header_key(TXN), T.encode(OPEN))
        # The watch brings the OPEN header before a test listens: arriving after, it is a
        # newer header than the listener's unknown one and is heard ("staying OPEN"), which
        # the tests' exact lists do not expect (seen once on etcd, a busy machine).
        await wait_until(lambda: headers.cached(TXN) == OPEN, what="the watch brought OPEN")
        yield headers
    finally:
        await headers.close()


def heard(into: list[str], who: str) -> Listener:
    def listener(_txn: TxnId, header: T.TxnHeader | None) -> None:
        into.append(f"{who} {None if header is None else header.state.value}")

    return listener


async def _committed(store: MetadataStore, cache: HeaderCache) -> None:
    await store.put(T.header_key(TXN), T.encode(COMMITTED))
    await wait_until(
        lambda: cache.cached(TXN) == COMMITTED, what="the watch brought the COMMITTED header"
    )


async def test_held_listeners_hear_after_the_release_and_the_others_at_once(
    store: MetadataStore, cache: HeaderCache
) -> None:
    calls: list[str] = []
    cache.listen(TXN, heard(calls, "commit"))
    cache.listen(TXN, heard(calls, "segment"), materializes=True)
    assert (await cache.get(TXN))[0] == OPEN
    cache.hold(TXN)
    await _committed(store, cache)
    assert calls == ["commit COMMITTED"]
    cache.release(TXN)
    calls.append("released")  # what the releaser does next, before it awaits anything
    await wait_until(lambda: len(calls) == 3, what="the held listener caught up")
    assert calls == ["commit COMMITTED", "released", "segment COMMITTED"]


async def test_a_change_after_the_release_waits_behind_the_held_ones(
    store: MetadataStore, cache: HeaderCache
) -> None:
    """Deleted (the GC after the outcome) between the release and the catch-up: the held
    listener still hears COMMITTED first; taking the deletion alone for the outcome would
    read as an abort."""
    calls: list[str] = []
    cache.listen(TXN, heard(calls, "segment"), materializes=True)
    await cache.get(TXN)
    cache.hold(TXN)
    cache.hold(TXN)  # two commits of one transaction asked together
    await _committed(store, cache)
    cache.release(TXN)
    await store.delete(T.header_key(TXN))
    await wait_until(lambda: cache.cached(TXN) is None, what="the watch brought the delete")
    assert calls == []  # one hold is left
    cache.release(TXN)
    await wait_until(lambda: len(calls) == 2, what="the held listener caught up")
    assert calls == ["segment COMMITTED", "segment None"]


async def test_a_listener_gone_while_held_hears_nothing(
    store: MetadataStore, cache: HeaderCache
) -> None:
    gone: list[str] = []
    staying: list[str] = []
    leaving = heard(gone, "gone")
    cache.listen(TXN, leaving, materializes=True)
    cache.listen(TXN, heard(staying, "staying"), materializes=True)
    await cache.get(TXN)
    cache.hold(TXN)
    await _committed(store, cache)
    cache.forget(TXN, leaving)
    cache.release(TXN)
    await wait_until(lambda: staying == ["staying COMMITTED"], what="the other caught up")
    assert gone == []  # (the catch-up is one callback: it called both, or neither)
