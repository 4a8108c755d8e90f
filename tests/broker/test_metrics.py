"""A real broker's ``/metrics`` after real traffic: the broker-wide, per-topic and
per-subscription families, their labels and values, and series that go with their topic."""

from __future__ import annotations

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.protocol.names import TopicName
from tests.metrics_scrape import check_conventions, scrape
from tests.waiting import wait_until

TOPIC = "persistent://acme/metrics/events"
OTHER = "persistent://acme/metrics/other"
SCALABLE = "topic://acme/metrics/scaled"


async def test_broker_gauges_follow_topics_clients_and_backlog(
    client: Client, broker: BrokerServer
) -> None:
    url = broker.settings.advertise_url
    empty = await scrape(url)
    check_conventions(empty)
    assert empty.value("segtxn_broker_topics", domain="persistent") == 0
    assert empty.value("segtxn_build_info", component="broker") == 1

    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub")
    for i in range(3):
        await producer.send(f"m{i}".encode())
    now = await scrape(url)
    assert now.value("segtxn_broker_topics", domain="persistent") == 1
    assert now.value("segtxn_broker_topics", domain="segment") == 0
    assert now.value("segtxn_broker_producers") == 1
    assert now.value("segtxn_broker_consumers") == 1
    assert now.value("segtxn_broker_backlog_messages") == 3

    await consumer.acknowledge(await consumer.receive(timeout_s=5))
    await producer.close()
    await consumer.close()

    async def settled() -> bool:
        found = await scrape(url)
        return (found.value("segtxn_broker_producers"), found.value("segtxn_broker_consumers")) == (
            0,
            0,
        )

    await wait_until(settled, timeout=5, what="the clients to be gone from the gauges")
    assert (await scrape(url)).value("segtxn_broker_backlog_messages") == 2


async def test_topic_and_subscription_series_count_what_went_through(
    client: Client, broker: BrokerServer
) -> None:
    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
    payloads = [b"a" * 10, b"b" * 20, b"c" * 30]
    for payload in payloads:
        await producer.send(payload)
    first = await consumer.receive(timeout_s=5)
    await consumer.acknowledge(first)
    for _ in payloads[1:]:
        await consumer.receive(timeout_s=5)  # delivered, not acknowledged

    found = await scrape(broker.settings.advertise_url)
    check_conventions(found)
    topic = {"topic": TOPIC}
    sub = {"topic": TOPIC, "subscription": "sub"}
    assert found.types["segtxn_topic_in_messages"] == "counter"
    assert found.value("segtxn_topic_in_messages_total", **topic) == 3
    assert found.value("segtxn_topic_in_bytes_total", **topic) == 60
    assert found.value("segtxn_topic_out_messages_total", **topic) == 3
    assert found.value("segtxn_topic_out_bytes_total", **topic) == 60
    assert found.value("segtxn_topic_producers", **topic) == 1
    assert found.value("segtxn_topic_backlog_messages", **topic) == 2
    assert found.value("segtxn_topic_txn_pinned_entries", **topic) == 0
    assert found.value("segtxn_topic_txn_oldest_open_age_seconds", **topic) is None
    assert found.value("segtxn_subscription_backlog_messages", **sub) == 2
    assert found.value("segtxn_subscription_unacked_messages", **sub) == 2
    assert found.value("segtxn_subscription_txn_pending_acks", **sub) == 0
    assert found.value("segtxn_subscription_consumers", **sub) == 1
    assert found.value("segtxn_subscription_out_messages_total", **sub) == 3
    assert found.value("segtxn_subscription_out_bytes_total", **sub) == 60
    # the broker-wide counts, and the publish latency of each stored message
    assert found.value("segtxn_broker_in_messages_total") == 3
    assert found.value("segtxn_broker_in_bytes_total") == 60
    assert found.value("segtxn_broker_out_bytes_total") == 60
    assert found.types["segtxn_broker_publish_latency_seconds"] == "histogram"
    assert found.value("segtxn_broker_publish_latency_seconds_count") == 3
    assert found.value("segtxn_broker_publish_latency_seconds_bucket", le="+Inf") == 3
    await producer.close()
    await consumer.close()


async def test_an_unloaded_topic_takes_its_series_with_it(
    client: Client, broker: BrokerServer
) -> None:
    for topic in (TOPIC, OTHER):
        await client.admin.create_topic(topic)
        await client.admin.create_subscription(topic, "sub")
        producer = await client.create_producer(topic)
        await producer.send(b"x")
        await producer.close()
    url = broker.settings.advertise_url
    before = await scrape(url)
    assert before.with_label("topic", TOPIC) and before.with_label("topic", OTHER)

    await broker.service.unload(TopicName.parse(TOPIC))
    after = await scrape(url)
    assert after.with_label("topic", TOPIC) == []
    assert after.value("segtxn_topic_in_messages_total", topic=OTHER) == 1
    assert after.value("segtxn_subscription_backlog_messages", topic=OTHER, subscription="sub") == 1
    assert after.value("segtxn_broker_topics", domain="persistent") == 1
    assert after.value("segtxn_broker_in_messages_total") == 2  # broker-wide: kept


async def test_each_segment_of_a_scalable_topic_has_its_own_series(
    client: Client, broker: BrokerServer
) -> None:
    await client.admin.create_topic(SCALABLE, segments=2)
    producer = await client.create_producer(SCALABLE)
    for n in range(20):
        await producer.send(b"m", key=f"k{n}")
    await producer.close()
    found = await scrape(broker.settings.advertise_url)
    segments = {
        s.labels["topic"]: s.value
        for s in found.samples
        if s.name == "segtxn_topic_in_messages_total"
    }
    assert len(segments) == 2 and all(t.startswith("segment://") for t in segments), segments
    assert sum(segments.values()) == 20
    assert found.value("segtxn_broker_topics", domain="segment") == 2
    assert found.value("segtxn_broker_active_segments") == 2
