"""A broker that lost its registration while clients were connected to it: real broker
processes on etcd, 2 s sessions, paused (SIGSTOP) past their session and resumed.

The question: can a producer connected to the paused broker get receipts for messages that
are lost, or can two processes serve one topic at once? What the experiment found before
op records were fenced by their segment's ledger (segtxn/broker/txn/oprecords.py) and the
broker fenced itself (segtxn/broker/fencing.py):

- **A paused owner, nobody takes its id** (scenario 1). Without replication nobody can take
  its topics (their ledgers are on its disk): lookups say its broker is down, and it serves
  them again when it resumes. With replication a client of another broker has the topic
  taken over; the new owner's recovery fences the old owner's replicas, so the old owner's
  late appends fail, it unloads the topic, and its producer's sends land on the new owner
  (de-duplication keeps one copy). Nothing acknowledged was lost.
- **The same, a transaction**: lost. The paused owner had appended ``m2`` (on two replicas)
  but not yet written the transaction's writes record covering it; the new owner's recovery
  took ``m2`` for an orphan (``1:2 of ... is not covered by its writes record``); the old
  owner resumed, wrote the record (the header was still OPEN, the only check) and sent the
  receipt, and the transaction COMMITTED with ``m2`` acknowledged and never delivered.
- **A duplicate with the paused owner's id** (scenario 2, another data directory,
  registered while the owner was paused). With replication the duplicate recovered the
  topic for its clients; the resumed owner, not registered, still served anything that
  reached it (it compared the topic's home with its id only): in one run it opened the topic
  again, recovering the ledger from under the duplicate, whose writes then failed (``ledger
  2 ... was recovered by another owner``), so the sends that reached it were refused
  (``ServiceNotReady``); the two took the topic from each other. Replica fencing kept every
  acknowledged message. Without replication the duplicate refused the topic (its ledger
  files are on the owner's disk: ``PersistenceError``, not ready) while the resumed owner
  kept serving and acknowledging its connected clients from its disk: nothing lost either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest

from segtxn.broker import fencing
from segtxn.broker.app import BrokerServer
from segtxn.broker.dedup_snapshots import PREFIX as DEDUP_PREFIX
from segtxn.broker.settings import BrokerSettings
from segtxn.client import (
    Client,
    Consumer,
    ErrorName,
    Producer,
    ScalableProducer,
    ServerError,
    TransactionFailed,
)
from segtxn.client.errors import Timeout
from segtxn.ledger.metadata import LedgerMetadata, metadata_key
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import Catalog
from segtxn.web import Listener
from tests import processes
from tests.metrics_scrape import scrape
from tests.processes import ServerProcess
from tests.waiting import wait_until

TTL = 2.0
"""The brokers' session TTL."""


@pytest.fixture
def cluster_store(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/fence-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def own_etcd() -> Iterator[EtcdServer]:
    """An etcd of this test alone: it is paused (SIGSTOP) for a moment."""
    server = EtcdServer.in_temp_dir(unsafe_no_fsync=True)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.process.send_signal(signal.SIGCONT)
        server.stop()


async def registered_url(store_url: str, broker_id: str) -> str | None:
    async with open_store(store_url) as meta:
        return await Catalog(meta).broker_url(broker_id)


async def wait_registered(store_url: str, broker_id: str, url: str | None, what: str) -> None:
    async def there() -> bool:
        return await registered_url(store_url, broker_id) == url

    await wait_until(there, timeout=6 * TTL + 20, what=what)


def brokers_of(
    store_url: str, tmp_path: Path, *, replicated: bool, count: int = 3
) -> list[ServerProcess]:
    extra = ("--replication", "3/2") if replicated else ()
    return [
        processes.broker(store_url, tmp_path / f"b{i}", f"b{i}", session_ttl=TTL,
                         log=tmp_path / f"b{i}.log", extra=extra)
        for i in range(count)
    ]  # fmt: skip


async def start_all(started: list[ServerProcess], *servers: ServerProcess) -> None:
    started += servers
    for server in servers:
        server.start()
    await asyncio.gather(*(server.ready() for server in servers))


async def owner_of(url: str, topic: str) -> str:
    async with Client(url) as client:
        return await client.connector.broker_for(TopicName.parse(topic))


class Received:
    """What a consumer received, acknowledging each message (a task owned by the test)."""

    def __init__(self, consumer: Consumer) -> None:
        self.values: list[bytes] = []
        self._consumer = consumer
        self.task = asyncio.create_task(self._run(), name="test-received")

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(ServerError, Timeout):
                message = await self._consumer.receive(timeout_s=60)
                self.values.append(message.value)
                await self._consumer.acknowledge(message, timeout_s=10)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def created_and_owned(brokers: list[ServerProcess], topic: str) -> tuple[ServerProcess, str]:
    """Create ``topic``; the broker that owns it, and its id."""
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic)
    owner = await owner_of(brokers[0].url, topic)
    index = next(i for i, b in enumerate(brokers) if b.url == owner)
    return brokers[index], f"b{index}"


