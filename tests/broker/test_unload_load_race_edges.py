"""An unload racing a load of the same topic (segtxn/broker/service.py, ``unload``): the
unload wins. A load asked for while the topic is being unloaded is refused with a retriable
answer that says so, and a load already in flight when the unload began is let go rather
than served after the unload finished; the client's retry then loads the topic afresh.

Real components: a broker and coordinator on the cluster's store (memory and a real etcd),
files in ``tmp_path``; the races are made with the store's fault holds, never with sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from segtxn.broker import handoff
from segtxn.broker.dedup_snapshots import PREFIX as DEDUP_PREFIX
from segtxn.client import Client, Consumer
from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore.fault_holds import Hold
from segtxn.protocol.names import TopicName
from tests.broker.test_disk_full import FullDisk
from tests.cluster import Cluster, create_and_send
from tests.waiting import ContendedLock, wait_until

TOPIC = "persistent://acme/unload/raced"


def _load_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(f"loading {TOPIC}")]


def _retried(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the client was told each time it tried again."""
    return [r.getMessage() for r in caplog.records if r.getMessage().endswith("trying again")]


# ---------------------------------------------------------------------------------------
# 1. A client arriving while an idle unload is closing the topic: its load began beside
#    the closing instance, and only the ledger file's lock refused it ("... is held by
#    another writer", logged at ERROR as a failed load): an ordinary race, reported as a
#    broken ledger, and the second instance was opened before the first was closed.


