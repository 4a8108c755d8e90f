"""A broker at its connection limit (segtxn/connlimits.py), through the public client: a
call refused for want of a connection is tried again and ends in Timeout naming why; once
connections close, the same client is served, and nothing it sent is lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client, ServiceNotReady, Timeout
from segtxn.connlimits import ConnectionLimits
from segtxn.web import Listener

TOPIC = "persistent://public/default/limited"
HELD = 6
"""The limit: held by raw sockets, then enough for the client (its HTTP pool, a producer, a
consumer)."""


@pytest.fixture
async def broker() -> AsyncIterator[BrokerServer]:
    listener = Listener("127.0.0.1", 0)
    server = BrokerServer(
        BrokerSettings(
            broker_id="b1",
            advertise_url=f"http://127.0.0.1:{listener.port}",
            auto_create_topics=True,
            connections=ConnectionLimits(max_connections=HELD),
        ),
        listener=listener,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_a_client_refused_for_want_of_a_connection_is_served_once_one_closes(
    broker: BrokerServer,
) -> None:
    url = broker.settings.advertise_url
    held = [(await asyncio.open_connection("127.0.0.1", broker.port))[1] for _ in range(HELD)]
    async with Client(url, operation_timeout_s=1.0) as client:
        with pytest.raises(Timeout) as refused:
            await client.create_producer(TOPIC)
        assert isinstance(refused.value.last_error, ServiceNotReady), refused.value.last_error
        assert "--max-connections" in str(refused.value.last_error)
    for writer in held:
        writer.close()
    async with Client(url) as client:
        producer = await client.create_producer(TOPIC)
        await producer.send(b"after")
        reader = await client.subscribe(TOPIC, "s", initial_position="earliest")
        assert (await reader.receive(5.0)).value == b"after"
