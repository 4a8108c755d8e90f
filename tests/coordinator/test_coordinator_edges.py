"""The transaction coordinator at its edges, with real components (etcd, aiohttp servers,
fault-injecting store wrappers): sweeps and stats over more headers than one store answer
may carry, a v4 end while a participant's home broker is not live or its URL answers what
no broker sends, and a v4 id whose log failed a write. Each failed before its fix (a review)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web

from segtxn.client import Client
from segtxn.coordinator import v5
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import log_name
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.coordinator.v5 import CoordinatorV5
from segtxn.ledger import LedgerSettings
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, TooLarge, open_store
from segtxn.metastore.engine import RangeResult
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector
from segtxn.metastore.records import Put
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import V5_COORDINATOR_BASE, TxnId, TxnState
from segtxn.topics import transactions as T
from segtxn.topics.catalog import HOMES_BY_BROKER, BrokerInfo, broker_key, home_key
from segtxn.web import Listener
from tests.cluster import Cluster
from tests.waiting import wait_until

V5_SETTINGS = CoordinatorSettings(
    advertise_url="http://127.0.0.1:1", coordinator_ids=1, session_ttl_s=2,
    timeout_sweep_s=3600, gc_sweep_s=3600, gc_retention_s=0, id_block=1000,
)  # fmt: skip


@pytest.fixture
async def etcd_store(etcd_server: EtcdServer) -> AsyncIterator[MetadataStore]:
    url = etcd_server.url(f"/review-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    async with open_store(url) as s:
        yield s


async def _write_headers(
    store: MetadataStore, most: int, first_least: int, n: int, header: T.TxnHeader
) -> list[TxnId]:
    """``n`` headers as the coordinator writes them (each with its index entry), in
    store steps of 60, a few at a time."""
    txns = [TxnId(most, first_least + i) for i in range(n)]
    value = T.encode(header)
    batches = [txns[i : i + 60] for i in range(0, n, 60)]
    limit = asyncio.Semaphore(16)

    async def write(batch: list[TxnId]) -> None:
        async with limit:
            await store.commit(
                [
                    Put(
                        T.header_key(t),
                        value,
                        partition_key=t.key,
                        indexes=T.header_indexes(header),
                    )
                    for t in batch
                ]
            )

    await asyncio.gather(*(write(b) for b in batches))
    return txns


# --------------------------------------------------------------------------- v5 GC sweep


ANSWER_CAP = 100
"""Entries one store answer may carry in these tests: etcd's 8 MiB, about 40,000 headers,
scaled down so that a few hundred headers show what tens of thousands do."""


def cap_answers(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``store`` refuse an answer of more than :data:`ANSWER_CAP` entries, as etcd
    refuses one larger than its message limit (``TooLarge``)."""
    engine = store.engine
    original = engine.range

    async def capped(lo: bytes, hi: bytes | None = None, *, limit: int = 0) -> RangeResult:
        result = await original(lo, hi, limit=limit)
        if len(result.kvs) > ANSWER_CAP:
            raise TooLarge("injected: an answer larger than a store answer may carry")
        return result

    monkeypatch.setattr(engine, "range", capped)


