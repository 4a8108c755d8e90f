"""The ``local`` fixture: a real broker and coordinator on the session's etcd."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.metastore.etcd_server import EtcdServer
from tests import processes
from tests.operator.support import Local


@pytest.fixture
async def local(etcd_server: EtcdServer, tmp_path: Path) -> AsyncIterator[Local]:
    store = etcd_server.url(f"/operator-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    broker = processes.broker(store, tmp_path / "b1", "b1", session_ttl=2)
    coordinator = processes.coordinator(
        store, "c1", extra=("--gc-sweep", "0.2", "--timeout-sweep", "0.2")
    )
    for server in (broker, coordinator):
        server.start()
    try:
        await asyncio.gather(broker.ready(), coordinator.ready())
        yield Local(store, broker, coordinator)
    finally:
        coordinator.stop()
        broker.stop()
