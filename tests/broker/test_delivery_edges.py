"""Delivery to consumers at its edges: a new subscription from the latest position on a split
topic, an Exclusive consumer after Shared ones when an aborted transaction rewinds, a
connection that does not read, and a read the ledger refuses for now. Real brokers and a
real coordinator (memory store and real etcd); races are forced with events, not sleeps.
Each failed before its fix (a review)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from segtxn.broker.dispatch import Subscription
from segtxn.client import Client, Message
from segtxn.client.consumer import Consumer
from segtxn.ledger import NotEnoughReplicas
from segtxn.protocol import frames
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until
from tests.wsframes import next_frame

TOPIC = "topic://acme/review/events"


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    async with Client(cluster.url) as c:
        yield c


def values(messages: list[Message]) -> list[str]:
    return [m.value.decode() for m in messages]


async def receive(consumer: Consumer, n: int, timeout_s: float = 10) -> list[Message]:
    return [await consumer.receive(timeout_s=timeout_s) for _ in range(n)]


def subscription_of(cluster: Cluster, segment: int, name: str) -> Subscription:
    return cluster.broker.service.topics[
        TopicName.parse(TOPIC).segment_name(segment)
    ].subscriptions[name]


# ---------------------------------------------------------------------- 1


async def test_a_latest_subscription_on_a_split_topic_gets_what_is_sent_after_subscribe(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new Exclusive subscription (initial=latest) on a topic whose segment 0 was split
    into 1 and 2: ``subscribe()`` returns once attached to segment 0 (the sealed parent);
    the children are read later, once segment 0 ended, but the subscription exists on
    them from ``subscribe()`` on. Created only when they were read, it began at *their*
    latest then: what was sent to them in between was never delivered.

    The window is widened deterministically by holding the client's attachment of the
    children (a slow network or a busy broker does the same)."""
    await client.admin.create_topic(TOPIC, segments=1)
    await client.admin.split(TOPIC, 0)  # 0 -> 1, 2: both active, 0 sealed
    children_may_attach = asyncio.Event()
    child_attach_started = asyncio.Event()
    original_open = Consumer._open

    async def slow_open(self: Consumer, topic: TopicName, deadline: Any) -> None:
        if topic.segment not in (None, 0):
            child_attach_started.set()
            await children_may_attach.wait()
        await original_open(self, topic, deadline)

    monkeypatch.setattr(Consumer, "_open", slow_open)
    consumer = await client.subscribe(TOPIC, "late", initial_position="latest")
    # subscribe() has returned: from now on every message sent must reach "late"
    producer = await client.create_producer(TOPIC)
    sent = [f"k{i}:after-subscribe" for i in range(10)]
    for value in sent:
        await producer.send(value.encode(), key=value.partition(":")[0])
    await asyncio.wait_for(child_attach_started.wait(), 10)
    children_may_attach.set()
    got: list[Message] = []
    try:
        while len(got) < len(sent):
            got.append(await consumer.receive(timeout_s=5))
    except TimeoutError:
        pass
    assert sorted(values(got)) == sorted(sent), (
        f"{len(sent) - len(got)} of {len(sent)} messages sent after subscribe() returned "
        "were never delivered"
    )


# ---------------------------------------------------------------------- 2


