"""Real brokers on loopback ports (in-process aiohttp servers) and clients for them."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.web import Listener
from tests.broker.bad_input_support import LIMIT, TOPIC, Stored

_ids = itertools.count()
StartBroker = Callable[..., Awaitable[BrokerServer]]


@pytest.fixture
async def start_broker(tmp_path: Path) -> AsyncIterator[StartBroker]:
    """Start brokers; all share ``store_url`` (a fresh memory store unless given). Each on
    ``port`` (a restart on a stopped broker's), else on a port the system picks, held by a
    :class:`~segtxn.web.Listener` from the pick on (a port picked and closed again could be
    taken by another process before the broker binds it)."""
    servers: list[BrokerServer] = []

    async def start(
        store_url: str = "memory://",
        broker_id: str | None = None,
        data_dir: Path | None = None,
        port: int | None = None,
        **settings: object,
    ) -> BrokerServer:
        broker_id = broker_id or f"b{next(_ids)}"
        listener = Listener("127.0.0.1") if port is None else None
        port = listener.port if listener is not None else port
        ledger_dir = data_dir or (tmp_path / broker_id)
        server = BrokerServer(
            BrokerSettings(
                broker_id=broker_id,
                advertise_url=f"http://127.0.0.1:{port}",
                store_url=store_url,
                ledger_url=f"file://{ledger_dir}",
                **settings,  # type: ignore[arg-type]
            ),
            host="127.0.0.1",
            port=port,
            listener=listener,
        )
        servers.append(server)  # stopped (its listener closed) even if it fails to start
        await server.start()
        return server

    yield start
    for server in reversed(servers):
        await server.stop()


@pytest.fixture
async def broker(start_broker: StartBroker) -> BrokerServer:
    return await start_broker()


@pytest.fixture
async def client(broker: BrokerServer) -> AsyncIterator[Client]:
    async with Client(broker.settings.advertise_url) as c:
        yield c


# ---------------------------------------------------------------------- bad input
# The brokers of test_bad_handshake, test_bad_frames and test_bad_frames_fuzz.


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP session for raw requests and WebSockets (test_edges.py has its own)."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def small(start_broker: StartBroker) -> BrokerServer:
    """A broker with a 1000-byte message limit and the topic ``persistent://acme/bad/t``."""
    broker = await start_broker(max_message_bytes=LIMIT)
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic("persistent://acme/bad/t")
    return broker


@pytest.fixture
async def stored(small: BrokerServer) -> Stored:
    """One message stored on ``persistent://acme/bad/t``."""
    async with Client(small.settings.advertise_url) as client:
        producer = await client.create_producer(TOPIC, name="stored")
        message_id = await producer.send(b"stored")
    return Stored(small, message_id.ledger_id, message_id.entry_id)