async def test_gc_sweep_still_deletes_headers_once_the_final_backlog_is_large(
    etcd_store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GC sweep reads the final headers past retention a page at a time: read in one
    answer, a backlog larger than a store answer may carry (etcd: 8 MiB, about 40,000
    headers) failed every sweep with TooLarge, and final headers grew without bound."""
    monkeypatch.setattr(v5, "PAGE", 40)
    now_ms = int(time.time() * 1000)
    header = T.TxnHeader(
        TxnState.COMMITTED, now_ms - 50_000, now_ms - 60_000, finalized_ms=now_ms - 55_000
    )
    n = 3 * ANSWER_CAP
    txns = await _write_headers(etcd_store, V5_COORDINATOR_BASE + 7, 1, n, header)
    cap_answers(etcd_store, monkeypatch)
    coordinator = CoordinatorV5(etcd_store, V5_SETTINGS)
    # no op record is left for any of them: every one of these headers may go
    deleted = await coordinator.sweep_gc(now_ms=now_ms)
    assert deleted == n
    assert await etcd_store.get(T.header_key(txns[0])) is None
    assert await etcd_store.get(T.header_key(txns[-1])) is None


# --------------------------------------------------------------------------- v4 fan-out

V4_TOPIC = "persistent://acme/review/t1"
DEAD = "b-dead"


async def _home(cluster: Cluster, broker_id: str) -> None:
    """Make the catalog name ``broker_id`` as the topic's home: what it says while the
    home broker is down and nobody has taken the topic over yet."""
    await cluster.store.put(
        home_key(TopicName.parse(V4_TOPIC)),
        msgspec.json.encode(broker_id),
        indexes={HOMES_BY_BROKER: broker_id},
    )


async def _coordinator_url(client: Client) -> str:
    found = await client.connector.request("GET", "/lookup/v2/coordinators")
    return str(found["coordinators"][0])


async def test_v4_end_txn_retries_while_the_home_broker_is_not_live(
    client: Client, cluster: Cluster
) -> None:
    """A participant whose home broker is not registered (down, not yet taken over) is
    tried again within ``fan_out_timeout_s``, as one that does not answer is (the module
    and docs/transactions.md promise it): here the home is back on a live broker just after
    the first look, and END_TXN succeeds. It failed at once with ServiceNotReady."""
    await client.admin.create_topic(V4_TOPIC)
    producer = await client.create_producer(V4_TOPIC)
    txn = client.transaction()
    await producer.send(b"x", txn=txn)
    await _home(cluster, DEAD)
    first_look = cluster.faults.hold("range", key_prefix=broker_key(DEAD), times=1)
    url = await _coordinator_url(client)
    ending = asyncio.create_task(
        client.connector.request("POST", f"{url}/txn/v2/{txn.id}/end", params={"action": "COMMIT"})
    )
    try:
        await first_look.wait_for(1)  # the fan-out read the dead broker's (absent) record
        await _home(cluster, "b1")  # the topic is served again
        first_look.release()
        reply = await asyncio.wait_for(ending, 10)
    finally:
        first_look.release()
        if not ending.done():
            ending.cancel()
        await asyncio.gather(ending, return_exceptions=True)
    assert reply["state"] == "COMMITTED"


async def test_v4_resume_does_not_spin_while_a_participant_has_no_live_broker(
    client: Client, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Finishing a timed-out (or recovered) transaction whose participant has no live
    broker is tried again with pauses between. It was tried again at once: with the
    fan-out failing at once (above), the coordinator spun, three store reads and a WARNING
    per turn, for as long as the broker was away. (Its tries after the first are DEBUG
    lines: segtxn/coordinator/retry.py.)"""
    caplog.set_level(logging.DEBUG, logger="segtxn.coordinator")
    await client.admin.create_topic(V4_TOPIC)
    producer = await client.create_producer(V4_TOPIC)
    txn = client.transaction(timeout_s=0.2)
    await producer.send(b"x", txn=txn)
    await _home(cluster, DEAD)

    def failures() -> list[float]:
        return [r.created for r in caplog.records if "finishing its ABORT failed" in r.getMessage()]

    try:
        await wait_until(lambda: len(failures()) >= 3, timeout=60, what="3 failed finishes")
    finally:
        await _home(cluster, "b1")
    first, third = failures()[0], failures()[2]
    # the fan-out's own retries (2 s here) and the back-off between finishes space them
    assert third - first >= 2.0, (
        f"2 retries of the abort's fan-out in {third - first:.4f} s: no pause between them"
    )


# --------------------------------------------------------------------------- v4 log writes


async def test_v4_id_serves_again_after_one_failed_log_write(tmp_path: Path) -> None:
    """A managed ledger refuses every append after one failed write until it is opened
    again, so a v4 coordinator whose log failed a write gives its id up: a take-over (its
    own next campaign here) reopens and replays the log, and the id serves again. It went
    on holding the id, refusing every NEW_TXN, END_TXN and timeout for good."""
    store = open_store("memory://", wrap=FaultInjector)
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    settings = CoordinatorSettings(
        advertise_url="http://127.0.0.1:1",
        v4_coordinator_ids=1,
        ledger_url=f"file://{tmp_path / 'txn-logs'}",
        ledger=LedgerSettings(max_ledger_bytes=1),  # every append after the first rolls over
        timeout_sweep_s=3600,
    )
    v4 = CoordinatorV4(store, settings)
    await v4.start()
    try:
        await wait_until(lambda: 0 in v4.held, what="v4 id 0 held")
        await v4.new_txn(timeout_s=60)  # the first entry of the ledger
        engine.fail("txn", key_prefix=metadata_key(log_name(0)), times=1)  # one blip
        with pytest.raises(ServerError) as blip:
            await v4.new_txn(timeout_s=60)
        assert blip.value.name is ErrorName.SERVICE_NOT_READY
        assert engine.injected == 1

        async def serves() -> bool:
            try:
                await v4.new_txn(timeout_s=60)
            except ServerError as e:
                last[0] = e
                return False
            return True

        last: list[ServerError | None] = [None]
        try:
            await wait_until(serves, timeout=10, what="v4 id 0 serving again")
        except AssertionError as e:
            raise AssertionError(f"{e}; every NEW_TXN still refused: {last[0]}") from None
    finally:
        await v4.stop()
        await store.close()


# --------------------------------------------------------------------------- stats


async def test_stats_answers_with_many_open_transactions(
    etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /txn/v2/stats (what the operator polls for TransactionCoordinator status)
    counts the open transactions a page at a time. It read them in one answer of up to
    100,000 headers: 60,000 open (2,000 a second with 30 s timeouts) were more than an etcd
    answer may carry, and it failed with a 5xx exactly when the load was high."""
    monkeypatch.setattr(v5, "PAGE", 40)
    url = etcd_server.url(f"/review-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    store = open_store(url)
    now_ms = int(time.time() * 1000)
    header = T.TxnHeader(TxnState.OPEN, now_ms + 3_600_000, now_ms)
    n = 3 * ANSWER_CAP
    await _write_headers(store, V5_COORDINATOR_BASE + 9, 1, n, header)
    cap_answers(store, monkeypatch)
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    port = listener.port
    server = CoordinatorServer(
        CoordinatorSettings(advertise_url=f"http://127.0.0.1:{port}", timeout_sweep_s=3600),
        store=store,
        listener=listener,
    )
    await server.start()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/txn/v2/stats") as response,
        ):
            body = await response.text()
            assert response.status == 200, f"{response.status}: {body[:300]}"
            assert (await response.json())["openTransactions"] == n
    finally:
        await server.stop()
        await store.close()


async def test_v4_end_txn_retries_a_participant_answer_that_is_not_a_brokers(
    client: Client, cluster: Cluster
) -> None:
    """A participant's URL answers something no broker sends (a proxy's HTML 502, a broker
    restarting behind it): the fan-out tries again, as for a broker that does not answer,
    and END_TXN succeeds once the topic is served again. The undecodable answer escaped as
    a 500 from END_TXN."""
    hit = asyncio.Event()

    async def bad_gateway(request: web.Request) -> web.Response:
        hit.set()
        return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")

    app = web.Application()
    app.router.add_post("/{tail:.*}", bad_gateway)
    runner = web.AppRunner(app)
    await runner.setup()
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    port = listener.port
    await web.SockSite(runner, listener.socket).start()
    try:
        await client.admin.create_topic(V4_TOPIC)
        producer = await client.create_producer(V4_TOPIC)
        txn = client.transaction()
        await producer.send(b"x", txn=txn)
        proxy = BrokerInfo("b-proxy", f"http://127.0.0.1:{port}", int(time.time() * 1000))
        await cluster.store.put(broker_key("b-proxy"), msgspec.json.encode(proxy))
        await _home(cluster, "b-proxy")
        url = await _coordinator_url(client)
        ending = asyncio.create_task(
            client.connector.request(
                "POST", f"{url}/txn/v2/{txn.id}/end", params={"action": "COMMIT"}
            )
        )
        await asyncio.wait_for(hit.wait(), 10)  # the participant's URL answered HTML
        await _home(cluster, "b1")  # the topic is served again
        reply = await asyncio.wait_for(ending, 10)
        assert reply["state"] == "COMMITTED"
    finally:
        await runner.cleanup()
