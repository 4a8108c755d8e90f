"""Produce and consume through a real broker, on both topic domains."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.client import Client, ErrorName, ScalableProducer, ServerError
from segtxn.protocol.hashing import key_hash


async def test_produce_and_consume_a_persistent_topic(client: Client) -> None:
    topic = "persistent://acme/orders/events"
    await client.admin.create_topic(topic)
    consumer = await client.subscribe(topic, "billing", initial_position="earliest")
    producer = await client.create_producer(topic, name="p1")
    ids = [await producer.send(f"m{i}".encode(), key=f"k{i % 3}") for i in range(20)]
    assert ids == sorted(ids) and len(set(ids)) == 20
    got = []
    for _ in range(20):
        message = await consumer.receive(timeout_s=10)
        got.append(message)
        await consumer.acknowledge(message)
    assert [m.value for m in got] == [f"m{i}".encode() for i in range(20)]
    assert [m.message_id for m in got] == ids
    assert got[0].key == "k0" and got[0].producer_name == "p1" and got[0].sequence_id == 0
    stats = await client.admin.stats(topic)
    assert stats["msgInCounter"] == 20
    assert stats["subscriptions"]["billing"]["backlog"] == 0


async def test_scalable_topic_routes_keys_to_segments(client: Client) -> None:
    topic = "topic://acme/orders/scaled"
    await client.admin.create_topic(topic, segments=4)
    consumer = await client.subscribe(topic, "all", initial_position="earliest")
    producer = await client.create_producer(topic)
    keys = [f"customer-{i}" for i in range(40)]
    ids = await asyncio.gather(*(producer.send(k.encode(), key=k) for k in keys))
    for key, message_id in zip(keys, ids, strict=True):
        segment = int(message_id.topic.rsplit("/", 1)[1])
        assert segment == key_hash(key) * 4 // 0x10000  # four even ranges
    received = {}
    for _ in range(40):
        message = await consumer.receive(timeout_s=10)
        received[message.key] = message.message_id
        await consumer.acknowledge(message)
    assert received == dict(zip(keys, ids, strict=True))


async def test_unknown_topic_is_a_named_error(client: Client) -> None:
    with pytest.raises(ServerError) as error:
        await client.create_producer("persistent://acme/orders/missing")
    assert error.value.name is ErrorName.TOPIC_NOT_FOUND
    with pytest.raises(ServerError) as error:
        await client.subscribe("persistent://acme/orders/missing", "s")
    assert error.value.name is ErrorName.TOPIC_NOT_FOUND


async def test_a_wide_scalable_topic_and_a_client_with_many_streams(client: Client) -> None:
    """64 segments: more homes than one store step holds, and 128 open streams (more than
    aiohttp's default pool of 100) from one client."""
    topic = "topic://acme/orders/wide"
    await client.admin.create_topic(topic, segments=64)
    consumer = await client.subscribe(topic, "all", initial_position="earliest")
    producer = await client.create_producer(topic)
    assert isinstance(producer, ScalableProducer)
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < 64:  # one key per segment
        keys.setdefault(producer.route(f"k{i}"), f"k{i}")
        i += 1
    await asyncio.gather(*(producer.send(k.encode(), key=k) for k in keys.values()))
    got = {(await consumer.receive(timeout_s=10)).value for _ in range(64)}
    assert got == {k.encode() for k in keys.values()}
    with pytest.raises(ServerError) as too_wide:
        await client.admin.create_topic("topic://acme/orders/too-wide", segments=257)
    assert too_wide.value.name is ErrorName.INVALID_ARGUMENT
