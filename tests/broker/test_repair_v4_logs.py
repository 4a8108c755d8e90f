"""Background repair of the other replicated managed ledgers (issue 17): a subscription's v4
pending-ack log and a namespace's transaction-buffer snapshot log, repaired by the broker
that serves them, and a v4 coordinator's transaction log, repaired by the coordinator that
holds its id. In-process brokers and coordinators on a real etcd, ledgers replicated 3/2.

Before, only the topics' own ledgers were repaired: a closed ledger of these logs that lost
a copy stayed short until it was compacted away (or, for a log that compacts rarely, for
good), and one that lost two could no longer be read by the next holder.
"""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
from pathlib import Path

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.txn.pending_ack_log import pending_ack_log
from segtxn.broker.txn.snapshots import SNAPSHOT_LOG
from segtxn.client import Client
from segtxn.coordinator.app import METRICS, V4, CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import log_name
from segtxn.ledger import LedgerSettings, RetentionPolicy
from segtxn.ledger.managed import metadata_key
from segtxn.ledger.metadata import LedgerInfo, decode
from segtxn.ledger.replicas import HttpReplica, Member, RepairSettings, Replication
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import Catalog
from segtxn.web import Listener
from tests.broker.conftest import StartBroker
from tests.waiting import wait_until

SMALL = LedgerSettings(max_ledger_bytes=600)
"""Every log rolls over every few entries: each has several closed ledgers."""
TOPIC = "persistent://acme/ha/v4logs"


