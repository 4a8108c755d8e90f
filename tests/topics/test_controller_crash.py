"""A controller broker SIGKILLed mid-split and restarted: the split completes (finished by
whichever broker next holds the controller lease), or is cleanly absent."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from pathlib import Path

import pytest

from segtxn.client import Client, ScalableProducer
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName
from segtxn.topics import dag
from segtxn.topics.catalog import topic_key
from segtxn.topics.model import ScalableTopic, decode_topic
from tests import processes
from tests.processes import ServerProcess
from tests.waiting import wait_until

TOPIC = "topic://acme/ctl/events"


@pytest.mark.slow
async def test_controller_killed_mid_split(
    etcd_server: EtcdServer, tmp_path: Path, started: list[ServerProcess]
) -> None:
    seed = random.randrange(2**32)
    print(f"controller crash seed {seed}")
    rng = random.Random(seed)
    url = etcd_server.url(f"/ctl-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    a = processes.broker(url, tmp_path / "a", "a", session_ttl=2)
    b = processes.broker(url, tmp_path / "b", "b", session_ttl=2)
    started += [a, b]
    a.start()
    b.start()
    await asyncio.gather(a.ready(), b.ready())
    async with Client(b.url) as via_b:
        await via_b.admin.create_topic(TOPIC, segments=2)
        producer = await via_b.create_producer(TOPIC)
        for i in range(20):
            await producer.send(f"before-{i}".encode(), key=f"k{i}")
    async with Client(a.url) as via_a:
        splitting = asyncio.create_task(via_a.admin.split(TOPIC, 0))
        await asyncio.sleep(rng.uniform(0, 0.05))  # sleep-ok: a seeded kill moment
        a.kill()  # a was asked first, so it is the topic's controller
        await asyncio.gather(splitting, return_exceptions=True)
    # like a pod restarting: a may hold the sealed parent, which only it can serve
    a.start()
    await a.ready()
    store = open_store(url)
    name = TopicName.parse(TOPIC)
    try:

        async def settled() -> bool:
            record = await store.get(topic_key(name))
            assert record is not None
            topic = decode_topic(record.value)
            return isinstance(topic, ScalableTopic) and topic.pending is None

        await wait_until(settled, timeout=30, what="the split completed or never began")
        record = await store.get(topic_key(name))
        assert record is not None
        topic = decode_topic(record.value)
        assert isinstance(topic, ScalableTopic)
        dag.check(topic)
        print(f"outcome: epoch {topic.epoch}, {len(topic.active())} active segments")
        assert topic.epoch in (0, 1)  # all of the split, or none of it
    finally:
        await store.close()
    async with Client(b.url) as client:
        producer = await client.create_producer(TOPIC)
        assert isinstance(producer, ScalableProducer)
        for i in range(20):
            await producer.send(f"after-{i}".encode(), key=f"k{i}")
        consumer = await client.subscribe(TOPIC, "check", initial_position="earliest")
        got = set()
        for _ in range(40):
            message = await consumer.receive(timeout_s=30)
            got.add(message.value)
            await consumer.acknowledge(message)
        assert got == {f"{p}-{i}".encode() for p in ("before", "after") for i in range(20)}
