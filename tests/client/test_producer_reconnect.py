"""A producer that reconnects to a broker whose ``producer_ready`` it cannot decode tries
again, as after a refusal; the undecodable frame ended its connection task, and every send
after it waited for its send timeout."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from segtxn.client import Client
from segtxn.client.producer import Producer
from segtxn.protocol import frames
from tests.waiting import wait_until

TOPIC = "persistent://acme/ops/undecodable-ready"


class _GarbledReady:
    """``frames.server_frame`` whose first ``producer_ready`` does not decode."""

    def __init__(self, real: msgspec.msgpack.Decoder[frames.ServerFrame]) -> None:
        self._real = real
        self.garbled = asyncio.Event()

    def decode(self, data: bytes) -> frames.ServerFrame:
        if not self.garbled.is_set() and b"producer_ready" in data:
            self.garbled.set()
            raise msgspec.DecodeError("injected: a garbled producer_ready")
        return self._real.decode(data)


async def test_an_undecodable_producer_ready_is_tried_again(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(TOPIC, send_timeout_s=10)
    assert isinstance(producer, Producer)
    await producer.send(b"before")
    garbling = _GarbledReady(frames.server_frame)
    monkeypatch.setattr(frames, "server_frame", garbling)
    ws = producer._ws
    assert ws is not None
    await ws.close()  # the connection is lost: the producer reconnects
    await wait_until(garbling.garbled.is_set, what="a garbled producer_ready")
    async with asyncio.timeout(5):  # at once, not at the send timeout
        await producer.send(b"after")
    assert producer.reconnects >= 1
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    got = [(await consumer.receive(timeout_s=10)).value for _ in range(2)]
    assert got == [b"before", b"after"]
