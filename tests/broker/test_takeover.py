"""Issue 17 with real broker processes on etcd, ledgers replicated 3/2: a broker killed or
paused past its session loses its topics to a live broker, and nothing acknowledged is lost.

Before replication, after a SIGKILL no other broker ever took the dead broker's topics
(lookups named no owner until it returned), and a broker paused past its session and
resumed accepted appends at once.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from segtxn.client import Client
from segtxn.client.errors import Timeout
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName
from tests import processes
from tests.processes import ServerProcess

TTL = 2.0
"""The brokers' session TTL: how long a dead broker stays registered."""


@pytest.fixture
def cluster_store(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/takeover-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def by_key_of(sent: list[tuple[str, bytes]]) -> dict[str, list[bytes]]:
    """What was sent, per key, in order."""
    out: dict[str, list[bytes]] = {}
    for key, value in sent:
        out.setdefault(key, []).append(value)
    return out


async def by_key(client: Client, topic: str, count: int) -> dict[str, list[bytes]]:
    """The first ``count`` messages of ``topic`` (a new subscription), per key, in order."""
    consumer = await client.subscribe(topic, "check", initial_position="earliest")
    got: dict[str, list[bytes]] = {}
    for _ in range(count):
        message = await consumer.receive(timeout_s=20)
        assert message.key is not None
        got.setdefault(message.key, []).append(message.value)
        await consumer.acknowledge(message)
    return got


async def owner_of(url: str, topic: str) -> str:
    async with Client(url) as client:
        return await client.connector.broker_for(TopicName.parse(topic))


@pytest.mark.slow
async def test_a_killed_brokers_topic_is_served_by_another_with_every_acknowledged_message(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    brokers = await processes.replicated_brokers(cluster_store, tmp_path, started, session_ttl=TTL)
    topic = "persistent://acme/ha/orders"
    sent = [f"order-{i}".encode() for i in range(50)]
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        for payload in sent:  # each acknowledged before the next
            await producer.send(payload)
    owner = await owner_of(brokers[0].url, topic)
    victim = next(b for b in brokers if b.url == owner)
    survivor = next(b for b in brokers if b is not victim)

    victim.kill()
    killed = time.monotonic()
    async with Client(survivor.url) as client:
        consumer = await client.subscribe(
            topic, "check", initial_position="earliest", timeout_s=6 * TTL + 20
        )
        got = [(await consumer.receive(timeout_s=10)).value for _ in sent]
        took = time.monotonic() - killed
        assert got == sent
        new_owner = await client.connector.broker_for(TopicName.parse(topic))
        assert new_owner != victim.url
        producer = await client.create_producer(topic)
        await producer.send(b"after the take-over")
        assert (await consumer.receive(timeout_s=10)).value == b"after the take-over"
    print(f"served again {took:.1f} s after the SIGKILL (session TTL {TTL:g} s)")
    assert took < 6 * TTL + 20


@pytest.mark.slow
async def test_a_paused_broker_is_fenced_when_it_resumes_after_a_take_over(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """SIGSTOP the owner past its session; another broker takes the topic over; SIGCONT:
    the old owner appends nothing more, unloads the topic, and every acknowledged message
    is in the topic once."""
    brokers = await processes.replicated_brokers(cluster_store, tmp_path, started, session_ttl=TTL)
    topic = "persistent://acme/ha/paused"
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic)
    victim_url = await owner_of(brokers[0].url, topic)
    victim = next(b for b in brokers if b.url == victim_url)
    survivor = next(b for b in brokers if b is not victim)
    acknowledged: list[bytes] = []
    async with Client(victim.url) as old_client:
        old_producer = await old_client.create_producer(topic, send_timeout_s=6 * TTL + 20)
        for i in range(10):
            await old_producer.send(f"before-{i}".encode())
            acknowledged.append(f"before-{i}".encode())

        victim.pause()
        # its lookup names the paused owner until the session expires, and a handshake
        # with a paused process hangs: each attempt is given up after request_timeout_s
        # (10 s by default) and tried again; 2 s is past any answer of a live broker here
        async with Client(survivor.url, request_timeout_s=2.0) as client:
            producer = await client.create_producer(topic, timeout_s=6 * TTL + 20)
            for i in range(10):
                await producer.send(f"taken-{i}".encode())
                acknowledged.append(f"taken-{i}".encode())
        victim.resume()

        # the old owner's producer: its send lands once, on the new owner, or fails
        try:
            await old_producer.send(b"late")
            acknowledged.append(b"late")
        except (ServerError, Timeout) as e:
            print(f"the old owner's producer was refused: {e!r}")

    async with Client(survivor.url) as client:
        await (await client.create_producer(topic)).send(b"end")
        consumer = await client.subscribe(topic, "check", initial_position="earliest")
        got: list[bytes] = []
        while not got or got[-1] != b"end":
            got.append((await consumer.receive(timeout_s=10)).value)
        got.pop()
        assert len(set(got)) == len(got)  # nothing twice
        assert set(acknowledged) <= set(got) <= {*acknowledged, b"late"}
        assert await owner_of(survivor.url, topic) != victim.url
    # It learned it was replaced from the fence, when it registered again, or from its
    # rollover's create refused by a replica that already holds the new owner's ledger.
    log = victim.log_text()
    assert (
        "is fenced" in log
        or "while this one was away" in log
        or ("already has entries" in log and "unloading it" in log)
    ), log[-3000:]


@pytest.mark.slow
async def test_a_broker_restarted_on_an_empty_disk_loses_nothing_acknowledged(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """Without replication the restarted broker refused its segments (and before that,
    served them as empty). Now it is a new storage instance, and its segments are served
    from the replicas on the other brokers, every key in order."""
    brokers = await processes.replicated_brokers(cluster_store, tmp_path, started, session_ttl=TTL)
    topic = "topic://acme/ha/keyed"
    sent = [(f"k{i % 7}", f"{i}".encode()) for i in range(120)]
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic, segments=6)
        producer = await client.create_producer(topic)
        for key, payload in sent:
            await producer.send(payload, key=key)
    victim = brokers[1]
    victim.kill()
    shutil.rmtree(tmp_path / "b1")
    victim.start()
    await victim.ready()

    async with Client(victim.url) as client:
        assert await by_key(client, topic, len(sent)) == by_key_of(sent)


@pytest.mark.slow
async def test_without_a_quorum_a_send_is_refused_as_retriable_and_works_once_it_is_back(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """Both other brokers die: the owner cannot get an entry acknowledged by two. The
    producer is told to try again (ServiceNotReady), not left hanging and not told the
    data is damaged; once one of them is back, the topic is reopened and sends work."""
    brokers = await processes.replicated_brokers(cluster_store, tmp_path, started, session_ttl=TTL)
    topic = "persistent://acme/ha/quorum"
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic)
        owner = await client.connector.broker_for(TopicName.parse(topic))
        others = [b for b in brokers if b.url != owner]
        producer = await client.create_producer(topic, send_timeout_s=4 * TTL)
        await producer.send(b"before")
        for broker in others:
            broker.kill()
        # refused (ServiceNotReady), or, when the refusal races the hang-up, retried by the
        # producer until its send timeout, which then names why
        with pytest.raises((ServerError, Timeout)) as refused:
            await producer.send(b"no quorum")
        if isinstance(refused.value, ServerError):
            assert refused.value.name is ErrorName.SERVICE_NOT_READY
        assert "replicas" in str(refused.value) or "storage nodes" in str(refused.value)
        others[0].start()
        await others[0].ready()
        producer = await client.create_producer(topic, send_timeout_s=30, timeout_s=30)
        await producer.send(b"after")
        consumer = await client.subscribe(topic, "check", initial_position="earliest")
        got = [(await consumer.receive(timeout_s=10)).value for _ in range(2)]
        if got[1] == b"no quorum":  # it may have been stored: its outcome was unknown
            got.append((await consumer.receive(timeout_s=10)).value)
            assert got == [b"before", b"no quorum", b"after"]
        else:
            assert got == [b"before", b"after"]


@pytest.mark.slow
async def test_a_drained_broker_hands_its_segments_over_while_producers_go_on(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """Drain (for a rolling restart or a scale-down): the broker's segments move to the
    others while a producer sends; no send fails, nothing is lost or reordered per key,
    and nothing new is placed on it until it is undrained."""
    brokers = await processes.replicated_brokers(cluster_store, tmp_path, started, session_ttl=TTL)
    topic = "topic://acme/ha/drained"
    acknowledged: list[tuple[str, bytes]] = []
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic, segments=6)
        homes = {b: await client.admin.broker_homes(f"b{i}") for i, b in enumerate(brokers)}
        victim = max(brokers, key=lambda b: len(homes[b].homes))
        victim_id = f"b{brokers.index(victim)}"
        producer = await client.create_producer(topic, send_timeout_s=30)
        slowest = 0.0

        async def send(i: int) -> None:
            nonlocal slowest
            key, value = f"k{i % 9}", f"{i}".encode()
            started_at = time.monotonic()
            await producer.send(value, key=key)
            slowest = max(slowest, time.monotonic() - started_at)
            acknowledged.append((key, value))

        for i in range(100):
            await send(i)
        draining = asyncio.create_task(client.admin.drain_broker(victim_id, timeout_s=60))
        i = 100
        while not draining.done():
            await send(i)
            i += 1
        result = await draining
        for j in range(i, i + 50):
            await send(j)
        print(f"drained {victim_id}: {len(result['moved'])} moved; slowest send {slowest:.2f} s")
        assert sorted(result["moved"]) == sorted(homes[victim].homes) and not result["failed"]
        assert (await client.admin.broker_homes(victim_id)).empty

        await client.admin.create_topic("topic://acme/ha/after", segments=6)
        assert (await client.admin.broker_homes(victim_id)).empty  # nothing new lands there
        await client.admin.undrain_broker(victim_id)
        await client.admin.create_topic("topic://acme/ha/undrained", segments=6)
        assert not (await client.admin.broker_homes(victim_id)).empty

        assert await by_key(client, topic, len(acknowledged)) == by_key_of(acknowledged)


@pytest.mark.slow
async def test_draining_needs_replication(
    tmp_path: Path, cluster_store: str, started: list[ServerProcess]
) -> None:
    broker = processes.broker(cluster_store, tmp_path / "solo", "solo")
    started.append(broker)
    broker.start()
    await broker.ready()
    async with Client(broker.url) as client:
        with pytest.raises(ServerError) as refused:
            await client.admin.drain_broker("solo")
        assert refused.value.name is ErrorName.NOT_ALLOWED
        assert "cannot move" in refused.value.message
        with pytest.raises(ServerError) as unknown:
            await client.admin.drain_broker("nobody")
        assert unknown.value.name is ErrorName.INVALID_ARGUMENT
        assert unknown.value.message == "no broker nobody is registered (registered: solo)"


@pytest.mark.slow
async def test_a_drain_leaves_a_topic_written_before_replication_where_it_is(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """Its ledger is on its broker's disk alone: moved, its new home would refuse it
    (PersistenceError) and turn not ready. The drain names it under `failed` instead."""
    before = processes.broker(cluster_store, tmp_path / "b0", "b0", session_ttl=TTL)
    started.append(before)
    before.start()
    await before.ready()
    topic = "persistent://acme/ha/local"
    async with Client(before.url) as client:
        await client.admin.create_topic(topic)
        await (await client.create_producer(topic)).send(b"on b0's disk")
    before.stop()
    brokers = await processes.replicated_brokers(
        cluster_store, tmp_path, started, session_ttl=TTL
    )  # b0 again, replicated
    async with Client(brokers[0].url) as client:
        result = await client.admin.drain_broker("b0")
        assert result["moved"] == []
        assert "written before replication" in result["failed"][topic]
        assert (await client.admin.broker_homes("b0")).homes == [topic]
        await client.admin.undrain_broker("b0")
        consumer = await client.subscribe(topic, "check", initial_position="earliest")
        assert (await consumer.receive(timeout_s=10)).value == b"on b0's disk"
