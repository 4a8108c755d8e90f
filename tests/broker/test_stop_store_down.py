"""A broker stopping while its metadata store refuses or fails every call still closes
everything it opened (as a coordinator's stop does: tests/coordinator/test_stop_store_down.py).
Before, the first step that raised (its session's revocation refused, here) raised out of
stop() and skipped the later ones: the store the broker opened was never closed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.broker import service as broker_service
from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.metastore import MetadataStore, StoreAccessDenied, open_store
from segtxn.metastore.etcd_server import free_port
from segtxn.metastore.faults import FaultInjector


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    """The store the broker opens for itself (it owns it: its stop closes it)."""
    store = open_store("memory://", wrap=FaultInjector)
    yield store
    await store.close()  # idempotent: after the broker's own


@pytest.fixture
async def server(
    store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> BrokerServer:
    monkeypatch.setattr(broker_service, "open_store", lambda *_: store)
    port = free_port()
    server = BrokerServer(
        BrokerSettings(
            broker_id="b-stop",
            advertise_url=f"http://127.0.0.1:{port}",
            store_url="memory://",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
        ),
        host="127.0.0.1",
        port=port,
    )
    await server.start()
    assert server.service._owns_store
    return server


async def test_a_stop_with_the_store_refusing_closes_everything(
    server: BrokerServer, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    faults = store.engine
    assert isinstance(faults, FaultInjector)
    faults.fail("txn", times=None)
    faults.fail("lease_revoke", times=None, error=StoreAccessDenied("injected: refused"))
    session = server.service._session
    assert session is not None
    with caplog.at_level(logging.WARNING):
        async with asyncio.timeout(10):
            await server.stop()
    assert faults.injected >= 1
    assert session.is_expired
    assert store._closed, "the store the broker opened was left open"
    revoking = [r for r in caplog.records if "session" in r.getMessage()]
    assert revoking and all(r.levelno == logging.WARNING and not r.exc_info for r in revoking)