@pytest.fixture
def cluster_store(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/repair-v4-{os.getpid()}-{uuid.uuid4().hex[:8]}")


async def closed(store: MetadataStore, name: str) -> list[LedgerInfo]:
    record = await store.get(metadata_key(name))
    assert record is not None, name
    return [i for i in decode(record.value).ledgers if i.entries is not None]


FAST_REPAIR = RepairSettings(check_s=0.5, members_check_s=0.2, lost_after_s=0.0)
"""The coordinator's own loop repairs at once what an unregistered broker held."""


async def start_coordinator(
    store_url: str, repair: RepairSettings | None = None
) -> CoordinatorServer:
    """A v4 coordinator (one id) whose transaction log is replicated 3/2; started once it
    holds the id with its log replayed."""
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    server = CoordinatorServer(
        CoordinatorSettings(
            advertise_url=f"http://127.0.0.1:{listener.port}",
            store_url=store_url,
            v4_coordinator_ids=1,
            replication=Replication(3, 2),
            ledger=SMALL,
            session_ttl_s=2.0,
            repair=repair or RepairSettings(),
        ),
        listener=listener,
    )
    await server.start()
    v4 = server.app[V4]
    await wait_until(lambda: len(v4.held) == 1, timeout=20, what="the v4 id held")
    return server


async def test_v4_logs_are_repaired_by_their_owners_and_a_successor_reads_the_copies(
    start_broker: StartBroker, cluster_store: str, tmp_path: Path
) -> None:
    """Three brokers hold every copy; a fourth joins; a broker that held copies of every
    closed ledger stops for good. The topic's owner repairs its pending-ack and snapshot
    logs, the coordinator its transaction log, each onto the fourth broker. Then, with
    the coordinator stopped and the other old copies of its repaired ledgers deleted, a
    new coordinator takes the id over and replays the log from the new copies alone."""

    async def start(broker_id: str) -> BrokerServer:
        return await start_broker(
            cluster_store,
            broker_id,
            tmp_path / broker_id,
            replication=Replication(3, 2),
            ledger=SMALL,
            txn_buffer_snapshot_every=1,
        )

    brokers = {i: await start(i) for i in ("v0", "v1", "v2")}
    first = await start_coordinator(cluster_store, FAST_REPAIR)
    coordinators = [first]
    try:
        async with Client(brokers["v0"].settings.advertise_url) as client:
            await client.admin.create_topic(TOPIC)
            consumer = await client.subscribe(
                TOPIC, "s", initial_position="earliest", subscription_type="Shared"
            )
            producer = await client.create_producer(TOPIC)
            kept_open = await client.transaction(timeout_s=3000).start("v4")  # (first ledger)
            for i in range(12):
                await producer.send(f"m{i}".encode())
            committed: list[int] = []
            for _ in range(12):
                message = await consumer.receive(timeout_s=10)
                txn = client.transaction()
                await producer.send(b"in-txn", txn=txn)  # a marker: a snapshot each
                await consumer.acknowledge(message, txn=txn)
                await txn.commit()
                committed.append(txn.id.least)
            owner_url = await client.connector.broker_for(TopicName.parse(TOPIC))
            await client.close(timeout_s=0)  # leaves kept_open open (a close that waits aborts it)
        owner = next(b for b in brokers.values() if b.settings.advertise_url == owner_url)
        victim = next(i for i, b in brokers.items() if b is not owner)
        logs = [
            pending_ack_log(TOPIC, "s"),
            f"persistent://acme/ha/{SNAPSHOT_LOG}@{owner.settings.broker_id}",
            log_name(0),
        ]
        async with open_store(cluster_store) as store:
            before = {name: await closed(store, name) for name in logs}
            for name, infos in before.items():  # every copy on the three
                assert infos, name
                assert all(victim in [Member.parse(m).broker for m in i.replicas] for i in infos)
            brokers["v3"] = await start("v3")
            await brokers[victim].stop()  # (a clean stop: unregistered at once)
            broker_repairer = owner.service.repairer
            log_repairer = first.app[V4].repairer
            assert broker_repairer is not None and log_repairer is not None
            await broker_repairer.check(full=False)  # seen unregistered: its clock starts
            broker_repairer.settings = dataclasses.replace(
                broker_repairer.settings, lost_after_s=0.0
            )
            await broker_repairer.check(full=False)

            async def log_repaired() -> bool:  # by the coordinator's own background loop
                after = await closed(store, log_name(0))
                return log_repairer.under_replicated == 0 and not any(
                    victim in [Member.parse(m).broker for m in i.replicas] for i in after
                )

            await wait_until(log_repaired, timeout=20, what="the coordinator's loop repairing")

            registered = {b.broker_id: b.instance for b in await Catalog(store).brokers()}
            new_copies: dict[int, Member] = {}
            for name, infos in before.items():
                after = {i.id: i for i in await closed(store, name)}
                for info in infos:
                    if info.id not in after:  # (compacted away meanwhile: nothing to keep)
                        continue
                    members = [Member.parse(m) for m in after[info.id].replicas]
                    expected = sorted({"v0", "v1", "v2", "v3"} - {victim})
                    assert sorted(m.broker for m in members) == expected, (name, info.id)
                    assert all(registered[m.broker] == m.instance for m in members)
                    if name == log_name(0):
                        new_copies[info.id] = next(m for m in members if m.broker == "v3")
            assert broker_repairer.under_replicated == 0
            gauge = rb"\nsegtxn_txn_v4_log_under_replicated_ledgers 0\.0\n"
            assert re.search(gauge, first.app[METRICS].render())

            await first.stop()
            coordinators.remove(first)
            urls = {i: b.settings.advertise_url for i, b in brokers.items()}

            async def locate(broker: str) -> str | None:
                return urls[broker]

            async with aiohttp.ClientSession() as session:
                for ledger_id, new_copy in new_copies.items():
                    info = next(i for i in await closed(store, log_name(0)) if i.id == ledger_id)
                    for member in map(Member.parse, info.replicas):
                        if member != new_copy:  # the old copies that remain: gone too
                            await HttpReplica(member, locate, session, timeout_s=5.0).delete(
                                log_name(0), ledger_id
                            )
        assert new_copies, "no ledger of the transaction log was repaired"
        second = await start_coordinator(cluster_store)
        coordinators.append(second)
        held = second.app[V4].held[0]
        assert held.txns[kept_open.id.least].state == "OPEN"
        for least in committed:
            assert held.txns[least].state == "COMMITTED"
    finally:
        for coordinator in coordinators:
            await coordinator.stop()


async def test_a_topic_whose_pending_ack_log_alone_is_short_is_loaded_and_repaired(
    start_broker: StartBroker, cluster_store: str, tmp_path: Path
) -> None:
    """The owner unloaded the topic, whose own old ledgers retention deleted: only its
    subscription's pending-ack log still names the broker that went away. Nothing has it
    open; the owner's full check reads the topic's subscriptions' logs too, loads the topic
    (which restores the subscription and opens its log) and repairs the log."""

    async def start(broker_id: str) -> BrokerServer:
        return await start_broker(
            cluster_store,
            broker_id,
            tmp_path / broker_id,
            replication=Replication(3, 2),
            ledger=SMALL,
            retention=RetentionPolicy(retention_time_s=0, retention_bytes=-1),
        )

    brokers = {i: await start(i) for i in ("w0", "w1", "w2")}
    coordinator = await start_coordinator(cluster_store)
    name = TopicName.parse(TOPIC)
    acks = pending_ack_log(TOPIC, "s")
    try:
        async with Client(brokers["w0"].settings.advertise_url) as client:
            await client.admin.create_topic(TOPIC)
            consumer = await client.subscribe(
                TOPIC, "s", initial_position="earliest", subscription_type="Shared"
            )
            producer = await client.create_producer(TOPIC)
            for i in range(12):
                await producer.send(f"m{i}".encode())
            for _ in range(12):
                async with client.transaction() as txn:
                    await consumer.acknowledge(await consumer.receive(timeout_s=10), txn=txn)
            owner_url = await client.connector.broker_for(name)
            owner = next(b for b in brokers.values() if b.settings.advertise_url == owner_url)
            victim = next(i for i, b in brokers.items() if b is not owner)
            brokers["w3"] = await start("w3")
            await brokers[victim].stop()
            for i in range(3):  # the topic's ledger moves to the three brokers left
                await producer.send(f"after-{i}".encode())
                await consumer.acknowledge(await consumer.receive(timeout_s=10))
        async with open_store(cluster_store) as store:

            def names_victim(infos: list[LedgerInfo]) -> bool:
                return any(victim in [Member.parse(m).broker for m in i.replicas] for i in infos)

            topic = owner.service.topics[name]

            async def trimmed() -> bool:  # every consumed ledger before the current one
                await topic.trim()
                return not names_victim([i for i in topic.ledger.ledgers if i.entries])

            await wait_until(trimmed, timeout=10, what="the consumed ledgers deleted")
            await owner.service.unload(name)
            assert not names_victim(await closed(store, TOPIC))  # the topic is not short
            assert names_victim(await closed(store, acks))  # its pending-ack log is
            repairer = owner.service.repairer
            assert repairer is not None
            await repairer.check(full=True)  # seen unregistered: its clock starts
            repairer.settings = dataclasses.replace(repairer.settings, lost_after_s=0.0)

            await repairer.check(full=True)

            assert name in owner.service.topics
            after = await closed(store, acks)
            assert after and not names_victim(after)
            assert all(len(i.replicas) == 3 for i in after)
            assert repairer.under_replicated == 0
    finally:
        await coordinator.stop()
