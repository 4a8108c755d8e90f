"""A broker stopping while its metadata store refuses or fails every call still closes
everything it opened (as a coordinator's stop does: tests/coordinator/test_stop_store_down.py).
Before, the first step that raised (its session's revocation refused, here) raised out of
stop() and skipped the later ones: the store the broker opened was never closed.

And one whose store does not answer a background task's write still ends: the tasks it
cancels get a bounded time to end (:meth:`segtxn.stopping.Stopping.cancel`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.broker import service as broker_service
from segtxn.broker.app import BrokerServer
from segtxn.broker.dedup_snapshots import PREFIX as DEDUP_PREFIX
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.metastore import MetadataStore, StoreAccessDenied, open_store
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.names import TopicName
from segtxn.stopping import CANCELLED_END_S
from segtxn.web import Listener
from tests.broker.test_disk_full import FullDisk

SLACK_S = 2.0


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
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    server = BrokerServer(
        BrokerSettings(
            broker_id="b-stop",
            advertise_url=f"http://127.0.0.1:{listener.port}",
            store_url="memory://",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
        ),
        listener=listener,
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


async def test_a_stop_ends_in_its_time_while_a_dropped_topics_close_gets_no_answer(
    server: BrokerServer,
    store: MetadataStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic whose ledger stopped taking appends (a full disk) is dropped in the
    background, and the drop's close writes the topic's last de-duplication snapshot to a
    store that does not answer it. The stop waited for such tasks (its loads, its drops, its
    upkeep...) without a bound, before its steps and outside their time: it never ended,
    and only the CLI's ``--shutdown-timeout`` cut it. It now cancels them and waits
    CANCELLED_END_S at most; the drop's close lets go of its ledger all the same."""
    faults = store.engine
    assert isinstance(faults, FaultInjector)
    topic_name = "persistent://acme/stop/dropped"
    disk = FullDisk(tmp_path / "ledgers", "append", monkeypatch)
    client = await Client(server.settings.advertise_url).__aenter__()
    stop: asyncio.Task[None] | None = None
    sending: asyncio.Task[object] | None = None
    closing = None
    try:
        await client.admin.create_topic(topic_name)
        producer = await client.create_producer(topic_name, send_timeout_s=30)
        await producer.send(b"m0")
        dropped = server.service.topics[TopicName.parse(topic_name)]
        closing = faults.hold("txn", key_prefix=DEDUP_PREFIX, before=True)  # never answered
        disk.full = True
        sending = asyncio.create_task(producer.send(b"m1"))  # refused: the topic is dropped
        await closing.wait_for(1)  # the drop is closing the topic
        assert server.service.dropping
        stop = asyncio.create_task(server.stop())
        done, _ = await asyncio.wait({stop}, timeout=CANCELLED_END_S + SLACK_S)
        assert stop in done, (
            "the broker's stop did not end within the time it gives its cancelled tasks: "
            "it waits for a topic's drop whose store write gets no answer"
        )
        assert dropped.ledger._closed, "the dropped topic's ledger was left open"
        assert store._closed, "the store the broker opened was left open"
    finally:
        if closing is not None:
            closing.release()
        faults.clear()
        disk.full = False
        if sending is not None:
            sending.cancel()
        await asyncio.gather(*(t for t in (sending, stop) if t is not None), return_exceptions=True)
        await client.close(timeout_s=1)
        await server.stop()
