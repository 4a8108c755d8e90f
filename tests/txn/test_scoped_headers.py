"""A broker in ``scoped`` header-watch mode: one point watch per transaction its segments
touch, all on one stream. Outcomes still reach every participant (commit and abort, across
segments, through a lost stream), its watches go once the outcomes are materialized, and it
never hears of transactions it did not touch."""

from __future__ import annotations

import pytest

from segtxn.broker.txn.headers import HeaderCache, HeaderWatch
from segtxn.client import Client, Message
from segtxn.client.consumer import Consumer
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

ORDERS = "topic://acme/scoped/orders"


@pytest.fixture
def header_watch() -> HeaderWatch:
    return HeaderWatch.SCOPED


def headers_of(cluster: Cluster) -> HeaderCache:
    return cluster.broker.service.headers


async def nothing_arrives(consumer: Consumer) -> None:
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout_s=0.3)  # bounded absence check


async def take(consumer: Consumer, n: int) -> list[Message]:
    out = []
    for _ in range(n):
        message = await consumer.receive(timeout_s=10)
        out.append(message)
        await consumer.acknowledge(message)
    return out


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