@contextlib.asynccontextmanager
async def receiving(consumer: Consumer) -> AsyncIterator[Received]:
    received = Received(consumer)
    try:
        yield received
    finally:
        await received.stop()


async def read_all(url: str, topic: str, subscription: str) -> list[bytes]:
    """Every message of ``topic``, from a new subscription (an ``end`` marker sent last)."""
    async with Client(url) as client:
        await (await client.create_producer(topic, timeout_s=30)).send(b"end")
        consumer = await client.subscribe(
            topic, subscription, initial_position="earliest", timeout_s=30
        )
        got: list[bytes] = []
        while not got or got[-1] != b"end":
            got.append((await consumer.receive(timeout_s=20)).value)
        return got[:-1]


async def send_all(producer: Producer | ScalableProducer, values: list[bytes]) -> list[bytes]:
    """Send each; returns those acknowledged (a refusal is fine, a lie is not)."""
    acknowledged: list[bytes] = []
    for value in values:
        try:
            await producer.send(value)
            acknowledged.append(value)
        except (ServerError, Timeout) as e:
            print(f"{value!r} refused: {e!r}")
    return acknowledged


# ---------------------------------------------------------------------- plain messages


@pytest.mark.slow
@pytest.mark.parametrize(
    ("replicated", "duplicate"),
    [(False, False), (True, False), (True, True)],
    ids=["paused-local", "paused-replicated", "duplicate-replicated"],
)
async def test_nothing_acknowledged_is_lost_and_one_broker_serves_the_topic(
    cluster_store: str,
    tmp_path: Path,
    started: list[ServerProcess],
    replicated: bool,
    duplicate: bool,
) -> None:
    """The owner is paused past its session with a producer and a consumer connected.
    Meanwhile (with replication) a client of another broker has the topic taken over, or a
    duplicate process registers the owner's id; then the owner resumes. Every acknowledged
    message is in the topic once; the consumer left on the old owner gets what the rightful
    owner stores after it resumes (it is handed over, not kept on a broker that stopped
    being the owner); the rightful owner's producer is never refused because of the old one,
    and a client that still connects to the old owner (its lookup from before the pause) is
    refused by it rather than served.
    """
    brokers = brokers_of(cluster_store, tmp_path, replicated=replicated)
    await start_all(started, *brokers)
    topic = "persistent://acme/fence/orders"
    victim, victim_id = await created_and_owned(brokers, topic)
    survivor = next(b for b in brokers if b is not victim)
    acknowledged: list[bytes] = []
    async with Client(victim.url) as old:
        old_producer = await old.create_producer(topic, send_timeout_s=6 * TTL + 20)
        old_consumer = await old.subscribe(topic, "audit", initial_position="earliest")
        async with receiving(old_consumer) as audit:
            acknowledged += await send_all(old_producer, [f"before-{i}".encode() for i in range(5)])
            await wait_until(lambda: len(audit.values) == 5, what="the audit got the first five")

            victim.pause()
            await wait_registered(cluster_store, victim_id, None, "the paused owner unregistered")
            rightful = victim
            if duplicate:
                rightful = processes.broker(
                    cluster_store, tmp_path / "duplicate", victim_id, session_ttl=TTL,
                    log=tmp_path / "duplicate.log", extra=("--replication", "3/2"),
                )  # fmt: skip
                started.append(rightful)
                rightful.start()
                await wait_registered(
                    cluster_store, victim_id, rightful.url, "the duplicate registered"
                )
            # sends queued while the owner is paused: they reach it when it resumes
            late = [
                asyncio.ensure_future(old_producer.send(f"late-{i}".encode())) for i in range(3)
            ]
            async with Client(rightful.url if duplicate else survivor.url) as new:
                new_producer: Producer | None = None
                if replicated:  # the topic is taken over (or opened by the duplicate)
                    created = await new.create_producer(topic, timeout_s=6 * TTL + 20)
                    assert isinstance(created, Producer)
                    new_producer = created
                    acknowledged += await send_all(
                        new_producer, [f"new-{i}".encode() for i in range(5)]
                    )
                victim.resume()
                for i, sending in enumerate(late):
                    try:
                        await sending
                        acknowledged.append(f"late-{i}".encode())
                    except (ServerError, Timeout) as e:
                        print(f"late-{i} refused: {e!r}")
                if duplicate:  # a client whose lookup named the old owner before its pause
                    with pytest.raises(ServerError) as refused:
                        stale = await old.connector.websocket(
                            victim.url, "producer", TopicName.parse(topic), "", {"name": "stale"}
                        )
                        await stale.close()
                    assert refused.value.name is ErrorName.SERVICE_NOT_READY
                    assert "cannot prove it holds its id" in refused.value.message
                after = [f"after-{i}".encode() for i in range(5)]
                if new_producer is not None:  # never refused for what the old owner does
                    for value in after:
                        await new_producer.send(value)
                    acknowledged += after
                else:
                    acknowledged += await send_all(old_producer, after)
                await wait_until(
                    lambda: set(after) <= set(audit.values),
                    timeout=6 * TTL + 20,
                    what="the consumer of the old owner handed over",
                )
    if duplicate:
        assert "is registered by another broker" in victim.log_text()
        assert "recovered by another owner" not in rightful.log_text(), rightful.log_text()[-3000:]
    elif replicated:
        assert await owner_of(survivor.url, topic) != victim.url
    else:  # nobody could take it: it is served where it was
        assert await owner_of(survivor.url, topic) == victim.url
    got = await read_all(rightful.url, topic, "check")
    assert len(set(got)) == len(got), got  # nothing twice
    assert set(acknowledged) <= set(got), (acknowledged, got)  # nothing acknowledged lost