async def test_a_client_arriving_during_an_idle_unload_is_told_to_retry_and_gets_in(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await producer.close()
        await client.admin.terminate(TOPIC)  # sealed, and nobody on it: idle
        old = service.topics[name]
        await handoff.unload_idle(service, 0.0)

        closing = cluster.faults.hold("txn", key_prefix=DEDUP_PREFIX, before=True)
        unloading = asyncio.create_task(
            handoff.unload_idle(service, service.settings.unload_idle_s)
        )
        subscribing = asyncio.create_task(_subscribe_once(closing, client))
        try:
            with caplog.at_level(logging.DEBUG):
                await wait_until(lambda: bool(_retried(caplog)), what="the client told to retry")
                assert "being unloaded" in _retried(caplog)[0], _retried(caplog)
                assert not service.is_loading(name) and name not in service.topics
                closing.release()
                await unloading
                consumer = await subscribing
                assert (await consumer.receive(timeout_s=10)).value == b"m0"
        finally:
            closing.release()
            await asyncio.gather(unloading, subscribing, return_exceptions=True)
        assert service.topics[name] is not old
        assert _load_failures(caplog) == [], [r.getMessage() for r in _load_failures(caplog)]
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def _subscribe_once(closing: Hold, client: Client) -> Consumer:
    """Subscribe to ``TOPIC`` once the old instance's close is held at its last
    de-duplication snapshot (it is out of the broker's topics, and not closed yet)."""
    await closing.wait_for(1)
    return await client.subscribe(TOPIC, "s", initial_position="earliest", timeout_s=20)


# ---------------------------------------------------------------------------------------
# 2. An unload while the topic was loading found nothing in the broker's topics and
#    returned at once; the load then ended and the topic was served, after the unload
#    that meant to let it go.


async def test_an_unload_lets_go_of_a_load_in_flight_and_the_client_gets_in_afterwards(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await producer.close()
        await service.unload(name)
        assert name not in service.topics

        # the first load (the client's first try) and the second (its retry) wait here
        loads = cluster.faults.hold("range", key_prefix=metadata_key(TOPIC), times=2)
        subscribing = asyncio.create_task(
            client.subscribe(TOPIC, "s", initial_position="earliest", timeout_s=20)
        )
        try:
            with caplog.at_level(logging.DEBUG):
                await loads.wait_for(1)
                assert service.is_loading(name)
                unloading = asyncio.create_task(service.unload(name))
                await wait_until(lambda: service.is_unloading(name), what="the unload begun")
                loads.release(0)
                await unloading
                await wait_until(lambda: not service.is_loading(name), what="the load ended")
                assert name not in service.topics, "the load in flight was served after the unload"

                await loads.wait_for(2)  # the client, told to retry, loads it afresh
                loads.release(1)
                consumer = await subscribing
                assert (await consumer.receive(timeout_s=10)).value == b"m0"
        finally:
            loads.release()
            await asyncio.gather(subscribing, return_exceptions=True)
        assert "unloaded" in _retried(caplog)[0], _retried(caplog)


# ---------------------------------------------------------------------------------------
# 3. A topic whose ledger stopped taking appends for a retriable reason (here a full disk)
#    is dropped in the background (handoff.write_failed). The drop did not go through the
#    unload guard: a client arriving while the old instance was still closing loaded a
#    second one beside it, refused by the ledger file's lock ("... is held by another
#    writer", an ERROR).


async def test_a_client_arriving_while_a_topic_is_dropped_after_a_failed_write_retries(
    cluster: Cluster,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    disk = FullDisk(tmp_path / "ledgers", "append", monkeypatch)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC, send_timeout_s=30)
        await producer.send(b"m0")
        old = service.topics[name]
        closing = cluster.faults.hold("txn", key_prefix=DEDUP_PREFIX, before=True)
        disk.full = True
        sending = asyncio.create_task(producer.send(b"m1"))
        subscribing: asyncio.Task[Consumer] | None = None
        try:
            with caplog.at_level(logging.DEBUG):
                await closing.wait_for(1)  # the old instance is closing, out of the topics
                assert disk.refused and name not in service.topics
                disk.full = False
                subscribing = asyncio.create_task(
                    client.subscribe(TOPIC, "s", initial_position="earliest", timeout_s=20)
                )
                await wait_until(lambda: bool(_retried(caplog)), what="a client told to retry")
                assert "being unloaded" in _retried(caplog)[0], _retried(caplog)
                assert name not in service.topics and not service.is_loading(name)
                closing.release()
                consumer = await subscribing
                await sending  # the producer resends it to the instance loaded again
                got = [(await consumer.receive(timeout_s=10)).value for _ in range(2)]
                assert got == [b"m0", b"m1"], got
        finally:
            closing.release()
            disk.full = False
            await asyncio.gather(
                sending, *([subscribing] if subscribing else []), return_exceptions=True
            )
        assert service.topics[name] is not old
        assert _load_failures(caplog) == [], [r.getMessage() for r in _load_failures(caplog)]
        assert not [r.getMessage() for r in caplog.records if "another writer" in r.getMessage()]


# ---------------------------------------------------------------------------------------
# 4. A consumer whose connection got the topic from serve() just before an unload: its
#    subscription's cursor was being made when the unload closed the topic, and it was
#    attached to the closed instance all the same (told ConsumerReady, then sent nothing).
#    (The unload's close now waits for the load, which lets go of the subscription.)


async def test_a_consumer_attaching_while_the_topic_is_unloaded_is_told_to_retry(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await producer.close()
        old = service.topics[name]
        lock = ContendedLock()
        monkeypatch.setattr(old.registry, "_lock", lock)

        making = cluster.faults.hold("txn", key_prefix=cursors_prefix(TOPIC))
        subscribing = asyncio.create_task(
            client.subscribe(TOPIC, "s", initial_position="earliest", timeout_s=20)
        )
        unloading: asyncio.Task[None] | None = None
        try:
            with caplog.at_level(logging.DEBUG):
                await making.wait_for(1)  # the old instance is making the subscription
                unloading = asyncio.create_task(service.unload(name))
                await asyncio.wait_for(lock.contended.wait(), 10)  # its close waits for it
                making.release()
                await unloading
                consumer = await subscribing
                assert (await consumer.receive(timeout_s=10)).value == b"m0"
        finally:
            making.release()
            await asyncio.gather(
                subscribing, *([unloading] if unloading else []), return_exceptions=True
            )
        new = service.topics[name]
        assert new is not old and new.subscriptions["s"].consumers
        assert "s" not in old.subscriptions or not old.subscriptions["s"].consumers
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
