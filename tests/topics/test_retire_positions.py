"""Positions an application keeps forget segments pruned from the DAG (issue 22): a
``CheckpointConsumer``'s checkpoint and the Spark source's stream offset name only segments
the topic still has, and one saved before the prune still resumes, reading nothing twice
and skipping nothing. Real broker and coordinator (tests/cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.broker.retire import retire_segments
from segtxn.client import CheckpointConsumer, Client
from segtxn.protocol.names import TopicName
from segtxn.verify.offsets import StreamOffset, advance, layout, ranges
from tests.cluster import Cluster
from tests.topics.test_retire import LATER_MS, SEALED, TOPIC, _split_with_data
from tests.waiting import wait_until

NAME = TopicName.parse(TOPIC)


async def _consume_all(client: Client) -> None:
    """Subscription ``s`` acknowledges segment 0's five messages (so it may retire)."""
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    for _ in range(5):
        await consumer.acknowledge(await consumer.receive(timeout_s=10))
    await consumer.close()


async def _nothing_more(reader: CheckpointConsumer) -> None:
    with pytest.raises(TimeoutError):
        await reader.receive(timeout_s=0.3)  # bounded absence check: nothing twice


def _forgot_zero(checkpoint: dict[str, Any]) -> bool:
    return 0 not in checkpoint["finished"] and "0" not in checkpoint["next"]


async def _finished_zero(reader: CheckpointConsumer) -> dict[str, Any]:
    async def finished() -> bool:
        return 0 in reader.checkpoint()["finished"]

    await wait_until(finished, what="segment 0 read to its end")
    return reader.checkpoint()


async def test_a_checkpoint_forgets_a_pruned_segment_and_an_old_one_still_resumes(
    cluster: Cluster, client: Client
) -> None:
    service = cluster.broker.service
    await _split_with_data(client)
    mid_reader = await client.checkpoint_consumer(TOPIC)
    assert (await mid_reader.receive(timeout_s=10)).value.startswith(b"old-")
    mid = mid_reader.checkpoint()  # one of segment 0's five read
    await mid_reader.close()
    reader = await client.checkpoint_consumer(TOPIC)
    old = {(await reader.receive(timeout_s=10)).value for _ in range(5)}
    assert old == {f"old-{i}".encode() for i in range(5)}
    before = await _finished_zero(reader)
    assert "0" in before["next"]
    await _consume_all(client)

    assert await retire_segments(service, LATER_MS) == [SEALED]
    await wait_until(lambda: _forgot_zero(reader.checkpoint()), what="the prune pushed")

    producer = await client.create_producer(TOPIC)
    await producer.send(b"new", key="k1")
    await producer.close()
    assert (await reader.receive(timeout_s=10)).value == b"new"
    await _nothing_more(reader)
    await reader.close()

    for saved in (before, mid):  # made before the prune: both still name segment 0
        resumed = await client.checkpoint_consumer(TOPIC, saved)
        assert (await resumed.receive(timeout_s=10)).value == b"new"  # no old one again
        await _nothing_more(resumed)
        assert _forgot_zero(resumed.checkpoint())
        await resumed.close()


async def test_a_stream_offset_forgets_a_pruned_segment_and_an_old_one_still_advances(
    cluster: Cluster, client: Client
) -> None:
    """The Spark source's offsets (segtxn/verify/offsets.py) from the same admin stats
    the source reads."""
    service = cluster.broker.service
    await _split_with_data(client)

    async def views() -> Any:
        return layout(NAME, await client.admin.stats(TOPIC))

    before = advance(StreamOffset(TOPIC, {}), await views())
    assert before.get(0).done and before.get(0).next > StreamOffset(TOPIC, {}).get(0).next
    await _consume_all(client)
    assert await retire_segments(service, LATER_MS) == [SEALED]
    producer = await client.create_producer(TOPIC)
    await producer.send(b"new", key="k1")
    await producer.close()

    after = advance(before, await views())
    assert 0 not in after.segments and set(after.segments) <= {1, 2}
    assert StreamOffset.from_json(after.to_json(), NAME) == after
    read = ranges(NAME, before, after, 1000)
    assert read and {r.segment for r in read} <= {1, 2}  # the new message, in a child
    restarted = advance(StreamOffset.from_json(before.to_json(), NAME), await views())
    assert restarted == after  # an offset saved before the prune advances the same way
    assert advance(after, await views()) == after  # nothing new: no micro-batch
