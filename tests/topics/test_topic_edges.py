"""Scalable topics at their edges: a subscription created while a split runs, and a topic
deleted and made again under its name. Each test forces its race with real brokers and
the real store, and failed before its fix (a review)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import quote

import pytest

from segtxn.broker.controllers import HttpSegmentOps
from segtxn.broker.fanout import HTTP
from segtxn.client import Client, ServerError
from segtxn.client.errors import Timeout
from segtxn.protocol.names import TopicName
from segtxn.topics.controller import Controller
from tests.cluster import Cluster

TOPIC = "topic://acme/review/orders"
NAME = TopicName.parse(TOPIC)


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    async with Client(cluster.url) as c:
        yield c


class SubscribeDuringSplit:
    """SegmentOps that, right after the controller has read its parents' subscriptions,
    let a client create a subscription on the topic (a real admin call, as any client may
    make at any moment while a split is in progress)."""

    def __init__(self, inner: HttpSegmentOps, client: Client, subscription: str) -> None:
        self.inner = inner
        self.client = client
        self.subscription = subscription
        self.done = False

    async def subscriptions(self, segment: TopicName) -> list[str]:
        found = await self.inner.subscriptions(segment)
        if not self.done:
            self.done = True
            await self.client.admin.create_subscription(
                TOPIC, self.subscription, initial_position="earliest"
            )
        return found

    async def prepare(self, segment: TopicName, subscriptions: list[str]) -> None:
        await self.inner.prepare(segment, subscriptions)

    async def seal(self, segment: TopicName) -> None:
        await self.inner.seal(segment)


async def test_a_subscription_created_while_a_split_runs_reaches_its_children(
    cluster: Cluster, client: Client
) -> None:
    """A subscription created on the topic while a split is pending reaches the children
    too (the fan-out takes in the children being made, and the controller reads the
    parents' subscriptions again once they are sealed). It was created on the parent only,
    after the controller had read them: messages sent to the children after the split were
    not held for it, and a consumer of it starting at ``latest`` skipped them."""
    await client.admin.create_topic(TOPIC, segments=1)
    service = cluster.broker.service
    ops = HttpSegmentOps(service.catalog, cluster.broker.app[HTTP])
    controller = Controller(service.store, service.catalog, SubscribeDuringSplit(ops, client, "s"))
    await controller.split(NAME, 0)
    assert "s" in await client.admin.subscriptions(TOPIC)

    producer = await client.create_producer(TOPIC)
    for i in range(6):
        await producer.send(f"after-{i}".encode(), key=f"k{i}")
    await producer.close()

    per_child = {child: await ops.subscriptions(NAME.segment_name(child)) for child in (1, 2)}
    consumer = await client.subscribe(TOPIC, "s", subscription_type="Exclusive")
    got: list[str] = []
    with contextlib.suppress(Timeout):
        while len(got) < 6:
            message = await consumer.receive(timeout_s=3)
            got.append(message.value.decode())
            await consumer.acknowledge(message)
    await consumer.close()
    assert len(got) == 6, (
        f"subscription s (created before the sends) got {sorted(got)} of 6; "
        f"its cursors on the split's children: {per_child}"
    )


async def test_a_recreated_topic_does_not_inherit_the_old_segments_transaction_state(
    cluster: Cluster, client: Client
) -> None:
    """Deleting a topic deletes each segment's ledger, cursors and de-duplication state
    (Topic.delete) and its transaction-buffer records (``/txn-orphans/<segment>/``,
    ``/txn-aborted/<segment>/``, ``/txn-buffer/<segment>``), which only a retirement
    deleted. A topic created again under the name has segments of the same names whose
    ledgers number positions from the start again: the old orphan at 1:0 hid the new
    topic's first (committed, transactional) message for good."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()
    cluster.faults.fail("txn", key_prefix="/txn-op/", times=1)  # its writes record fails
    with pytest.raises(ServerError):
        await producer.send(b"old", key="k", txn=txn)
    await txn.abort()
    await producer.close()
    segment = quote(str(NAME.segment_name(0)), safe="")
    assert (await cluster.store.list_prefix(f"/txn-orphans/{segment}/")).records
    await client.admin.delete_topic(TOPIC, force=True)
    left = [
        r.key
        for prefix in ("/txn-orphans/", "/txn-aborted/", "/txn-buffer/")
        for r in (await cluster.store.list_prefix(prefix + segment)).records
    ]

    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()
    await producer.send(b"new", key="k", txn=txn)
    await txn.commit()
    await producer.close()
    consumer = await client.subscribe(TOPIC, "fresh", initial_position="earliest")
    got = []
    with contextlib.suppress(Timeout):
        got.append((await consumer.receive(timeout_s=3)).value)
    await consumer.close()
    assert got == [b"new"], (
        f"the re-created topic delivered {got}; records the old one left: {left}"
    )