async def test_an_exclusive_consumer_after_shared_ones_gets_an_aborted_ack_in_order(
    client: Client, cluster: Cluster
) -> None:
    """A subscription used Shared, then Exclusive (allowed once the Shared consumers are
    gone). The Shared consumer took m0..m4, acknowledged m0 in a transaction, and closed:
    m1..m4 are handed back one by one (``Outstanding.redeliver``). The Exclusive consumer
    that attaches next is fenced until the transaction ends; it aborts, the subscription
    rewinds to m0, and m0..m4 come in order. The rewind left the Shared redelivery set,
    which the dispatcher served first: m1..m4 came before m0, in one epoch."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(5):
        await producer.send(f"m{i}".encode(), key="k")
    shared = await client.subscribe(
        TOPIC, "switch", subscription_type="Shared", initial_position="earliest"
    )
    first = await receive(shared, 5)
    assert sorted(values(first)) == [f"m{i}" for i in range(5)]
    m0 = next(m for m in first if m.value == b"m0")
    txn = await client.transaction().start()
    await shared.acknowledge(m0, txn=txn)
    await shared.close()
    sub = subscription_of(cluster, 0, "switch")
    await wait_until(lambda: not sub.consumers, what="the shared consumer gone")
    exclusive = await client.subscribe(
        TOPIC, "switch", subscription_type="Exclusive", initial_position="earliest"
    )
    await txn.abort()
    got = await receive(exclusive, 5)
    assert values(got) == ["m0", "m1", "m2", "m3", "m4"], [
        (m.value.decode(), m.redelivery_count, m.epoch) for m in got
    ]


# ---------------------------------------------------------------------- 3


async def test_a_consumer_connection_whose_outbox_overflowed_is_closed(
    start_broker: Any,
) -> None:
    """A connection whose outbound queue overflows is closed, as the broker's warning says:
    its consumer is detached and its messages handed back. Only the writer task stopped:
    the WebSocket stayed open, everything queued for it was dropped, and a client that read
    again was neither served nor hung up on, its Exclusive subscription taken for good."""
    broker = await start_broker(max_permits=10)
    topic = "persistent://acme/review/slow"
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        payload = b"x" * (2 * 1024 * 1024)
        ids = [await producer.send(payload) for _ in range(10)]
        query = {"type": "Exclusive", "initial": "earliest", "name": "slow"}
        name = TopicName.parse(topic)
        ws = await client.connector.websocket(
            broker.settings.advertise_url, "consumer", name, "/slow-sub", query
        )
        ready = await next_frame(ws)
        assert isinstance(ready, frames.ConsumerReady)
        # 20 MiB of messages: the socket fills and the broker's writer waits on it
        await ws.send_bytes(frames.encode(frames.Flow(permits=10)))
        sub = broker.service.topics[name].subscriptions["slow-sub"]
        await wait_until(lambda: sub.unacked == 10, what="all ten dispatched")
        first = (ids[0].ledger_id, ids[0].entry_id)
        for request_id in range(1, 201):  # 200 receipts: more than the outbox holds (74)
            await ws.send_bytes(
                frames.encode(frames.Ack(message_ids=[first], request_id=request_id))
            )
        # the client reads again: the broker must either serve it or hang up on it
        closed = False
        try:
            async with asyncio.timeout(10):
                while True:
                    message = await ws.receive()
                    if message.type in (
                        aiohttp.WSMsgType.CLOSE,
                        aiohttp.WSMsgType.CLOSED,
                        aiohttp.WSMsgType.CLOSING,
                    ):
                        closed = True
                        break
        except TimeoutError:
            pass
        still_attached = [c.name for c in sub.consumers]
        await ws.close()
        assert closed, (
            "the broker neither served nor closed a consumer whose outbox overflowed; "
            f"consumers still attached: {still_attached}, unacked: {sub.unacked}"
        )


async def test_delivery_goes_on_after_a_read_the_ledger_refused_for_now(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read refused for now (too few replicas answered: retriable) is tried again, and
    delivery goes on. It stopped for good, every consumer told PersistenceError, until the
    topic was loaded again."""
    topic = "persistent://acme/review/flaky-reads"
    await client.admin.create_topic(topic)
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    ledger = cluster.broker.service.topics[TopicName.parse(topic)].ledger
    read = ledger.read
    refused = asyncio.Event()

    async def refused_once(*args: Any, **kwargs: Any) -> Any:
        if not refused.is_set():
            refused.set()
            raise NotEnoughReplicas("injected: one replica of two answered")
        return await read(*args, **kwargs)

    monkeypatch.setattr(ledger, "read", refused_once)
    producer = await client.create_producer(topic)
    await producer.send(b"after the refusal")
    await asyncio.wait_for(refused.wait(), 10)
    assert (await consumer.receive(timeout_s=10)).value == b"after the refusal"
