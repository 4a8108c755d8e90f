"""Placements and unloads at their edges: a split's child placed by a controller that
paused while its topic was deleted; a topic unloaded from its broker while clients are
connected to it. Real brokers on the cluster's store (memory and real etcd); each test
failed before its fix."""

from __future__ import annotations

import asyncio
from pathlib import Path

from segtxn.broker.controllers import HttpSegmentOps
from segtxn.broker.fanout import HTTP
from segtxn.client import Client
from segtxn.protocol.names import TopicName
from segtxn.topics.controller import Controller
from tests.broker.test_topic_state_edges import PausedAfterHomeCheck, start_second_broker
from tests.cluster import Cluster
from tests.waiting import wait_until

# ---------------------------------------------------------------------- 1

DELETED = "topic://acme/review/deleted"


async def test_a_controller_paused_before_placing_never_places_a_child_of_a_deleted_topic(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Controller A plans a split, finds the children without a home and stalls before
    writing them. The topic is deleted meanwhile (its deletion finds no home of the
    children, and deletes the record). A resumes: it must write no home, since nothing
    would ever delete it. It did (a write created only if absent, with no check of the
    topic): a home of a topic that does not exist, counted as the broker's load and listed
    by a drain; and the topic created again under the name, its split kept that home for
    its child, on a broker that had gone meanwhile: the split failed, ServiceNotReady, for
    ever."""
    name = TopicName.parse(DELETED)
    children = [name.segment_name(1), name.segment_name(2)]
    service = cluster.broker.service
    async with Client(cluster.url) as client:
        await client.admin.create_topic(DELETED, segments=1)  # segment 0 on b1
        paused = PausedAfterHomeCheck(service.catalog)
        b2 = await start_second_broker(cluster, tmp_path)
        stopped = False
        try:
            ops = HttpSegmentOps(service.catalog, cluster.broker.app[HTTP])
            a = asyncio.create_task(Controller(service.store, paused, ops).split(name, 0))
            await paused.checked.wait()
            await client.admin.delete_topic(DELETED, force=True)
            assert await service.catalog.get(name) is None
            paused.resume.set()
            (outcome,) = await asyncio.gather(a, return_exceptions=True)
            assert [await service.catalog.home_of(c) for c in children] == [None, None]
            assert isinstance(outcome, KeyError), outcome  # no such topic (any more)

            await b2.stop()  # its homes' broker gone: a child placed there is unavailable
            stopped = True
            await wait_until(lambda: _unregistered(cluster, "b2"), what="b2's registration gone")
            await client.admin.create_topic(DELETED, segments=1)
            await client.admin.split(DELETED, 0)
            assert [await service.catalog.home_of(c) for c in children] == ["b1", "b1"]
            producer = await client.create_producer(DELETED)
            for i in range(4):
                await producer.send(f"m{i}".encode(), key=f"k{i}")
            await producer.close()
            consumer = await client.subscribe(DELETED, "s", initial_position="earliest")
            got = {(await consumer.receive(timeout_s=10)).value for _ in range(4)}
            assert got == {f"m{i}".encode() for i in range(4)}
            await consumer.close()
        finally:
            paused.resume.set()
            if not stopped:
                await b2.stop()


async def _unregistered(cluster: Cluster, broker_id: str) -> bool:
    return await cluster.broker.service.catalog.broker_url(broker_id) is None


# ---------------------------------------------------------------------- 2

UNLOADED = "persistent://acme/review/unloaded"


async def test_a_topic_unloaded_with_clients_hangs_up_on_them_and_they_go_on(
    cluster: Cluster,
) -> None:
    """A topic unloaded from its broker while a producer and a consumer are connected to
    it: they are hung up on, reconnect (the topic is loaded again) and go on, nothing lost.
    Before, the unload only closed the topic: its clients kept their links to the closed
    one, the producer's sends refused, the consumer never given another message."""
    name = TopicName.parse(UNLOADED)
    service = cluster.broker.service
    async with Client(cluster.url) as client:
        await client.admin.create_topic(UNLOADED)
        consumer = await client.subscribe(UNLOADED, "s", initial_position="earliest")
        producer = await client.create_producer(UNLOADED, send_timeout_s=10)
        await producer.send(b"before")
        first = await consumer.receive(timeout_s=10)
        assert first.value == b"before"
        await consumer.acknowledge(first)
        old = service.topics[name]

        await service.unload(name)
        assert not old.busy()  # nobody left on the closed one
        await producer.send(b"after")
        got = await consumer.receive(timeout_s=10)
        assert got.value == b"after"
        await consumer.acknowledge(got)
        assert service.topics[name] is not old and service.topics[name].busy()
        await producer.close()
        await consumer.close()


async def test_a_reader_of_an_unloaded_topic_is_hung_up_on_and_reads_on(
    cluster: Cluster,
) -> None:
    """A reader is a client of the topic too: unloaded (by a drain, a write failure,
    :meth:`BrokerService.unload`), it must be hung up on, reconnect and read on from
    where it was. Before, only producers and consumers were: the reader's delivery stopped
    at the closed ledger and its connection stayed open, silent for ever."""
    name = TopicName.parse(UNLOADED)
    service = cluster.broker.service
    async with Client(cluster.url) as client:
        await client.admin.create_topic(UNLOADED)
        reader = await client.create_reader(UNLOADED, start="earliest")
        producer = await client.create_producer(UNLOADED, send_timeout_s=10)
        await producer.send(b"before")
        assert (await reader.receive(timeout_s=10)).value == b"before"
        old = service.topics[name]

        await service.unload(name)
        assert not old.readers  # nobody left on the closed one
        await producer.send(b"after")
        assert (await reader.receive(timeout_s=10)).value == b"after"
        await producer.close()
        await reader.close()
