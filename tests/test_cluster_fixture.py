"""The test cluster's own start-up: each port is held from its pick until its server serves
on it (no other process can take it in between, as one could a ``free_port()``)."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import aiohttp

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import open_store
from tests.cluster import start_on_free_ports


def _taken(port: int) -> bool:
    with socket.socket() as other:
        try:
            other.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
        return False


async def test_the_ports_are_held_from_their_pick_until_the_servers_serve(
    tmp_path: Path,
) -> None:
    store = open_store("memory://")
    asked: list[tuple[int, int]] = []

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        asked.append((port, txn_port))
        assert _taken(port) and _taken(txn_port)  # another process could not bind them now
        broker = BrokerServer(
            BrokerSettings(
                broker_id="b1",
                advertise_url=f"http://127.0.0.1:{port}",
                ledger_url=f"file://{tmp_path / 'ledgers'}",
            ),
            store=store,
        )
        coordinator = CoordinatorServer(
            CoordinatorSettings(advertise_url=f"http://127.0.0.1:{txn_port}"), store=store
        )
        return broker, coordinator

    try:
        broker, coordinator = await start_on_free_ports(servers)
        try:
            ((port, txn_port),) = asked
            assert port != txn_port
            async with aiohttp.ClientSession() as session:
                for url in (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{txn_port}"):
                    async with session.get(url + "/healthz") as response:
                        assert response.status == 200, url  # served on the port picked
        finally:
            await coordinator.stop()
            await broker.stop()
        assert not _taken(port) and not _taken(txn_port)  # closed with their servers
    finally:
        await store.close()
