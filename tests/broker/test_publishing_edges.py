"""The publishing path and producer de-duplication at their edges: a producer name reused
while its last send is being written, a reconnect after a drop only the client saw, and a
store outage during a transactional send. Each failed before its fix (a review).

Each test drives real brokers on loopback (in-process aiohttp servers over file ledgers),
the real client or raw WebSocket producers; a slow disk is a file entry log whose batch
holding a marked payload waits in its writing thread for the test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.txn import headers
from segtxn.client import Client, TransactionFailed
from segtxn.ledger.files import FileEntryLog
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import ProducerReady, Receipt, Send
from segtxn.protocol.names import TopicName
from tests.broker.conftest import StartBroker
from tests.cluster import Cluster
from tests.waiting import wait_until
from tests.wsframes import next_frame

TOPIC = "persistent://acme/review/events"
PATH = "persistent/acme/review/events"
SLOW = b"<slow-disk>"


class SlowDisk:
    """Batches holding a payload with :data:`SLOW` wait in the writing thread until
    :meth:`release` (a slow disk); ``entered`` is set once one waits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        original = FileEntryLog.append_batch
        gate, entered = self.gate, self.entered

        def append_batch(log: FileEntryLog, payloads: Sequence[bytes]) -> None:
            if any(SLOW in p for p in payloads):
                entered.set()
                gate.wait(30)
            original(log, payloads)

        monkeypatch.setattr(FileEntryLog, "append_batch", append_batch)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 10), "the slow write never began"

    def release(self) -> None:
        self.gate.set()


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowDisk]:
    disk = SlowDisk(monkeypatch)
    try:
        yield disk
    finally:
        disk.release()  # never leave a writing thread waiting


@asynccontextmanager
async def raw_producer(
    broker: BrokerServer, name: str
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, ProducerReady]]:
    url = f"{broker.settings.advertise_url}/ws/v2/producer/{PATH}?name={name}"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        ready = await next_frame(ws)
        assert isinstance(ready, ProducerReady), ready
        yield ws, ready


async def read_all(client: Client, count: int) -> list[bytes]:
    """The first ``count`` values of the topic (``count``: what the broker stored)."""
    reader = await client.create_reader(TOPIC, start="earliest")
    try:
        return [(await reader.receive(10)).value for _ in range(count)]
    finally:
        await reader.close()


def stored_count(broker: BrokerServer) -> int:
    return broker.service.topics[TopicName.parse(TOPIC)].counters.messages_in


# ---------------------------------------------------------------------------------------
# 1. ProducerReady.last_sequence_id ignores the name's sends still in flight. A producer
#    that comes back under the same name (an application restart, or a second process
#    taking over the name once the first has gone) while the old connection's last send is
#    still being written starts its sequence ids at an id that is in flight: its new
#    message is answered as a duplicate of the old one (the original's id, receipt
#    success) and is never stored. Silent loss.


async def test_a_name_reused_while_its_last_send_is_in_flight_loses_no_message(
    start_broker: StartBroker, slow_disk: SlowDisk
) -> None:
    broker = await start_broker()
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "app") as (ws, ready):
            assert ready.last_sequence_id == -1
            await ws.send_bytes(frames.encode(Send(seq=0, payload=b"old-0")))
            receipt = await next_frame(ws)
            assert isinstance(receipt, Receipt) and receipt.seq == 0
            await ws.send_bytes(frames.encode(Send(seq=1, payload=b"old-1 " + SLOW)))
            await slow_disk.wait_entered()
        # the first process is gone (its socket closed); its last send is still being written
        topic = broker.service.topics[TopicName.parse(TOPIC)]
        await wait_until(lambda: "app" not in topic.producers, what="the old connection gone")
        assert 1 in topic.dedup.state("app").in_flight

        # the application starts again under its name, and sends a new message
        producer = await client.create_producer(TOPIC, name="app")
        sending = asyncio.ensure_future(producer.send(b"new"))
        state = topic.dedup.state("app")
        await wait_until(
            lambda: 2 in state.in_flight or topic.counters.duplicates > 0 or sending.done(),
            what="the new message taken in (or answered as a duplicate)",
        )
        slow_disk.release()
        await sending
        await producer.close()
        values = await read_all(client, stored_count(broker))
        assert b"new" in values, f"the restarted producer's message was never stored: {values}"


