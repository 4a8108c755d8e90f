"""The leftover check: every input the processors left unacknowledged, across a split."""

from __future__ import annotations

from segtxn.client import Client, MessageId, ScalableProducer
from segtxn.verify.processor import SUBSCRIPTION, Topics
from segtxn.verify.workload import _leftover
from tests.cluster import Cluster


async def test_leftover_reads_past_a_split_parent_the_processors_left(cluster: Cluster) -> None:
    """Inputs stored in a split's children count too, though the children are delivered
    only once the parent's inputs are acknowledged; the ones acknowledged before do not."""
    topics = Topics.for_run("leftover")
    async with Client(cluster.url) as client:
        await client.admin.create_topic(topics.input, segments=2)
        await client.admin.create_subscription(
            topics.input, SUBSCRIPTION, initial_position="earliest"
        )
        producer = await client.create_producer(topics.input)
        assert isinstance(producer, ScalableProducer)

        async def feed(first: int, count: int) -> list[MessageId]:
            sends = [
                await producer.send_async(f"in-{n}".encode(), key=f"k{n % 7}")
                for n in range(first, first + count)
            ]
            return [await sent for sent in sends]

        before = await feed(0, 40)
        processor = await client.subscribe(
            topics.input, SUBSCRIPTION, subscription_type="Failover", name="p1"
        )
        acked = []
        for _ in range(5):
            message = await processor.receive(timeout_s=20)
            await processor.acknowledge(message)
            acked.append(str(message.message_id))
        await processor.close()
        await client.admin.split(topics.input, 0)
        after = await feed(40, 40)

        left = await _leftover(client, topics)

    parents = {m.topic for m in before}
    assert any(m.topic not in parents for m in after), "some inputs went to the children"
    assert len(left) == len(set(left))
    assert set(left) == {str(m) for m in before + after} - set(acked)
