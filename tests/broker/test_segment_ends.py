"""A segment of a scalable topic is deleted only with its topic (segtxn/broker/segment_ends.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from segtxn.client import Client, ErrorName, ServerError, TopicNotFound
from segtxn.protocol.hashing import key_hash
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster

TOPIC = "topic://acme/ends/t"


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    async with Client(cluster.url) as c:
        yield c


async def test_a_segment_alone_is_not_deleted(cluster: Cluster, client: Client) -> None:
    """``DELETE .../segment/.../0`` deleted the segment's data while the DAG still routed
    its keys to it: its unread messages were lost. Now it is refused and they are read."""
    await client.admin.create_topic(TOPIC, segments=2)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    low = next(k for k in (f"k{i}" for i in range(1000)) if key_hash(k) < 0x8000)  # segment 0
    producer = await client.create_producer(TOPIC)
    await producer.send(b"kept", key=low)
    with pytest.raises(ServerError) as refused:
        await client.connector.request("DELETE", "/admin/v2/segment/acme/ends/t/0")
    assert refused.value.name is ErrorName.NOT_ALLOWED
    assert "a segment is deleted only with its topic (DELETE /admin/v2/topic/acme/ends/t)" in (
        refused.value.message
    )
    message = await consumer.receive(timeout_s=10)
    assert message.value == b"kept"
    await consumer.acknowledge(message)
    await consumer.close()
    await producer.close()
    await client.admin.delete_topic(TOPIC)  # the topic takes its segments with it
    with pytest.raises(TopicNotFound):
        await client.admin.stats(TOPIC)


async def test_a_topic_being_deleted_starts_no_split(cluster: Cluster, client: Client) -> None:
    """A deletion marks the record first; a split planned after that is refused, so the
    deletion's list of segments stays whole."""
    await client.admin.create_topic(TOPIC, segments=1)
    marked = await cluster.broker.service.catalog.mark_deleting(TopicName.parse(TOPIC))
    assert marked is not None and marked.topic.deleting
    with pytest.raises(ServerError) as refused:
        await client.admin.split(TOPIC, 0)
    assert "the topic is being deleted" in refused.value.message
    await client.admin.delete_topic(TOPIC)  # a deletion that stopped half-way finishes
    with pytest.raises(TopicNotFound):
        await client.admin.stats(TOPIC)