# ---------------------------------------------------------------------------------------
# 2. A producer whose connection was cut on its side only (a NAT or load balancer dropping
#    the flow, a client heartbeat timeout) reconnects while the broker still holds the old,
#    dead connection under its name. The broker answers ProducerBusy, and the client's
#    reconnect loop treats ProducerBusy as FATAL (producer.py, FATAL / _run): every send
#    in flight fails and the producer is dead for good, although the only obstacle is a
#    connection the broker has not yet noticed is gone (docs/protocol.md retries
#    ProducerBusy "after an attempt of the same call was given up on").


_Link = tuple[asyncio.StreamWriter, asyncio.StreamWriter, list[asyncio.Task[None]]]


class CuttableProxy:
    """A TCP proxy on loopback: :meth:`cut_client_sides` drops every connection on the
    client's side only, leaving the broker's side open and silent (a one-sided cut)."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._server: asyncio.Server | None = None
        self._links: list[_Link] = []
        self._stale: list[_Link] = []
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._links.append((writer, up_writer, pumps))

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        sink.close()  # (not when cancelled: a cut leaves the other side open)

    async def cut_client_sides(self) -> None:
        links, self._links = self._links, []
        for client_side, _, pumps in links:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            client_side.transport.abort()
        self._stale += links  # the broker's sides stay open until close()

    async def close(self) -> None:
        for _, broker_side, pumps in self._links + self._stale:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            broker_side.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_a_reconnect_after_a_one_sided_cut_does_not_kill_the_producer(
    tmp_path: Path,
) -> None:
    from segtxn.broker.settings import BrokerSettings
    from segtxn.web import Listener

    listener = Listener("127.0.0.1")  # its port, held from the pick on
    proxy = CuttableProxy(listener.port)
    await proxy.start()
    url = f"http://127.0.0.1:{proxy.port}"
    broker = BrokerServer(
        BrokerSettings(
            broker_id="cut",
            advertise_url=url,  # every client connection goes through the proxy
            store_url="memory://",
            ledger_url=f"file://{tmp_path}/cut",
        ),
        listener=listener,
    )
    await broker.start()
    try:
        async with Client(url) as client:
            await client.admin.create_topic(TOPIC)
            producer = await client.create_producer(TOPIC, name="p")
            await producer.send(b"before the cut")
            await proxy.cut_client_sides()
            # the broker still holds its side; the producer reconnects through the proxy
            try:
                await producer.send(b"after the cut")
            except Exception as e:
                pytest.fail(f"a send after a reconnect failed: {type(e).__name__}: {e}")
            finally:
                await producer.close()
    finally:
        await proxy.close()
        await broker.stop()


# ---------------------------------------------------------------------------------------
# 4. A transactional send whose header read meets a store outage is answered
#    PersistenceError ("stored data is damaged or missing", FATAL), not ServiceNotReady
#    (retriable): Publishing._not_stored (publishing.py) maps every exception that is not
#    a LedgerError or ServerError to PERSISTENCE, store errors included, where the rest
#    of the broker translates them (segtxn/boundary.py translate: ServiceNotReady).


async def test_a_store_outage_during_a_transactional_send_is_retriable_not_persistence(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(headers, "RECENT_OPEN", 0)  # the broker must read the header
    async with Client(cluster.url) as client:
        await client.admin.create_topic("topic://acme/review/txn", segments=1)
        producer = await client.create_producer("topic://acme/review/txn", name="p")
        await producer.send(b"warm-up", key="k")
        txn = client.transaction()
        await txn.add_partition("topic://acme/review/txn")
        cluster.faults.fail("range", key_prefix="/txn/", times=None)
        try:
            with pytest.raises(ServerError) as refused:
                await producer.send(b"in txn", key="k", txn=txn)
        finally:
            cluster.faults.clear()
        error = refused.value
        if isinstance(error, TransactionFailed) and error.__cause__ is not None:
            error = error.__cause__  # type: ignore[assignment]
        assert error.name is not ErrorName.PERSISTENCE, (
            f"a store outage was answered as damaged data: {error.name}: {error}"
        )
        assert error.name is ErrorName.SERVICE_NOT_READY, f"{error.name}: {error}"
        await txn.abort()
        await producer.close()
