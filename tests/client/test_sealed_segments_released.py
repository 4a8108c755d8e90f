"""A client lets go of a sealed segment: a ``topic://`` producer closes its producer on a
segment once the layout shows it sealed and nothing sent there is unsettled, and a consumer
closes its stream on a segment consumed to its end, on every subscription type.

Before, both stayed attached for the client's life, so the broker never found a sealed
segment idle: the endurance run (bench/endurance.py) saw producers, consumers, loaded
topics and open files on the broker grow by 30 an hour with one split or merge every 3 min.
"""

from __future__ import annotations

import pytest

from segtxn.client import Client
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/release/orders"


@pytest.mark.parametrize("subscription_type", ["Shared", "Failover"])
async def test_a_split_leaves_nobody_attached_to_the_sealed_parent(
    client: Client, cluster: Cluster, subscription_type: str
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(
        TOPIC, "s", subscription_type=subscription_type, initial_position="earliest"
    )
    await producer.send(b"before", key="k")
    await consumer.acknowledge(await consumer.receive(timeout_s=10))
    parent = cluster.broker.service.topics[TopicName.parse(TOPIC).segment_name(0)]
    assert parent.producers and parent.subscriptions["s"].consumers
    await client.admin.split(TOPIC, 0)
    await producer.send(b"after", key="k")  # to a child
    after = await consumer.receive(timeout_s=10)
    assert after.value == b"after"
    await consumer.acknowledge(after)

    def released() -> bool:
        return not parent.producers and not parent.subscriptions["s"].consumers

    await wait_until(released, timeout=10, what="the sealed parent's producer and consumer gone")
    await producer.send(b"still routed", key="k")
    assert (await consumer.receive(timeout_s=10)).value == b"still routed"
