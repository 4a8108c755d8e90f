"""The broker's store watches after the store compacted the history they would resume from.

A long-running store keeps only recent history (etcd's auto-compaction; the memory engine's
bounded history). A watch that needs older history ends with ``Compacted``; what a broker
builds on a watch must then re-read and carry on, never stall or fail for good.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest

from segtxn.broker.txn.headers import HeaderCache, HeaderWatch
from segtxn.client import Client
from segtxn.metastore import (
    MetadataStore,
    MetadataStoreError,
    StoreAccessDenied,
    StoreSettings,
    StoreUnavailable,
    open_store,
)
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T
from segtxn.topics.catalog import topic_key
from tests.cluster import Cluster
from tests.waiting import wait_compacted, wait_until

TOPIC = "topic://acme/compact/events"


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    """A client of the cluster (tests/broker's own ``client`` is of a lone broker)."""
    async with Client(cluster.url) as c:
        yield c


async def test_a_lookup_session_on_a_topic_older_than_the_history_pushes_changes(
    client: Client, cluster: Cluster
) -> None:
    """Regression: the session watched from the topic record's own version, the revision it
    was last written at. Once compaction passed it (any topic left alone longer than the
    retention), every session failed right after its first frame, the client reconnected
    every 2 s, and no change was ever pushed."""
    await client.admin.create_topic(TOPIC, segments=1)
    for i in range(5):  # later writes elsewhere: the topic's record is now history
        await cluster.store.put(f"/unrelated/{i}", b"x")
    await cluster.store.compact(await cluster.store.revision())
    topic = TopicName.parse(TOPIC)
    ws = await client.connector.websocket(client.connector.service_url, "lookup", topic, "", {})
    async with ws:
        first = await ws.receive(timeout=10)
        assert first.type is aiohttp.WSMsgType.TEXT
        assert len(json.loads(first.data)["segments"]) == 1
        await client.admin.split(TOPIC, 0)
        while True:  # the split may be pushed in steps: wait for its last one
            pushed = await ws.receive(timeout=10)
            assert pushed.type is aiohttp.WSMsgType.TEXT, pushed  # not a close: it lives on
            dag = json.loads(pushed.data)
            if sum(s["state"] == "ACTIVE" for s in dag["segments"]) == 2:
                break
        assert dag["epoch"] > json.loads(first.data)["epoch"]


async def test_a_lookup_session_cut_off_past_the_history_sends_what_changed_meanwhile(
    client: Client, cluster: Cluster
) -> None:
    """The session's watch is down while the topic is split and the history compacted: when
    it comes back, the session reads the topic again and sends the new DAG."""
    await client.admin.create_topic(TOPIC, segments=1)
    topic = TopicName.parse(TOPIC)
    ws = await client.connector.websocket(client.connector.service_url, "lookup", topic, "", {})
    async with ws:
        first = await ws.receive(timeout=10)
        assert first.type is aiohttp.WSMsgType.TEXT
        cluster.faults.fail("watch", key_prefix=topic_key(topic), times=None)
        assert cluster.faults.drop_watches() >= 1  # the session's, and the broker's own
        await client.admin.split(TOPIC, 0)
        await cluster.store.compact(await cluster.store.revision())
        cluster.faults.clear()
        while True:
            pushed = await ws.receive(timeout=10)
            assert pushed.type is aiohttp.WSMsgType.TEXT, pushed
            dag = json.loads(pushed.data)
            if sum(s["state"] == "ACTIVE" for s in dag["segments"]) == 2:
                break


# -- the header cache ------------------------------------------------------------------

OPEN = T.TxnHeader(TxnState.OPEN, timeout_ms=2**40, created_ms=1)
COMMITTED = T.TxnHeader(TxnState.COMMITTED, timeout_ms=2**40, created_ms=1, finalized_ms=2)


@pytest.fixture
async def store(compacting_etcd: EtcdServer) -> AsyncIterator[MetadataStore]:
    """A store on an etcd that compacts its own history every second."""
    url = compacting_etcd.url(f"/headers-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    async with open_store(url, StoreSettings(watch_retry_max_s=0.2), wrap=FaultInjector) as s:
        yield s


@pytest.fixture(params=list(HeaderWatch), ids=lambda mode: mode.value)
async def cache(store: MetadataStore, request: pytest.FixtureRequest) -> AsyncIterator[HeaderCache]:
    """A header cache in each mode: one prefix watch, or one point watch per header."""
    cache = HeaderCache(store, request.param)
    await cache.start()
    yield cache
    await cache.close()


def faults_of(store: MetadataStore) -> FaultInjector:
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    return engine


class Seen:
    """A header listener that records the outcomes it was told, per transaction: final
    headers, and None for a deleted one. (It may also be told OPEN, when the watch reports
    the create while the cache's first read is in flight: not recorded.)"""

    def __init__(self) -> None:
        self.outcomes: dict[TxnId, list[T.TxnHeader | None]] = {}

    def __call__(self, txn: TxnId, header: T.TxnHeader | None) -> None:
        if header is None or header.state.final:
            self.outcomes.setdefault(txn, []).append(header)

    def last(self, txn: TxnId) -> T.TxnHeader | None:
        return self.outcomes.get(txn, [OPEN])[-1]


async def follow(cache: HeaderCache, store: MetadataStore, *txns: TxnId) -> Seen:
    """Open ``txns`` and have ``cache`` follow them, as a buffer does (listen, then get)."""
    seen = Seen()
    for txn in txns:
        opened = await store.put(T.header_key(txn), T.encode(OPEN))
        cache.listen(txn, seen)
        assert await cache.get(txn) == (OPEN, opened.version)
    return seen


async def test_the_header_cache_learns_outcomes_whose_events_were_compacted(
    store: MetadataStore, cache: HeaderCache
) -> None:
    """A broker cut off from the store while a transaction commits and another is
    collected, for longer than the store keeps history, still learns both outcomes."""
    committed, collected = TxnId(0x5_0000, 1), TxnId(0x5_0000, 2)
    seen = await follow(cache, store, committed, collected)
    faults = faults_of(store)
    faults.fail("watch", key_prefix=T.HEADERS, times=None)
    assert faults.drop_watches() == 1
    commit = await store.put(T.header_key(committed), T.encode(COMMITTED))
    await store.delete(T.header_key(collected))
    await wait_compacted(store, commit.version)
    assert seen.outcomes == {}  # cut off: nothing told the listeners yet
    faults.clear()
    await wait_until(
        lambda: seen.last(committed) == COMMITTED and collected in seen.outcomes,
        what="both outcomes re-read",
    )
    assert seen.outcomes == {committed: [COMMITTED], collected: [None]}
    assert cache.cached(committed) == COMMITTED


@pytest.mark.parametrize("error", [StoreUnavailable, StoreAccessDenied])
async def test_store_errors_after_a_compaction_do_not_end_the_header_watch(
    store: MetadataStore, cache: HeaderCache, error: type[MetadataStoreError]
) -> None:
    """Regression: after a compaction the cache re-reads its headers and watches again,
    outside the retries of the watch itself. A store error in either step ended the watch
    task for good (nobody awaits it): the broker never learned another outcome. A refusal
    (``StoreAccessDenied``: a permission taken away, and given back) did so still."""
    txn = TxnId(0x5_0000, 3)
    seen = await follow(cache, store, txn)
    faults = faults_of(store)
    faults.fail("watch", key_prefix=T.HEADERS, times=None)
    assert faults.drop_watches() == 1
    commit = await store.put(T.header_key(txn), T.encode(COMMITTED))
    await wait_compacted(store, commit.version)
    faults.clear()
    faults.fail("range", key_prefix=T.HEADERS, times=1, error=error("injected"))  # 1st re-read
    held = faults.hold("range", key_prefix=T.HEADERS, times=1)  # the second is held...
    injected = faults.injected
    await held.wait_for(1)
    faults.fail("watch", key_prefix=T.HEADERS, times=1, error=error("injected"))  # ...till then
    held.release()
    await wait_until(
        # the failed read, the held one, the failed watch: each fault fired
        lambda: seen.last(txn) == COMMITTED and faults.injected - injected == 3,
        what="the commit re-read through every fault",
    )
    later = TxnId(0x5_0000, 4)  # and the watch is back: a new outcome arrives as an event
    seen_later = await follow(cache, store, later)
    await store.put(T.header_key(later), T.encode(COMMITTED))
    await wait_until(lambda: seen_later.last(later) == COMMITTED, what="a later outcome")
