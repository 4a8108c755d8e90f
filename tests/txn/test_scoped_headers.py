"""A broker in ``scoped`` header-watch mode: one point watch per transaction its segments
touch, all on one stream. Outcomes still reach every participant (commit and abort, across
segments, through a lost stream), its watches go once the outcomes are materialized, and it
never hears of transactions it did not touch."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from segtxn.broker.txn.headers import HeaderCache, HeaderWatch
from segtxn.client import Client, ServerError
from segtxn.ledger import Position
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import Error, ProducerReady, Send, SendBatch
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.txn.test_v5 import nothing_arrives, take
from tests.waiting import wait_until
from tests.wsframes import next_frame

OPEN = T.TxnHeader(TxnState.OPEN, timeout_ms=2**40, created_ms=1)
COMMITTED = T.TxnHeader(TxnState.COMMITTED, timeout_ms=2**40, created_ms=1, finalized_ms=2)
ORDERS = "topic://acme/scoped/orders"
SEGMENT = TopicName.parse("segment://acme/scoped/orders/0")


@pytest.fixture
def header_watch() -> HeaderWatch:
    return HeaderWatch.SCOPED


def headers_of(cluster: Cluster) -> HeaderCache:
    return cluster.broker.service.headers


async def test_outcomes_reach_every_segment_and_the_watches_go(
    client: Client, cluster: Cluster
) -> None:
    headers = headers_of(cluster)
    assert headers.mode is HeaderWatch.SCOPED
    await client.admin.create_topic(ORDERS, segments=4)
    consumer = await client.subscribe(ORDERS, "read", initial_position="earliest")
    producer = await client.create_producer(ORDERS)
    committed = await client.transaction().start()
    aborted = await client.transaction().start()
    ids = [await producer.send(f"c{i}".encode(), key=f"k{i}", txn=committed) for i in range(12)]
    for i in range(12):
        await producer.send(f"a{i}".encode(), key=f"k{i}", txn=aborted)
    assert len({i.topic for i in ids}) > 1  # several segments take part
    assert headers.point_watches == 2  # one per transaction, however many segments
    await nothing_arrives(consumer)
    await aborted.abort()
    await committed.commit()
    got = await take(consumer, 12)
    assert sorted(m.value for m in got) == sorted(f"c{i}".encode() for i in range(12))
    await nothing_arrives(consumer)
    await wait_until(lambda: headers.point_watches == 0, what="the watches cancelled")


async def test_a_lost_stream_resumes_without_missing_an_outcome(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(ORDERS, segments=2)
    consumer = await client.subscribe(ORDERS, "read", initial_position="earliest")
    producer = await client.create_producer(ORDERS)
    txn = await client.transaction().start()
    for i in range(6):
        await producer.send(f"m{i}".encode(), key=f"k{i}", txn=txn)
    faults = cluster.faults
    faults.fail("watch", key_prefix=T.HEADERS, times=None)  # the stream cannot come back...
    assert faults.drop_watches() >= 1
    await txn.commit()
    await nothing_arrives(consumer)  # ...so the broker has not heard of the commit
    faults.clear()
    got = await take(consumer, 6)
    assert sorted(m.value for m in got) == sorted(f"m{i}".encode() for i in range(6))


async def test_a_scoped_cache_hears_nothing_of_transactions_it_never_touched(
    client: Client, cluster: Cluster
) -> None:
    """Another broker's view (B serves none of these segments), in each mode: the prefix
    cache decodes every header change of the cluster, the scoped one none."""
    prefix_b, scoped_b = HeaderCache(cluster.store), HeaderCache(cluster.store, HeaderWatch.SCOPED)
    await prefix_b.start()
    await scoped_b.start()
    try:
        await client.admin.create_topic(ORDERS, segments=2)
        producer = await client.create_producer(ORDERS)
        before = headers_of(cluster).events_seen
        for n in range(5):
            async with client.transaction() as txn:
                await producer.send(f"m{n}".encode(), key=f"k{n}", txn=txn)
        await wait_until(lambda: prefix_b.events_seen >= 10, what="opens and commits")
        await wait_until(lambda: headers_of(cluster).events_seen - before >= 5, what="A hears")
        assert scoped_b.events_seen == 0
        assert scoped_b.point_watches == 0
    finally:
        await scoped_b.close()
        await prefix_b.close()


async def test_refused_sends_and_acks_leave_no_watch_behind(
    client: Client, cluster: Cluster
) -> None:
    """A send or ack naming a transaction that is unknown or already ended is refused, and
    nothing of it stays here to follow: a client cannot pile up watches with bogus ids."""
    headers = headers_of(cluster)
    await client.admin.create_topic(ORDERS, segments=1)
    producer = await client.create_producer(ORDERS)
    await producer.send(b"plain", key="k")
    ended = await client.transaction().start()
    await ended.abort()
    unknown = TxnId(ended.id.most, ended.id.least + 1000)
    reads = cluster.faults.count("range", key_prefix=T.HEADERS)
    url = f"{cluster.url}/ws/v2/producer/{SEGMENT.path}?name=p"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        sends = [Send(seq=0, payload=b"x", txn=ended.wire_id)]
        sends.append(Send(seq=1, payload=b"y", txn=(unknown.most, unknown.least)))
        await ws.send_bytes(frames.encode(SendBatch(sends=sends)))
        errors = [await next_frame(ws) for _ in sends]
    assert sorted(e.error for e in errors if isinstance(e, Error)) == sorted(
        [ErrorName.TRANSACTION_CONFLICT, ErrorName.TRANSACTION_NOT_FOUND]
    )
    consumer = await client.subscribe(ORDERS, "read", initial_position="earliest")
    message = await consumer.receive(timeout_s=10)
    # (the client refuses an ack in an ended transaction itself: the broker's side, then)
    subscription = cluster.broker.service.topics[SEGMENT].subscriptions["read"]
    position = Position(message.message_id.ledger_id, message.message_id.entry_id)
    refusals = [(ended.id, ErrorName.TRANSACTION_CONFLICT)]
    refusals.append((unknown, ErrorName.TRANSACTION_NOT_FOUND))
    for txn, name in refusals:
        with pytest.raises(ServerError) as refused:
            await subscription.pending_acks.ack(txn, [position], cumulative=False)
        assert refused.value.name is name
    assert reads.calls >= 2  # the broker read the headers it was asked about
    assert headers.point_watches == 0
    assert headers.cached(ended.id) is None and headers.cached(unknown) is None


async def test_a_change_between_the_read_and_its_watch_is_not_missed(cluster: Cluster) -> None:
    """The point watch starts at the read's revision + 1, whenever it is created: a commit
    made after the read answered, before the watch exists, still reaches the listener; and
    forgetting the transaction cancels its watch."""
    cache = HeaderCache(cluster.store, HeaderWatch.SCOPED)
    await cache.start()
    try:
        txn = TxnId(0x6_0000, 1)
        opened = await cluster.store.put(T.header_key(txn), T.encode(OPEN))
        seen: list[T.TxnHeader | None] = []

        def listener(_: TxnId, header: T.TxnHeader | None) -> None:
            seen.append(header)

        cache.listen(txn, listener)
        held = cluster.faults.hold("range", key_prefix=T.header_key(txn), times=1)
        reading = asyncio.ensure_future(cache.get(txn))
        await held.wait_for(1)  # read (OPEN), its answer parked: no watch yet
        await cluster.store.put(T.header_key(txn), T.encode(COMMITTED))
        held.release()
        assert await reading == (OPEN, opened.version)
        await wait_until(lambda: seen == [COMMITTED], what="the commit made after the read")
        assert cache.cached(txn) == COMMITTED and cache.point_watches == 1
        cache.forget(txn, listener)
        assert cache.point_watches == 0 and cache.cached(txn) is None
        events = cache.events_seen
        await cluster.store.delete(T.header_key(txn))
        later = TxnId(0x6_0000, 2)  # a change after the delete, on a watched header...
        cache.listen(later, listener)
        opened_later = await cluster.store.put(T.header_key(later), T.encode(OPEN))
        assert await cache.get(later) == (OPEN, opened_later.version)
        await cluster.store.put(T.header_key(later), T.encode(COMMITTED))
        await wait_until(lambda: len(seen) == 2, what="the later commit")
        assert cache.events_seen == events + 1  # ...arrives; the forgotten one's delete never did
    finally:
        await cache.close()
