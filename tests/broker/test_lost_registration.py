"""A broker that lost its registration while clients were connected to it: real broker
processes on etcd, 2 s sessions, paused (SIGSTOP) past their session and resumed.

The question: can a producer connected to the paused broker get receipts for messages that
are lost, or can two processes serve one topic at once? What the experiment found before
the broker fenced itself (segtxn/broker/fencing.py):

- **A paused owner, its topics taken over, plain messages** (replicated 3/2): nothing
  acknowledged is lost. The new owner's recovery fences the old owner's replicas, so its
  late appends fail and it unloads the topic; its producers resend to the new owner and
  de-duplication keeps one copy.
- **The same, a transaction**: lost. The paused owner had appended ``m2`` (on two replicas)
  but not yet written the transaction's writes record covering it; the new owner's recovery
  took ``m2`` for an orphan (``1:2 of ... is not covered by its writes record``); the old
  owner resumed, wrote the record (the header was still OPEN) and sent the receipt, and the
  transaction COMMITTED with ``m2`` acknowledged and never delivered. Op records were
  fenced by the header only, not by the segment's ownership.
- **A duplicate with the paused broker's id** (another data directory, registered while it
  was paused): the resumed broker, not registered, still loaded the topic for a client its
  stale lookup sent to it, recovering the ledger and fencing the duplicate's: the two took
  the topic from each other, and the duplicate's producer was refused (``ServiceNotReady``,
  ``ledger 2 ... was recovered by another owner``) for what the old one did. A consumer
  left on the old broker got nothing more for as long as the duplicate held the id.

Scenario (1), a broker paused past its session with nobody taking its id, is here too, with
and without replication: without it nobody can take its topics (their ledgers are on its
disk), and it serves them again when it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest

from segtxn.client import (
    Client,
    Consumer,
    Producer,
    ScalableProducer,
    ServerError,
    TransactionFailed,
)
from segtxn.client.errors import Timeout
from segtxn.ledger.metadata import LedgerMetadata, metadata_key
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import Catalog
from tests import processes
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
    being the owner); the rightful owner's producer is never refused because of the old one.
    """
    brokers = brokers_of(cluster_store, tmp_path, replicated=replicated)
    await start_all(started, *brokers)
    topic = "persistent://acme/fence/orders"
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic)
    victim_url = await owner_of(brokers[0].url, topic)
    index = next(i for i, b in enumerate(brokers) if b.url == victim_url)
    victim, victim_id = brokers[index], f"b{index}"
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


@pytest.mark.slow
async def test_a_resumed_owner_cannot_commit_what_the_new_owner_took_for_an_orphan(
    own_etcd: EtcdServer, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """A transactional send is an append, then a rewrite of the transaction's writes record
    covering it. The owner is paused between the two: etcd is paused for a moment so that
    the record covering ``m1`` is in flight when ``m2`` is appended (``m2`` waits for the
    next rewrite), and the owner is paused once a replica holds ``m2``. Its session expires;
    a client of another broker has the segment taken over, whose recovery finds ``m2``
    outside the writes record: an orphan, never shown. Then the owner resumes.

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

        own_etcd.process.send_signal(signal.SIGSTOP)
        try:
            m1 = await producer.send_async(b"m1", key="k", txn=txn)
            await wait_until(lambda: on_replica(held + 1), timeout=2, what="m1 on a replica")
            m2 = await producer.send_async(b"m2", key="k", txn=txn)
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
