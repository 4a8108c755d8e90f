"""A broker unloads sealed segments nobody uses (issue 22: the endurance run's broker kept
every segment that ever split or merged loaded — memory and open files growing by the hour).
"""

from __future__ import annotations

from typing import Any

from segtxn.broker import handoff
from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.protocol.names import TopicName

TOPIC = "topic://acme/idle/orders"


async def test_a_sealed_segment_left_idle_is_unloaded_and_loads_again_on_use(
    broker: BrokerServer, client: Client
) -> None:
    service = broker.service
    limit = service.settings.unload_idle_s
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(5):
        await producer.send(f"before-{i}".encode(), key=f"k{i}")
    await client.admin.split(TOPIC, 0)
    sealed = TopicName.parse(TOPIC).segment_name(0)
    assert service.topics[sealed].ledger.is_sealed

    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    await handoff.unload_idle(service, 0.0)
    await handoff.unload_idle(service, limit)
    assert sealed in service.topics  # its consumer keeps it loaded
    got = {(await consumer.receive(timeout_s=10)).value for _ in range(5)}
    assert got == {f"before-{i}".encode() for i in range(5)}
    await consumer.close()
    await producer.close()

    await handoff.unload_idle(service, 2 * limit)  # idle from now on...
    assert sealed in service.topics
    await handoff.unload_idle(service, 3 * limit - 1)
    assert sealed in service.topics  # ...not yet for long enough
    await handoff.unload_idle(service, 3 * limit)
    assert sealed not in service.topics
    assert any(t.name.segment is not None for t in service.topics.values())  # its children stay

    again = await client.subscribe(TOPIC, "fresh", initial_position="earliest")
    got = {(await again.receive(timeout_s=10)).value for _ in range(5)}
    assert got == {f"before-{i}".encode() for i in range(5)}  # loaded again, whole
    assert sealed in service.topics


async def test_stats_answer_for_an_unloaded_sealed_segment_without_loading_it(
    broker: BrokerServer, client: Client
) -> None:
    """A scalable topic's stats ask every segment it ever had: a sealed one that was
    unloaded answers from its records (its last entry, each subscription's mark and
    backlog, the same numbers as when it was loaded) and stays unloaded."""
    service = broker.service
    limit = service.settings.unload_idle_s
    await client.admin.create_topic(TOPIC, segments=1)
    await client.admin.create_subscription(TOPIC, "s", initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    for i in range(5):
        await producer.send(f"before-{i}".encode(), key=f"k{i}")
    await client.admin.split(TOPIC, 0)
    await producer.close()
    sealed = TopicName.parse(TOPIC).segment_name(0)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    first = await consumer.receive(timeout_s=10)
    await consumer.acknowledge(first)
    await consumer.close()

    def segment_zero(stats: dict[str, Any]) -> dict[str, Any]:
        segments = stats["segments"]
        assert isinstance(segments, list)
        found = next(s["stats"] for s in segments if s["id"] == 0)
        assert isinstance(found, dict)
        return found

    loaded = segment_zero(await client.admin.stats(TOPIC))
    assert loaded["loaded"] is True and loaded["subscriptions"]["s"]["backlog"] == 4

    await handoff.unload_idle(service, 0.0)
    await handoff.unload_idle(service, limit)
    assert sealed not in service.topics
    cold = segment_zero(await client.admin.stats(TOPIC))
    assert sealed not in service.topics  # answered without loading it
    assert cold["loaded"] is False and cold["sealed"] is True and cold["producers"] == 0
    assert cold["lastConfirmedPosition"] == loaded["lastConfirmedPosition"]
    assert cold["subscriptions"] == {
        "s": {
            "type": None,
            "consumers": 0,
            "backlog": 4,
            "msgOutCounter": 0,
            "markDeletePosition": loaded["subscriptions"]["s"]["markDeletePosition"],
        }
    }
    assert await client.admin.stats(str(sealed)) == cold  # asked directly, the same
    assert sealed not in service.topics