@pytest.mark.slow
async def test_a_duplicate_without_the_data_serves_nothing_and_the_original_takes_over_again(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """Without replication a duplicate with the paused owner's id (another data directory)
    holds none of its ledgers: it refuses its topics (PersistenceError) and is not ready.
    The resumed owner, seeing its id held, lets go of its topics too: with both refusing,
    clients retry, and nothing is acknowledged by a process that cannot prove it holds the
    id. Once the duplicate is stopped (the ERROR on both says to stop one), the owner claims
    its id again and serves from its own disk: everything acknowledged is there, once."""
    brokers = brokers_of(cluster_store, tmp_path, replicated=False, count=2)
    await start_all(started, *brokers)
    topic = "persistent://acme/fence/local"
    victim, victim_id = await created_and_owned(brokers, topic)
    acknowledged: list[bytes] = []
    async with Client(victim.url) as old:
        producer = await old.create_producer(topic, send_timeout_s=6 * TTL + 40)
        consumer = await old.subscribe(topic, "audit", initial_position="earliest")
        async with receiving(consumer) as audit:
            acknowledged += await send_all(producer, [f"before-{i}".encode() for i in range(5)])
            await wait_until(lambda: len(audit.values) == 5, what="the audit got the first five")
            victim.pause()
            await wait_registered(cluster_store, victim_id, None, "the paused owner unregistered")
            duplicate = processes.broker(
                cluster_store, tmp_path / "duplicate", victim_id, session_ttl=TTL,
                log=tmp_path / "duplicate.log",
            )  # fmt: skip
            started.append(duplicate)
            duplicate.start()
            await wait_registered(cluster_store, victim_id, duplicate.url, "the duplicate in")
            late = asyncio.ensure_future(producer.send(b"late"))
            victim.resume()
            await wait_until(
                lambda: "letting go of the 1 topics" in victim.log_text(),
                timeout=6 * TTL + 20,
                what="the resumed owner letting go",
            )
            assert not late.done()  # acknowledged by neither meanwhile
            duplicate.stop()  # the operator stops one of them
            await late
            acknowledged.append(b"late")
            acknowledged += await send_all(producer, [b"after"])
            await wait_until(lambda: b"after" in audit.values, what="the audit goes on")
    assert "have no ledger files" in duplicate.log_text()
    got = await read_all(victim.url, topic, "check")
    assert got == acknowledged, got  # all of it, once, in order


# ---------------------------------------------------------------------- transactions


async def replica_count(url: str, member: str, ledger: str, ledger_id: int) -> int:
    """How many entries the replica ``member`` (``<broker>@<instance>``, served at ``url``)
    holds of ledger ``ledger_id`` of ``ledger``."""
    query = {"instance": member.rpartition("@")[2], "ledger": ledger, "id": str(ledger_id)}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/replica/v1/stat", params=query) as response,
    ):
        body = await response.json()
        return int(body["count"])


