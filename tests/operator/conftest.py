"""The ``local`` and ``shared_local`` fixtures: a real broker and coordinator on the
session's etcd.

Starting the two servers is most of what an end-to-end operator test costs (two
interpreters importing aiohttp and the servers: about 3 s of CPU, 6-10 s on a busy 2-core
machine), so tests that leave the servers as they found them share one pair per module
(``shared_local``); tests that stop or restart them, or that need a store holding nothing
but their own, start their own (``local``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from segtxn.metastore.etcd_server import EtcdServer
from tests import processes
from tests.operator.support import Local


@contextlib.contextmanager
def _started(etcd_server: EtcdServer, data_dir: Path) -> Iterator[Local]:
    """A broker and a coordinator on a fresh store prefix, started (not yet ready), and
    stopped on exit."""
    store = etcd_server.url(f"/operator-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    broker = processes.broker(store, data_dir / "b1", "b1", session_ttl=2)
    coordinator = processes.coordinator(
        store, "c1", extra=("--gc-sweep", "0.2", "--timeout-sweep", "0.2")
    )
    for server in (broker, coordinator):
        server.start()
    try:
        yield Local(store, broker, coordinator)
    finally:
        coordinator.stop()
        broker.stop()


async def _ready(cluster: Local) -> None:
    await asyncio.gather(cluster.broker.ready(), cluster.coordinator.ready())


@pytest.fixture
async def local(etcd_server: EtcdServer, tmp_path: Path) -> AsyncIterator[Local]:
    """Servers of this test's own, on a store prefix of its own: for a test that kills,
    pauses or restarts them, or that depends on what the store holds as a whole (which
    broker a new segment lands on, the coordinator's counts)."""
    with _started(etcd_server, tmp_path) as cluster:
        await _ready(cluster)
        yield cluster


@pytest.fixture(scope="module")
def shared_local(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Local]:
    """One broker and coordinator for every test of the module that asks for it, in
    turn. A test using it must leave the servers running as they are (no kill, pause,
    restart or drain) and name what it creates (topics, namespaces) differently from every
    other test of its module: another test's topics may still be there.

    A synchronous fixture that waits in an event loop of its own: the tests' loops are
    each one test's, and a module-scoped async fixture would need every test of the module
    to run in a loop of the module's scope."""
    with _started(etcd_server, tmp_path_factory.mktemp("shared-local")) as cluster:
        asyncio.run(_ready(cluster))
        yield cluster
