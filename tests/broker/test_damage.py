"""Damaged and missing ledger files, as clients and operators see them (issue 15).

In-process brokers on a shared etcd, restarted on the same or another data directory.
Crashes that matter (SIGKILL before the damage) are in test_damage_processes.py.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.ledger import FileLogStorage, LedgerSettings
from segtxn.ledger.records import HEADER_SIZE, decode_header, scan
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import ConsumerReady, Error, Flow, Message
from tests.broker.conftest import StartBroker
from tests.ledger.foreign import readyz
from tests.wsframes import next_frame

TOPIC = "persistent://acme/damage/events"
PATH = "persistent/acme/damage/events"
SMALL_LEDGERS = LedgerSettings(max_ledger_bytes=2048)


@pytest.fixture
def store_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/damage-{os.getpid()}-{uuid.uuid4().hex[:8]}")


async def _produce(broker: BrokerServer, topic: str, n: int) -> None:
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        for i in range(n):
            await producer.send(f"message-{i:03}".encode() * 20)


def _flip_entry(path: Path, entry_id: int) -> None:
    data = path.read_bytes()
    offset = scan(data, start=HEADER_SIZE, nonce=decode_header(data, 1)).offsets[entry_id]
    with path.open("r+b") as f:
        f.seek(offset + 40)
        f.write(b"\xff\xff")


async def _frames_until_error(ws: aiohttp.ClientWebSocketResponse) -> tuple[list[Message], Error]:
    """Messages received before the first Error frame, and that frame (bounded waits)."""
    messages: list[Message] = []
    while True:
        frame = await next_frame(ws)
        if isinstance(frame, Error):
            return messages, frame
        if isinstance(frame, Message):
            messages.append(frame)


async def test_readers_and_consumers_of_a_damaged_closed_ledger_get_an_error_frame(
    start_broker: StartBroker,
    store_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Used to hang: accepted, then no data, no error frame, no end, no log line."""
    data = tmp_path / "b1"
    first = await start_broker(store_url, "b1", data, ledger=SMALL_LEDGERS)
    await _produce(first, TOPIC, 30)  # several ledgers
    await first.stop()
    damaged = FileLogStorage(data).path(TOPIC, 1)
    _flip_entry(damaged, 3)
    broker = await start_broker(store_url, "b1", data, ledger=SMALL_LEDGERS)
    base = broker.settings.advertise_url
    async with aiohttp.ClientSession() as http:
        reader = await http.ws_connect(f"{base}/ws/v2/reader/{PATH}", params={"start": "earliest"})
        await reader.send_bytes(frames.encode(Flow(permits=100)))
        served, error = await _frames_until_error(reader)
        assert [m.message_id for m in served] == [(1, 0), (1, 1), (1, 2)]
        assert error.error == ErrorName.PERSISTENCE and str(damaged) in error.message
        await reader.send_bytes(frames.encode(Flow(permits=1)))  # asks again: told again
        assert (await _frames_until_error(reader))[1].error == ErrorName.PERSISTENCE
        await reader.close()

        url = f"{base}/ws/v2/consumer/{PATH}/audit"
        consumer = await http.ws_connect(url, params={"initial": "earliest", "name": "c1"})
        assert isinstance(await next_frame(consumer), ConsumerReady)
        await consumer.send_bytes(frames.encode(Flow(permits=100)))
        served, error = await _frames_until_error(consumer)
        assert len(served) == 3
        assert error.error == ErrorName.PERSISTENCE and str(damaged) in error.message
        await consumer.close()
    async with Client(base) as client:
        stats = await client.admin.stats(TOPIC)
        # the client's consumer raises it from receive() instead of waiting in silence
        audit = await client.subscribe(TOPIC, "audit-client", initial_position="earliest")
        got = [await audit.receive(timeout_s=10) for _ in range(3)]
        assert [m.message_id.entry_id for m in got] == [0, 1, 2]
        with pytest.raises(ServerError) as stopped:
            await audit.receive(timeout_s=10)
        assert stopped.value.name is ErrorName.PERSISTENCE and str(damaged) in str(stopped.value)
        await audit.close()
    assert str(damaged) in stats["subscriptions"]["audit"]["deliveryError"]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(str(damaged) in line and "damaged" in line for line in errors)
    assert any("delivery stopped" in line for line in errors)


async def test_a_broker_on_an_empty_data_directory_refuses_its_topics(
    start_broker: StartBroker,
    store_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Used to serve them as empty: every acknowledged message gone, nothing said."""
    volume, empty = tmp_path / "volume", tmp_path / "empty"
    first = await start_broker(store_url, "b1", volume)
    await _produce(first, TOPIC, 5)
    async with Client(first.settings.advertise_url) as client:
        await client.admin.create_topic("topic://acme/damage/orders", segments=2)
        producer = await client.create_producer("topic://acme/damage/orders")
        for i in range(10):
            await producer.send(f"order-{i}".encode(), key=str(i))
    await first.stop()

    wrong = await start_broker(store_url, "b1", empty)
    status, body = await readyz(wrong)
    assert status == 503 and body["ready"] is False
    assert "no ledger files" in body["reason"] and str(empty) in body["reason"]
    assert set(body["refused"]) == {
        TOPIC,
        "segment://acme/damage/orders/0",
        "segment://acme/damage/orders/1",
    }
    missing = str(FileLogStorage(empty).path(TOPIC, 1))
    assert missing in body["refused"][TOPIC]
    async with Client(wrong.settings.advertise_url) as client:
        with pytest.raises(ServerError) as refused:
            await client.admin.stats(TOPIC)
        assert refused.value.name is ErrorName.PERSISTENCE and missing in refused.value.message
        with pytest.raises(ServerError, match="PersistenceError"):
            await client.create_producer(TOPIC)
    assert not list(empty.rglob("*.log"))  # never recreated empty
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("the data directory is empty or not this broker's volume" in ln for ln in lines)
    assert sum(missing in ln for ln in lines) == 1  # once per reason, however often asked
    await wrong.stop()

    right = await start_broker(store_url, "b1", volume)
    assert await readyz(right) == (200, {"ready": True})
    async with Client(right.settings.advertise_url) as client:
        consumer = await client.subscribe(TOPIC, "check", initial_position="earliest")
        got = [(await consumer.receive(timeout_s=10)).value for _ in range(5)]
    assert got == [f"message-{i:03}".encode() * 20 for i in range(5)]