async def recording(url: str) -> bool:
    """Whether the broker at ``url`` has an op-record step at the store, unanswered."""
    return bool((await scrape(url)).value("segtxn_txn_metadata_store_op_steps_in_flight"))


async def last_confirmed(url: str, segment: str) -> str | None:
    """The last entry the broker at ``url`` has stored of ``segment`` (its stats: no store
    call for a segment it has loaded)."""
    path = TopicName.parse(segment).path
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/admin/v2/{path}/stats") as response,
    ):
        position = (await response.json())["lastConfirmedPosition"]
        return None if position is None else str(position)


@pytest.mark.slow
async def test_a_resumed_owner_cannot_commit_what_the_new_owner_took_for_an_orphan(
    own_etcd: EtcdServer, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """A transactional send is an append, then a rewrite of the transaction's writes record
    covering it. The owner is paused between the two: etcd is paused for a moment so that
    the rewrite covering ``m1`` is in flight when ``m2`` is appended (``m2`` is sent once the
    owner's gauge shows that rewrite sent: a rewrite not yet begun waits for the appends in
    flight, and would cover ``m2`` too), so ``m2`` waits for the next rewrite; the owner
    is paused once it and a replica hold ``m2``. Its session expires; a client of another
    broker has the segment taken over, whose recovery finds ``m2`` outside the writes
    record: an orphan, never shown. Then the owner resumes.

    ``m2`` must not be acknowledged as part of a transaction that then commits: the old
    owner's rewrite is refused (the segment's ledger is someone else's now), the send fails,
    and the transaction cannot commit.
    """
    store_url = own_etcd.url("/fence")
    brokers = brokers_of(store_url, tmp_path, replicated=True)
    coordinator = processes.coordinator(store_url, "c1", log=tmp_path / "c1.log")
    await start_all(started, *brokers, coordinator)
    topic = "topic://acme/fence/payments"
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic, segments=1)
        homes = {i: (await client.admin.broker_homes(f"b{i}")).homes for i in range(3)}
    index = next(i for i, held in homes.items() if held)
    (segment,) = homes[index]
    victim = brokers[index]
    survivor = next(b for b in brokers if b is not victim)
    assert own_etcd.process is not None

    async with Client(survivor.url) as client:
        producer = await client.create_producer(topic, send_timeout_s=60)
        txn = await client.transaction(timeout_s=120).start()
        await producer.send(b"m0", key="k", txn=txn)  # its writes record exists
        async with open_store(store_url) as meta:
            record = await meta.get(metadata_key(segment))
            assert record is not None
            ledger = msgspec.json.decode(record.value, type=LedgerMetadata).ledgers[-1]
        member = next(r for r in ledger.replicas if not r.startswith(f"b{index}@"))
        member_url = brokers[int(member.partition("@")[0][1:])].url
        held = await replica_count(member_url, member, segment, ledger.id)

        async def on_replica(count: int) -> bool:
            return await replica_count(member_url, member, segment, ledger.id) >= count

        async def stored(entry: int) -> bool:
            return await last_confirmed(victim.url, segment) == f"{ledger.id}:{entry}"

        own_etcd.process.send_signal(signal.SIGSTOP)
        try:
            m1 = await producer.send_async(b"m1", key="k", txn=txn)
            await wait_until(lambda: stored(held), timeout=2, what="m1 stored at the owner")
            # m1's record must be on its way before m2 is sent: a step that has not begun
            # waits for appends in flight, and would cover m2 too (then no orphan is left)
            await wait_until(lambda: recording(victim.url), timeout=2, what="m1's record sent")
            m2 = await producer.send_async(b"m2", key="k", txn=txn)
            await wait_until(lambda: stored(held + 1), timeout=2, what="m2 stored at the owner")
            await wait_until(lambda: on_replica(held + 2), timeout=2, what="m2 on a replica")
            victim.pause()
        finally:
            own_etcd.process.send_signal(signal.SIGCONT)
        await wait_registered(store_url, f"b{index}", None, "the paused owner unregistered")

        async with Client(survivor.url) as other:
            check = await other.subscribe(topic, "check", initial_position="earliest")

            async def orphaned() -> bool:  # the new owner's recovery: m2 is not covered
                async with open_store(store_url) as meta:
                    return bool((await meta.list_prefix("/txn-orphans/")).records)

            await wait_until(orphaned, timeout=20, what="the new owner orphaned m2")
            victim.resume()
            outcomes = await asyncio.gather(m1, m2, return_exceptions=True)
            print(f"m1, m2: {outcomes!r}")
            committed = True
            try:
                await txn.commit()
            except (TransactionFailed, ServerError, Timeout) as e:
                print(f"not committed: {e!r}")
                committed = False
            await (await other.create_producer(topic)).send(b"end", key="k")
            got: list[bytes] = []
            while not got or got[-1] != b"end":
                got.append((await check.receive(timeout_s=20)).value)
    sent = [b"m0", *(v for v, o in zip((b"m1", b"m2"), outcomes, strict=True)
                     if not isinstance(o, BaseException))]  # fmt: skip
    if committed:  # every acknowledged send of a committed transaction is delivered
        assert got == [*sent, b"end"]
    assert isinstance(outcomes[1], ServerError), outcomes  # m2 is refused...
    assert not committed  # ...so the transaction cannot commit
    assert got == [b"end"]


