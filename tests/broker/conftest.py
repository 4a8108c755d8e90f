"""Real brokers on free loopback ports (in-process aiohttp servers) and clients for them."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.metastore.etcd_server import free_port

_ids = itertools.count()
StartBroker = Callable[..., Awaitable[BrokerServer]]


@pytest.fixture
async def start_broker(tmp_path: Path) -> AsyncIterator[StartBroker]:
    """Start brokers; all share ``store_url`` (a fresh memory store unless given)."""
    servers: list[BrokerServer] = []

    async def start(
        store_url: str = "memory://",
        broker_id: str | None = None,
        data_dir: Path | None = None,
        port: int | None = None,
        **settings: object,
    ) -> BrokerServer:
        broker_id = broker_id or f"b{next(_ids)}"
        port = port or free_port()
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
        )
        await server.start()
        servers.append(server)
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
