"""Brokers as real processes on a shared etcd: SIGKILL and restart, lookups and redirects."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import uuid
from pathlib import Path

import pytest

from segtxn.client import Client, MessageId
from segtxn.metastore.etcd_server import EtcdServer
from tests import processes
from tests.processes import ServerProcess
from tests.waiting import wait_until

SEGTXN = str(Path(sys.executable).with_name("segtxn"))


@pytest.fixture
def cluster_store(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/procs-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@pytest.mark.slow
async def test_sigkilled_broker_loses_no_acknowledged_message(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    seed = random.randrange(2**32)
    print(f"broker crash seed {seed}")
    rng = random.Random(seed)
    # restarted after a SIGKILL, it waits for its old session to expire before it serves:
    # a 2 s session, not the 10 s default (what is tested is what the restart keeps)
    broker = processes.broker(cluster_store, tmp_path / "b1", "b1", session_ttl=2)
    started.append(broker)
    broker.start()
    await broker.ready()
    topic = "persistent://acme/crash/events"
    acked: dict[int, MessageId] = {}
    async with Client(broker.url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic, name="crash-producer")
        total = 3000
        kill_after = rng.randint(200, 2000)

        async def send(i: int) -> None:
            acked[i] = await producer.send(f"m{i}".encode())

        sends = []
        for i in range(total):
            sends.append(asyncio.create_task(send(i)))
            if i == kill_after:
                await wait_until(lambda: len(acked) > kill_after // 2, what="some acks")
                broker.kill()  # mid-stream: appends in flight, acks in flight
                broker.start()  # same id, same data dir, same port
        await asyncio.wait_for(asyncio.gather(*sends), 60)
        assert producer.reconnects >= 1  # type: ignore[union-attr]
        consumer = await client.subscribe(topic, "check", initial_position="earliest")
        seen: dict[bytes, MessageId] = {}
        for _ in range(total):
            message = await consumer.receive(timeout_s=30)
            assert message.value not in seen, f"{message.value!r} stored twice"
            seen[message.value] = message.message_id
    missing = [i for i in acked if f"m{i}".encode() not in seen]
    assert not missing, f"acknowledged but lost: {missing[:10]}"
    assert all(seen[f"m{i}".encode()] == acked[i] for i in acked)  # the ids they were told


@pytest.mark.slow
async def test_two_brokers_share_a_store_and_redirect(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    a = processes.broker(cluster_store, tmp_path / "a", "a")
    b = processes.broker(cluster_store, tmp_path / "b", "b")
    started += [a, b]
    a.start()
    b.start()
    await asyncio.gather(a.ready(), b.ready())
    topics = [f"persistent://acme/two/t{i}" for i in range(6)]
    async with Client(a.url) as via_a, Client(b.url) as via_b:
        for topic in topics:
            await via_a.admin.create_topic(topic)
        homes = {t: (await via_a.connector.lookup(_name(t)))["brokerUrl"] for t in topics}
        assert set(homes.values()) == {a.url, b.url}  # placed on both
        for topic in topics:  # every topic through broker a only: redirects are followed
            producer = await via_a.create_producer(topic)
            await producer.send(topic.encode())
            consumer = await via_b.subscribe(topic, "s", initial_position="earliest")
            message = await consumer.receive(timeout_s=10)
            assert message.value == topic.encode()
        stats = await via_a.admin.stats(topics[1])  # admin calls are redirected too
        assert stats["msgInCounter"] == 1
        scalable = "topic://acme/two/scaled"
        await via_b.admin.create_topic(scalable, segments=4)
        layout = await via_a.connector.lookup(_name(scalable))
        assert {s["brokerUrl"] for s in layout["segments"]} == {a.url, b.url}
        producer = await via_a.create_producer(scalable)
        for i in range(40):
            await producer.send(b"x", key=f"k{i}")
        total = await via_b.admin.stats(scalable)
        assert sum(s["stats"]["msgInCounter"] for s in total["segments"]) == 40

        b.kill()  # b's topics are unavailable while b is down, and say so
        with pytest.raises(Exception) as down:
            await via_a.admin.stats(next(t for t, url in homes.items() if url == b.url))
        assert "ServiceNotReady" in str(down.value) or "NotOwner" in str(down.value)


def _name(topic: str):  # type: ignore[no-untyped-def]
    from segtxn.protocol.names import TopicName

    return TopicName.parse(topic)


async def test_an_ack_in_flight_while_its_broker_restarts_is_sent_again(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """A broker SIGKILLed with an acknowledgment written and unanswered, and restarted at
    once: the ack is not failed while the broker is away for less than the client's
    ``request_timeout_s`` (ConnectionLost waits that long), it is sent again and applied.
    Failing it at the first refused reconnect doomed every transaction with an ack in
    flight during a broker's restart."""
    broker = processes.broker(cluster_store, tmp_path / "b1", "b1", session_ttl=2)
    started.append(broker)
    broker.start()
    await broker.ready()
    topic = "persistent://acme/crash/acked"
    async with Client(broker.url) as client:
        await client.admin.create_topic(topic)
        await client.admin.create_subscription(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic)
        for value in (b"a", b"b"):
            await producer.send(value)
        consumer = await client.subscribe(topic, "s")
        first = await consumer.receive(timeout_s=10)
        stream = consumer._streams[topic]
        broker.pause()  # the ack is written and never answered
        ack = asyncio.ensure_future(consumer.acknowledge(first, timeout_s=60))
        await wait_until(
            lambda: bool(stream._acks._in_flight) and not stream._writing.locked(),
            what="the ack written",
        )
        broker.kill()
        broker.start()  # same id, same data dir, same port
        await asyncio.wait_for(ack, 60)  # sent again on the new connection, applied
        assert stream.reconnects >= 1
        await consumer.close()
        again = await client.subscribe(topic, "s")
        assert (await again.receive(timeout_s=30)).value == b"b"  # "a" acknowledged