# ---------------------------------------------------------------------- in one process


async def test_a_broker_whose_session_lapsed_keeps_its_topics_and_their_clients(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path
) -> None:
    """Its session cannot be refreshed for a TTL (the store unreachable for it) and nobody
    takes its id or its topics meanwhile: it is fenced (no receipt, no new client) until it
    has registered again, then it keeps the topic loaded and its consumer connected, and
    the producer's send is acknowledged once it is back (sent again, stored once)."""
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    settings = BrokerSettings(
        broker_id="x1",
        advertise_url=f"http://127.0.0.1:{listener.port}",
        ledger_url=f"file://{tmp_path / 'x1'}",
        session_ttl_s=1.0,
    )
    server = BrokerServer(settings, store=store, listener=listener)
    await server.start()
    service = server.service
    topic = "persistent://acme/fence/lapsed"
    try:
        async with Client(settings.advertise_url) as client:
            await client.admin.create_topic(topic)
            producer = await client.create_producer(topic, send_timeout_s=30)
            consumer = await client.subscribe(topic, "s", initial_position="earliest")
            await producer.send(b"before")
            assert (await consumer.receive(timeout_s=10)).value == b"before"
            loaded = service.topics[TopicName.parse(topic)]

            faults.fail("lease_keepalive", times=None)  # no session can be held: fenced
            faults.fail("lease_grant", times=None)
            await wait_until(lambda: fencing.why(service) is not None, what="fenced")
            with pytest.raises(Timeout) as refused:  # no new client meanwhile (its lookup
                await client.create_producer(topic, timeout_s=1)  # says its broker is down)
            assert "ServiceNotReady" in str(refused.value)
            during = await producer.send_async(b"during")  # stored, but not acknowledged yet
            assert (await consumer.receive(timeout_s=10)).value == b"during"
            await wait_until(lambda: not loaded.producers, what="the producer hung up on")
            assert not during.done()
            faults.clear()  # the store answers again
            await during  # sent again, acknowledged once
            await wait_until(lambda: fencing.why(service) is None, what="registered again")
            assert service.topics[TopicName.parse(topic)] is loaded  # kept, not let go
            await producer.send(b"after")
            assert (await consumer.receive(timeout_s=10)).value == b"after"  # "during" once
    finally:
        await server.stop()


