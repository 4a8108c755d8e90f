"""Clients ride through a broker restart: nothing lost, nothing stored twice."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from segtxn.client import Client
from segtxn.metastore.etcd_server import EtcdServer
from tests.broker.conftest import StartBroker


async def test_producer_and_consumer_survive_a_broker_restart(
    start_broker: StartBroker, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    store = etcd_server.url(f"/reconnect-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    data = tmp_path / "broker"
    first = await start_broker(store_url=store, broker_id="r1", data_dir=data)
    topic = "persistent://acme/restart/events"
    async with Client(first.settings.advertise_url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic, name="steady")
        consumer = await client.subscribe(topic, "sub", initial_position="earliest")
        for i in range(50):
            await producer.send(f"m{i}".encode())
        received = []
        for _ in range(30):  # take 30, acknowledge 20: 10 are delivered but not acked
            received.append(await consumer.receive(timeout_s=10))
        for message in received[:20]:
            await consumer.acknowledge(message)

        await first.stop()  # the broker goes away with clients attached, and comes back
        await start_broker(store_url=store, broker_id="r1", data_dir=data, port=first.port)

        for i in range(50, 80):  # the producer reconnects through a fresh lookup
            await producer.send(f"m{i}".encode())
        values = [m.value for m in received[:20]]
        while len(values) < 80:
            message = await consumer.receive(timeout_s=20)
            values.append(message.value)
            await consumer.acknowledge(message)
        assert sorted(values, key=lambda v: int(v[1:])) == [f"m{i}".encode() for i in range(80)]
        assert len(set(values)) == 80  # acknowledged messages never come back
        assert producer.reconnects >= 1  # type: ignore[union-attr]
        stats = await client.admin.stats(topic)
        assert stats["msgInCounter"] == 30 and stats["subscriptions"]["sub"]["backlog"] == 0
