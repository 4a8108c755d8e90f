"""Issue 17's background repair with real brokers on etcd, ledgers replicated 3/2: a broker
that comes back on an empty disk gets its copies back, in the background (broker
processes), also for a topic nobody has loaded (in-process brokers, the check called).

Before, a closed ledger that lost a copy while two remained stayed one short until
retention deleted it (only a recovery that found fewer than two re-copied it).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.ledger import LedgerCorrupted, LedgerSettings
from segtxn.ledger.managed import metadata_key
from segtxn.ledger.metadata import LedgerInfo, decode
from segtxn.ledger.replicas import HttpReplica, Member, Replication
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import Catalog
from tests.broker.conftest import StartBroker
from tests.processes import ServerProcess
from tests.waiting import wait_until

TTL = 2.0


@pytest.fixture
def cluster_store(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/repair-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def verbose_broker(store: str, tmp_path: Path, broker_id: str) -> ServerProcess:
    """A broker replicating 3/2 that logs at INFO (each repair is one line)."""
    return ServerProcess(
        ["-v", "broker", "--store", store, "--data-dir", str(tmp_path / broker_id),
         "--broker-id", broker_id, "--session-ttl", str(TTL), "--replication", "3/2"],
        f"broker {broker_id}",
        log=tmp_path / f"{broker_id}.log",
    )  # fmt: skip


@pytest.mark.slow
async def test_a_broker_back_on_an_empty_disk_gets_its_copies_back_and_they_serve_alone(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """b-victim (not the topic's owner) dies, the owner goes on writing on the two others
    (its first ledger closes, one copy short), and the victim comes back on an empty disk
    (a new storage instance). The owner's repairer copies that ledger to the victim and
    records it, without a client doing anything; then, with the two old copies deleted,
    every message is still read, from the new copy alone."""
    ids = ["b0", "b1", "b2"]
    brokers = {i: verbose_broker(cluster_store, tmp_path, i) for i in ids}
    started += brokers.values()
    for broker in brokers.values():
        broker.start()
    for broker in brokers.values():
        await broker.ready()
    topic = "persistent://acme/ha/repaired"
    sent = [f"m-{i}".encode() for i in range(60)]
    async with open_store(cluster_store) as store, aiohttp.ClientSession() as session:
        catalog = Catalog(store)
        async with Client(brokers["b0"].url) as client:
            await client.admin.create_topic(topic)
            producer = await client.create_producer(topic)
            for payload in sent[:30]:
                await producer.send(payload)
            owner_url = await client.connector.broker_for(TopicName.parse(topic))
            owner = next(i for i in ids if brokers[i].url == owner_url)
            victim, other = (i for i in ids if i != owner)
            brokers[victim].kill()
            for payload in sent[30:]:  # the first ledger loses the victim and closes
                await producer.send(payload)

        shutil.rmtree(tmp_path / victim)
        brokers[victim].start()
        await brokers[victim].ready()
        registered = {b.broker_id: b.instance for b in await catalog.brokers()}
        new_copy = Member(victim, registered[victim])

        async def first_ledger() -> LedgerInfo:
            record = await store.get(metadata_key(topic))
            assert record is not None
            return decode(record.value).ledgers[0]

        async def repaired() -> bool:
            return str(new_copy) in (await first_ledger()).replicas

        await wait_until(repaired, timeout=60, what="the first ledger copied to the victim")

        async def all_whole() -> bool:  # the ledgers made on two brokers meanwhile, widened
            record = await store.get(metadata_key(topic))
            assert record is not None
            closed = [i for i in decode(record.value).ledgers if i.entries is not None]
            return all(
                sorted(Member.parse(m) for m in i.replicas)
                == sorted(Member(b, registered[b]) for b in ids)
                for i in closed
            )

        await wait_until(all_whole, timeout=60, what="every closed ledger on three brokers")
        info = await first_ledger()
        assert info.entries is not None and info.entries >= 30
        members = [Member.parse(m) for m in info.replicas]
        assert sorted(m.broker for m in members) == sorted(ids)
        assert all(registered[m.broker] == m.instance for m in members)  # none of the lost

        async def locate(broker: str) -> str | None:
            return brokers[broker].url

        def replica(member: Member) -> HttpReplica:
            return HttpReplica(member, locate, session, timeout_s=5.0)

        assert (await replica(new_copy).stat(topic, info.id))[0] == info.entries
        for member in members:
            if member != new_copy:
                await replica(member).delete(topic, info.id)

        async with Client(brokers[other].url) as client:
            consumer = await client.subscribe(topic, "check", initial_position="earliest")
            got = [(await consumer.receive(timeout_s=10)).value for _ in sent]
        assert got == sent
    log = brokers[owner].log_text()
    assert f"ledger {info.id} of {topic}: re-replicated" in log


async def test_a_topic_homed_here_but_not_loaded_is_loaded_and_repaired(
    start_broker: StartBroker, cluster_store: str, tmp_path: Path
) -> None:
    """The owner unloaded the topic (as it does an idle sealed one): nothing would open
    it, so nothing would notice its ledgers lost a copy. The owner's full check reads
    the records of what it homes, loads the topic and repairs every closed ledger."""

    async def start(broker_id: str, port: int | None = None) -> BrokerServer:
        return await start_broker(
            cluster_store,
            broker_id,
            tmp_path / broker_id,
            port,
            replication=Replication(3, 2),
            ledger=LedgerSettings(max_ledger_bytes=1000),
        )

    brokers = {i: await start(i) for i in ("r0", "r1", "r2")}
    topic = "persistent://acme/ha/idle"
    name = TopicName.parse(topic)
    async with Client(brokers["r0"].settings.advertise_url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        for i in range(40):
            await producer.send(f"idle-{i:02d}".encode() * 4)
        owner_url = await client.connector.broker_for(name)
    owner = next(b for b in brokers.values() if b.settings.advertise_url == owner_url)
    victim = next(i for i, b in brokers.items() if b is not owner)
    await owner.service.unload(name)  # (a clean close: every ledger is closed)
    async with open_store(cluster_store) as store:

        async def ledgers() -> list[LedgerInfo]:
            record = await store.get(metadata_key(topic))
            assert record is not None
            return decode(record.value).ledgers

        before = await ledgers()
        assert len(before) >= 3 and all(i.entries is not None for i in before)
        port = urlsplit(brokers[victim].settings.advertise_url).port
        await brokers[victim].stop()
        repairer = owner.service.repairer
        assert repairer is not None
        await owner.service.serve(name)  # while the victim is away: counted, not repaired
        assert await repairer.check(full=False) == 0
        assert repairer.under_replicated == len(before)
        await owner.service.unload(name)
        before = await ledgers()  # (the load made one more ledger, on two brokers)
        shutil.rmtree(tmp_path / victim)
        brokers[victim] = await start(victim, port)  # a new storage instance
        registered = {b.broker_id: b.instance for b in await Catalog(store).brokers()}

        await repairer.check(full=True)  # (or its own, started by the new instance)

        assert name in owner.service.topics
        after = {i.id: i for i in await ledgers()}
        for info in before:
            members = [Member.parse(m) for m in after[info.id].replicas]
            assert len(members) == 3
            assert all(registered.get(m.broker) == m.instance for m in members)
        assert repairer.under_replicated == 0
        gauge = rb"\nsegtxn_broker_under_replicated_ledgers 0\.0\n"
        assert re.search(gauge, owner.service.metrics.render())
    async with Client(brokers[victim].settings.advertise_url) as client:
        consumer = await client.subscribe(topic, "check", initial_position="earliest")
        got = [(await consumer.receive(timeout_s=10)).value for _ in range(40)]
    assert got == [f"idle-{i:02d}".encode() * 4 for i in range(40)]


async def test_a_broker_gone_for_good_has_its_copies_made_again_elsewhere(
    start_broker: StartBroker, cluster_store: str, tmp_path: Path
) -> None:
    """A broker that stops and does not come back (scaled away) stays away only for
    ``lost_after_s``: its copies are taken for lost then, and made again on a broker
    outside each placement. Until then it may be restarting, and nothing is copied."""
    ids = ["g0", "g1", "g2", "g3"]
    brokers = {
        i: await start_broker(
            cluster_store,
            i,
            tmp_path / i,
            replication=Replication(3, 2),
            ledger=LedgerSettings(max_ledger_bytes=1000),
        )
        for i in ids
    }
    topic = "persistent://acme/ha/gone"
    name = TopicName.parse(topic)
    async with Client(brokers["g0"].settings.advertise_url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        for i in range(40):
            await producer.send(f"gone-{i:02d}".encode() * 4)
        owner_url = await client.connector.broker_for(name)
    owner = next(b for b in brokers.values() if b.settings.advertise_url == owner_url)
    repairer = owner.service.repairer
    assert repairer is not None
    async with open_store(cluster_store) as store:

        async def closed() -> list[LedgerInfo]:
            record = await store.get(metadata_key(topic))
            assert record is not None
            return [i for i in decode(record.value).ledgers if i.entries is not None]

        first = (await closed())[0]
        holders = [Member.parse(m).broker for m in first.replicas]
        victim = next(b for b in holders if brokers[b] is not owner)
        await brokers[victim].stop()  # (a clean stop: unregistered at once)

        await repairer.check(full=True)
        assert (await closed())[0].replicas == first.replicas  # away: maybe restarting
        repairer.settings = dataclasses.replace(repairer.settings, lost_after_s=0.0)
        await repairer.check(full=True)

        after = await closed()
        assert victim not in [Member.parse(m).broker for m in after[0].replicas]
        outside = next(b for b in ids if b not in holders)
        assert outside in [Member.parse(m).broker for m in after[0].replicas]
        for info in after:
            assert victim not in [Member.parse(m).broker for m in info.replicas]
            assert len(info.replicas) == 3


async def test_a_copy_that_fell_behind_while_its_broker_was_away_briefly_is_topped_up(
    start_broker: StartBroker,
    cluster_store: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker stops while the owner writes and comes back on the same disk before its
    copies count as lost: the ledger being written when it left closed without it, so
    its copy holds a prefix only, yet every broker is registered with the instance the
    placement names. The owner's check audits each closed ledger, finds the copy behind,
    counts it under-replicated while the top-up fails, and tops it up once it can.

    Before, registration alone was judged: the copy stayed behind for good, and the
    gauge said 0."""

    async def start(broker_id: str, port: int | None = None) -> BrokerServer:
        return await start_broker(
            cluster_store,
            broker_id,
            tmp_path / broker_id,
            port,
            replication=Replication(3, 2),
            ledger=LedgerSettings(max_ledger_bytes=1000),
        )

    brokers = {i: await start(i) for i in ("l0", "l1", "l2")}
    topic = "persistent://acme/ha/lagging"
    name = TopicName.parse(topic)
    sent = [f"lag-{i:02d}".encode() * 4 for i in range(40)]
    async with Client(brokers["l0"].settings.advertise_url) as client:
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        for payload in sent[:25]:
            await producer.send(payload)
        owner_url = await client.connector.broker_for(name)
        owner = next(b for b in brokers.values() if b.settings.advertise_url == owner_url)
        victim = next(i for i, b in brokers.items() if b is not owner)
        port = urlsplit(brokers[victim].settings.advertise_url).port
        await brokers[victim].stop()
        for payload in sent[25:]:  # the open ledger closes without the victim's copy
            await producer.send(payload)
    brokers[victim] = await start(victim, port)  # the same disk: the same instance
    repairer = owner.service.repairer
    assert repairer is not None
    urls = {i: b.settings.advertise_url for i, b in brokers.items()}

    async def locate(broker: str) -> str | None:
        return urls[broker]

    async with open_store(cluster_store) as store, aiohttp.ClientSession() as session:

        async def lagging() -> list[LedgerInfo]:
            """The closed ledgers naming the victim whose copy there holds less."""
            record = await store.get(metadata_key(topic))
            assert record is not None
            behind = []
            for info in decode(record.value).ledgers:
                for member in map(Member.parse, info.replicas):
                    if info.entries is not None and member.broker == victim:
                        replica = HttpReplica(member, locate, session, timeout_s=5.0)
                        if (await replica.stat(topic, info.id))[0] < info.entries:
                            behind.append(info)
            return behind

        before = await lagging()
        assert before, "no copy fell behind (the stop came between two ledgers)"
        record = await store.get(metadata_key(topic))
        assert record is not None
        narrow = [  # made while the victim was away: on two brokers, widened by the check
            i for i in decode(record.value).ledgers if i.entries is not None and len(i.replicas) < 3
        ]
        node = brokers[victim].service.replica_nodes
        assert node is not None

        def refuse(*_: object) -> int:
            raise LedgerCorrupted("injected: this disk takes no writes")

        monkeypatch.setattr(node.node, "append", refuse)
        await repairer.check(full=False)
        assert await lagging() == before
        assert repairer.under_replicated == len(before) + len(narrow)
        monkeypatch.undo()

        await repairer.check(full=False)

        assert await lagging() == []
        assert repairer.under_replicated == 0
        assert await repairer.check(full=False) == 0  # audited whole: nothing to do
    async with Client(brokers[victim].settings.advertise_url) as client:
        consumer = await client.subscribe(topic, "check", initial_position="earliest")
        got = [(await consumer.receive(timeout_s=10)).value for _ in sent]
    assert got == sent