async def test_a_topic_let_go_once_registered_again_is_not_loaded_beside_the_closing_one(
    store: MetadataStore,
    faults: FaultInjector,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Registered again, the broker lets go of a topic whose ledger another process opened
    meanwhile (fencing.revalidate). Its consumer, hung up on, reconnects at once: while the
    old instance is still closing the broker is still fenced, so the consumer (and any
    client) is told to retry rather than load a second instance beside the closing one
    (whose ledger file's lock would refuse it); once it is closed, the topic loads again."""
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    settings = BrokerSettings(
        broker_id="x1",
        advertise_url=f"http://127.0.0.1:{listener.port}",
        ledger_url=f"file://{tmp_path / 'x1'}",
        session_ttl_s=1.0,
    )
    server = BrokerServer(settings, store=store, listener=listener)
    await server.start()
    service = server.service
    topic = "persistent://acme/fence/let-go"
    name = TopicName.parse(topic)
    try:
        async with Client(settings.advertise_url) as client:
            await client.admin.create_topic(topic)
            producer = await client.create_producer(topic)
            await producer.send(b"m0")
            await producer.close()
            consumer = await client.subscribe(topic, "s", initial_position="earliest")
            assert (await consumer.receive(timeout_s=10)).value == b"m0"
            old = service.topics[name]

            faults.fail("lease_keepalive", times=None)  # no session can be held: fenced
            faults.fail("lease_grant", times=None)
            await wait_until(lambda: fencing.why(service) is not None, what="fenced")
            record = await store.get(metadata_key(topic))  # as another process's open does
            assert record is not None
            await store.put(metadata_key(topic), record.value)
            faults.clear()  # the store answers again: it registers, then lets the topic go
            closing = faults.hold("txn", key_prefix=DEDUP_PREFIX, before=True)
            subscribing: asyncio.Task[Consumer] | None = None
            try:
                with caplog.at_level(logging.DEBUG):
                    await closing.wait_for(1, timeout_s=20)  # the old instance is closing
                    assert name not in service.topics and fencing.why(service) is not None
                    subscribing = asyncio.create_task(
                        client.subscribe(topic, "s2", initial_position="earliest", timeout_s=20)
                    )
                    await wait_until(
                        lambda: any(
                            "cannot prove it holds its id" in r.getMessage()
                            for r in caplog.records
                            if r.getMessage().endswith("trying again")
                        ),
                        what="a client told to retry",
                    )
                    assert name not in service.topics and not service.is_loading(name)
                    closing.release()
                    late = await subscribing
                    assert (await late.receive(timeout_s=10)).value == b"m0"
            finally:
                closing.release()
                await asyncio.gather(
                    *([subscribing] if subscribing else []), return_exceptions=True
                )
            assert service.topics[name] is not old and old.leaving
            assert fencing.why(service) is None
        said = [r.getMessage() for r in caplog.records]
        assert any("letting go of it" in m and "opened by another process" in m for m in said)
        assert not [m for m in said if "another writer" in m], said
    finally:
        await server.stop()
