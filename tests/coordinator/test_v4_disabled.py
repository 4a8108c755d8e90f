"""A coordinator started without v4 (no ``--data-dir`` or ``--replication``) refuses a v4
transaction at once, saying how to serve one. It answered ServiceNotReady ("holds no v4
id"), which the client retried until its operation timeout: 30 s, then a Timeout that
looked like a passing outage."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import open_store
from segtxn.protocol.errors import ErrorName, ServerError
from tests.cluster import start_on_free_ports


async def test_a_v4_transaction_is_refused_at_once_without_v4(tmp_path: Path) -> None:
    store = open_store("memory://")

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        broker = BrokerServer(
            BrokerSettings(
                broker_id="b1",
                advertise_url=f"http://127.0.0.1:{port}",
                ledger_url=f"file://{tmp_path / 'ledgers'}",
            ),
            store=store,
        )
        coordinator = CoordinatorServer(
            CoordinatorSettings(advertise_url=f"http://127.0.0.1:{txn_port}"),  # no v4 ids
            store=store,
        )
        return broker, coordinator

    broker, coordinator = await start_on_free_ports(servers)
    try:
        async with asyncio.timeout(10):
            await coordinator.coordinator.ready.wait()
        async with Client(broker.settings.advertise_url, operation_timeout_s=30) as client:
            async with asyncio.timeout(10):  # not the 30 s of retrying a refusal
                with pytest.raises(ServerError) as refused:
                    await client.transaction().start(protocol="v4")
            assert refused.value.name is ErrorName.NOT_ALLOWED
            assert "--data-dir" in refused.value.message
            v5 = await client.transaction().start()  # v5 is served as before
            await v5.commit()
    finally:
        await coordinator.stop()
        await broker.stop()
        await store.close()
