"""What the bad-input tests (``test_bad_handshake``, ``test_bad_frames``,
``test_bad_frames_fuzz``) share: the topic they abuse, the small broker's message limit,
and a raw WebSocket producer and consumer that speak the protocol by hand.

Every test there ends by checking the broker still serves a brand-new client
(:func:`still_serves`); the broker fixtures they use (``small``, ``stored``, ``http``) are in
``tests/broker/conftest.py``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import ConsumerReady, Error, ProducerReady
from tests.wsframes import next_frame

LIMIT = 1000  # max_message_bytes of the brokers here that need a small one
KNOWN_ERRORS = {e.value for e in ErrorName}
TOPIC = "persistent://acme/bad/t"
PATH = "persistent/acme/bad/t"
ids = itertools.count(1)
"""Numbers for producer, subscription and client names, unique across the bad-input tests."""


@dataclass
class Stored:
    broker: BrokerServer
    ledger_id: int
    entry_id: int


async def next_server_frame(ws: aiohttp.ClientWebSocketResponse) -> frames.Frame:
    """The next server frame, within a bounded time; fails on anything but a binary frame."""
    return await next_frame(ws, 5)


async def error_frame(ws: aiohttp.ClientWebSocketResponse) -> Error:
    frame = await next_server_frame(ws)
    assert isinstance(frame, Error), frame
    assert frame.error in KNOWN_ERRORS
    return frame


async def open_producer(
    http: aiohttp.ClientSession, broker: BrokerServer, path: str, name: str | None = None
) -> aiohttp.ClientWebSocketResponse:
    url = f"{broker.settings.advertise_url}/ws/v2/producer/{path}"
    ws = await http.ws_connect(url, params={"name": name or f"raw-{next(ids)}"})
    assert isinstance(await next_server_frame(ws), ProducerReady)
    return ws


async def open_consumer(
    http: aiohttp.ClientSession,
    broker: BrokerServer,
    path: str,
    subscription: str,
    initial: str = "latest",
) -> aiohttp.ClientWebSocketResponse:
    url = f"{broker.settings.advertise_url}/ws/v2/consumer/{path}/{subscription}"
    ws = await http.ws_connect(url, params={"initial": initial})
    assert isinstance(await next_server_frame(ws), ConsumerReady)
    return ws


async def still_serves(url: str, topic: str) -> None:
    """A brand-new client can produce to ``topic`` and consume what it produced."""
    tag = next(ids)
    async with Client(url) as client:
        consumer = await client.subscribe(topic, f"check-{tag}")
        producer = await client.create_producer(topic, name=f"check-{tag}")
        sent = await producer.send(b"still serving")
        message = await consumer.receive(timeout_s=10)
        assert message.message_id == sent and message.value == b"still serving"
        await consumer.acknowledge(message)


def pack(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)
