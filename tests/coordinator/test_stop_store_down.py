"""A coordinator stopping while its metadata store is down still closes everything, in a
bounded time (found by a reviewer: the first resignation that failed raised out of stop(),
skipping the v5 ids' resignation and the closing of the sessions, the HTTP sessions and
the store: leaked, with a traceback, or a stop hung on a store that never answered)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from segtxn import stopping
from segtxn.coordinator import app as coordinator_app
from segtxn.coordinator.app import V4, CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.metastore.fault_holds import Hold
from segtxn.metastore.faults import FaultInjector
from segtxn.web import Listener
from tests.waiting import wait_until

V4_IDS = 2
V5_IDS = 2


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    """The store the coordinator opens for itself (it owns it: its stop closes it)."""
    store = open_store("memory://", wrap=FaultInjector)
    yield store
    await store.close()  # idempotent: after the coordinator's own


@pytest.fixture
async def server(
    store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> CoordinatorServer:
    monkeypatch.setattr(coordinator_app, "open_store", lambda *_: store)
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    server = CoordinatorServer(
        CoordinatorSettings(
            advertise_url=f"http://127.0.0.1:{listener.port}",
            coordinator_ids=V5_IDS,
            v4_coordinator_ids=V4_IDS,
            ledger_url=f"file://{tmp_path / 'txn-logs'}",
            timeout_sweep_s=3600,
            gc_sweep_s=3600,
        ),
        listener=listener,
    )
    await server.start()
    v4 = server.app[V4]
    await wait_until(
        lambda: len(server.coordinator.held) == V5_IDS and len(v4.held) == V4_IDS,
        what="every id held",
    )
    return server


def faults(store: MetadataStore) -> FaultInjector:
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    return engine


def leaks(server: CoordinatorServer, store: MetadataStore) -> dict[str, Any]:
    """What a stop left open."""
    v4 = server.app[V4]
    v5 = server.coordinator.ids.session
    return {
        "v4 session": v4.ids.session is not None and not v4.ids.session.is_expired,
        "v4 http": v4._http is not None and not v4._http.closed,
        "v5 session": v5 is not None and not v5.is_expired,
        "store": not store._closed,
    }


CLOSED = {"v4 session": False, "v4 http": False, "v5 session": False, "store": False}


async def test_a_stop_with_the_store_down_closes_everything(
    server: CoordinatorServer, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    faults(store).fail("txn", key_prefix=ELECTIONS_PREFIX, times=None)  # every resignation
    faults(store).fail("lease_revoke", times=None)
    with caplog.at_level(logging.WARNING):
        async with asyncio.timeout(10):
            await server.stop()
    assert leaks(server, store) == CLOSED
    failed = [r for r in caplog.records if "resign" in r.getMessage()]
    assert len(failed) == V4_IDS + V5_IDS, [r.getMessage() for r in failed]
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in failed)


async def test_a_stop_waits_for_a_store_that_never_answers_a_bounded_time(
    server: CoordinatorServer,
    store: MetadataStore,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stopping, "STOP_LIMIT_S", 0.3)
    monkeypatch.setattr(stopping, "LAST_STEP_S", 0.1)
    held: Hold = faults(store).hold("txn", key_prefix=ELECTIONS_PREFIX, times=None, before=True)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with caplog.at_level(logging.WARNING):
            async with asyncio.timeout(10):
                await server.stop()
        took = loop.time() - started
    finally:
        faults(store).clear()
        held.release()
    assert leaks(server, store) == CLOSED
    assert took < 3, f"the stop took {took:.1f} s"
    assert any(
        "resigning" in r.getMessage() and "not done" in r.getMessage() for r in caplog.records
    ), caplog.text
