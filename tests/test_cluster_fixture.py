"""The test cluster's own start-up: a port taken between ``free_port()`` and the bind."""

from __future__ import annotations

import socket
from pathlib import Path

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import open_store
from tests.cluster import start_on_free_ports


async def test_a_port_taken_before_the_bind_is_replaced(tmp_path: Path) -> None:
    store = open_store("memory://")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    asked: list[int] = []

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        if not asked:
            port = taken.getsockname()[1]  # as if another process had bound it meanwhile
        asked.append(port)
        broker = BrokerServer(
            BrokerSettings(
                broker_id="b1",
                advertise_url=f"http://127.0.0.1:{port}",
                ledger_url=f"file://{tmp_path / 'ledgers'}",
            ),
            store=store,
        )
        coordinator = CoordinatorServer(
            CoordinatorSettings(advertise_url=f"http://127.0.0.1:{txn_port}"),
            store=store,
        )
        return broker, coordinator

    try:
        broker, coordinator = await start_on_free_ports(servers)
        try:
            assert len(asked) == 2 and asked[1] != taken.getsockname()[1]
            assert broker.settings.advertise_url.endswith(f":{asked[1]}")
        finally:
            await coordinator.stop()
            await broker.stop()
    finally:
        taken.close()
        await store.close()
