"""A periodic de-duplication snapshot the store refuses is logged as what it is: one WARNING
line naming the error, no traceback (the replay covers the entries after the last snapshot;
nothing is lost). Before, every such failure, the store away or (since snapshots are fenced)
another owner having opened the topic's ledger, was logged with log.exception, a traceback
per snapshot interval for an ordinary outage."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.dedup_snapshots import PREFIX as DEDUP_PREFIX
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.metastore import MetadataStore, StoreUnavailable, open_store
from segtxn.metastore.faults import FaultInjector
from segtxn.web import Listener
from tests.waiting import wait_until

TOPIC = "persistent://acme/snap/logged"
EVERY = 3


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    store = open_store("memory://", wrap=FaultInjector)
    yield store
    await store.close()


@pytest.fixture
async def broker(store: MetadataStore, tmp_path: Path) -> AsyncIterator[BrokerServer]:
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    server = BrokerServer(
        BrokerSettings(
            broker_id="b-snap",
            advertise_url=f"http://127.0.0.1:{listener.port}",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
            dedup_snapshot_every=EVERY,
        ),
        store=store,
        listener=listener,
    )
    await server.start()
    yield server
    await server.stop()


async def test_a_refused_periodic_snapshot_is_one_warning_without_a_traceback(
    broker: BrokerServer, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    faults = store.engine
    assert isinstance(faults, FaultInjector)

    def snapshot_logs() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "de-duplication snapshot" in r.getMessage()]

    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        faults.fail(
            "txn", key_prefix=DEDUP_PREFIX, times=None, error=StoreUnavailable("injected: away")
        )
        with caplog.at_level(logging.WARNING):
            for i in range(EVERY):
                await producer.send(b"m%d" % i)
            await wait_until(lambda: bool(snapshot_logs()), what="the snapshot's failure logged")
        faults.clear()
        await producer.close()
    [record] = snapshot_logs()
    assert record.levelno == logging.WARNING and record.exc_info is None, record.exc_info
    assert "not written (replay will cover it): StoreUnavailable: injected: away" in (
        record.getMessage()
    )
