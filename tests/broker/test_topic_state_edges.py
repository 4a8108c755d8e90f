"""A topic's state at its edges: what a ``persistent://`` topic deleted and created again
under its name recovers; de-duplication state larger than one store value; a split's
child placed by a controller that paused; a Failover member that comes back before its
old connection is let go. Real brokers and a real coordinator, or a real
ledger (memory store and real etcd), real ledger files; each failed before its fix (a
review's suspicions)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.controllers import HttpSegmentOps
from segtxn.broker.dedup import Deduplication
from segtxn.broker.dedup_snapshots import parts_prefix
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.broker.fanout import HTTP
from segtxn.broker.txn.snapshots import SnapshotLog
from segtxn.client import Client
from segtxn.ledger import (
    FileLogStorage,
    LedgerError,
    LedgerSettings,
    ManagedLedger,
    Position,
    RetentionPolicy,
)
from segtxn.metastore import MetadataStore, Op, Put, Record
from segtxn.protocol.limits import MAX_CLIENT_NAME
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import Catalog, TopicExists, home_key
from segtxn.topics.controller import Controller
from segtxn.web import Listener
from tests.broker.test_subscriptions import assert_nothing_more, produce, receive_n
from tests.cluster import Cluster
from tests.txn.test_v4 import end, loaded, nothing_more, receive_all, restart_broker

V4_TOPIC = "persistent://acme/v4/reborn"


# ---------------------------------------------------------------------- 1


@pytest.mark.parametrize("tombstoned", [True, False], ids=["tombstoned", "tombstone-failed"])
async def test_a_v4_topic_created_again_never_loads_the_deleted_ones_snapshot(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tombstoned: bool
) -> None:
    """A v4 topic's transaction-buffer snapshot is kept in its namespace's snapshot log
    under the topic's name. The topic is deleted and created again under that name: its
    new ledger's positions start where the old one's did, so the old snapshot (its
    position past every entry of the new topic, an aborted transaction of the old one)
    must not be loaded. Loaded, recovery skipped the new topic's entries: its open
    transaction was not known, and what it sent was delivered before its commit.

    The deletion tombstones the snapshot in this broker's log; when that write fails (or
    the snapshot is in another broker's log, the topic having moved), the snapshot's
    incarnation keeps it from being loaded."""
    if not tombstoned:

        async def fail(self: SnapshotLog, topic: str) -> None:
            raise LedgerError("injected: the tombstone was not written")

        monkeypatch.setattr(SnapshotLog, "forget", fail)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(V4_TOPIC)
        producer = await client.create_producer(V4_TOPIC)
        old = client.transaction()
        for i in range(5):
            await producer.send(f"old-{i}".encode(), txn=old)
        await old.abort()
        await producer.close()
        first = await loaded(cluster, V4_TOPIC)
        await first.snapshot()  # holds `old` as aborted, at the old ledger's end
        await client.admin.delete_topic(V4_TOPIC, force=True)
        gone = await (await cluster.broker.service.snapshots.get("acme", "v4")).latest(V4_TOPIC)
        assert (gone is None) is tombstoned

        await client.admin.create_topic(V4_TOPIC)
        producer = await client.create_producer(V4_TOPIC)
        open_ = client.transaction()
        await producer.send(b"uncommitted", txn=open_)
        await producer.send(b"plain")
        await restart_broker(cluster)  # the topic is recovered from its ledger
        kept = await (await cluster.broker.service.snapshots.get("acme", "v4")).latest(V4_TOPIC)
        assert (kept is None) is tombstoned  # the tombstone is replayed too
        again = await loaded(cluster, V4_TOPIC)
        assert again.recovery["snapshot"] == 0  # none of this topic's own
        assert again.ongoing == {open_.id}
        assert again.visible(old.id, Position(0, 0))  # not aborted here: unknown here
        await client.close(timeout_s=0)  # leaves `open_` open
    async with Client(cluster.url) as client:
        consumer = await client.subscribe(V4_TOPIC, "s", initial_position="earliest")
        await nothing_more(consumer)  # the open transaction holds everything after it
        await end(client, str(open_.id), "COMMIT")
        assert await receive_all(consumer, 2) == [b"uncommitted", b"plain"]


@pytest.mark.parametrize("deleted", ["topic", "subscription"])
async def test_a_v4_subscription_made_again_never_replays_the_deleted_ones_pending_acks(
    cluster: Cluster, deleted: str
) -> None:
    """A v4 subscription's transactional acks go to its pending-ack log, replayed when the
    subscription is loaded (committed acks are applied to the cursor again). The
    subscription, or its topic, is deleted and made again under its name: its log must
    not be the deleted one's, whose committed acks name positions of the topic (which a
    topic created again reuses). Replayed, they acknowledged the first messages of the
    subscription made again: never delivered to it."""
    async with Client(cluster.url) as client:
        await client.admin.create_topic(V4_TOPIC)
        consumer = await client.subscribe(V4_TOPIC, "s", initial_position="earliest")
        producer = await client.create_producer(V4_TOPIC)
        for i in range(3):
            await producer.send(f"m{i}".encode())
        await producer.close()
        txn = client.transaction()
        for _ in range(2):
            await consumer.acknowledge(await consumer.receive(timeout_s=10), txn=txn)
        await txn.commit()
        await consumer.close()
        if deleted == "topic":
            await client.admin.delete_topic(V4_TOPIC, force=True)
            await client.admin.create_topic(V4_TOPIC)
            producer = await client.create_producer(V4_TOPIC)
            for i in range(3):
                await producer.send(f"m{i}".encode())
            await producer.close()
        else:
            await client.admin.delete_subscription(V4_TOPIC, "s")
        consumer = await client.subscribe(V4_TOPIC, "s", initial_position="earliest")
        assert (await consumer.receive(timeout_s=10)).value == b"m0"
        assert await receive_all(consumer, 2) == [b"m1", b"m2"]


# ---------------------------------------------------------------------- 2

DEDUP_TOPIC = "persistent://acme/dedup/crowded"


async def test_de_duplication_state_larger_than_a_store_value_survives_a_trim_and_a_reload(
    store: MetadataStore, tmp_path: Path
) -> None:
    """4,000 producers with names of the longest length a client may use, each with one
    message stored: their de-duplication snapshot is larger than one store value (1 MiB,
    below etcd's 1.5 MiB request). It must still be written: once the ledger holding
    their messages is trimmed, the snapshot is all a reload knows of them, and a resend
    of any of their messages must still be a duplicate. Before, the write was refused
    (TooLarge) at every snapshot, logged and dropped: a reload replayed from the last
    snapshot that fit, or the first entry left, and forgot every producer of what was
    trimmed."""
    names = [f"{i:05d}-".ljust(MAX_CLIENT_NAME, "p") for i in range(4000)]
    storage = FileLogStorage(tmp_path)
    ledger = await ManagedLedger.open(DEDUP_TOPIC, store, storage, LedgerSettings())
    try:
        dedup = Deduplication(DEDUP_TOPIC, store, snapshot_every=10**6)
        await dedup.recover(ledger)  # (as a topic's load: its snapshots are fenced with it)
        now_ms = int(time.time() * 1000)
        positions = await asyncio.gather(
            *(ledger.append(encode_entry(StoredMessage(n, 7, now_ms, b"x"))) for n in names)
        )
        for name, position in zip(names, positions, strict=True):
            dedup.note_stored(name, 7, position)
        await dedup.snapshot()
        await dedup.snapshot()  # a second one replaces the first one's parts
        uses = {n: s.use for n, s in dedup.producers.items()}
        assert len(set(uses.values())) == len(names)
        cursor = await ledger.open_cursor("all-read", start="earliest")
        await ledger.roll_over()  # the messages' ledger is closed, and consumed:
        await cursor.ack_cumulative(positions[-1])
        trimmed = await ledger.trim(RetentionPolicy(retention_time_s=0))
        assert trimmed.entries == len(names)
    finally:
        await ledger.close()
    parts = await store.list_prefix(parts_prefix(DEDUP_TOPIC))
    generations = {record.key.rsplit("/", 2)[1] for record in parts.records}
    assert len(parts.records) > 1 and len(generations) == 1  # the older parts are gone

    ledger = await ManagedLedger.open(DEDUP_TOPIC, store, storage, LedgerSettings())
    try:
        reloaded = Deduplication(DEDUP_TOPIC, store, snapshot_every=10**6)
        await reloaded.recover(ledger)
        assert {n: s.last for n, s in reloaded.producers.items()} == dict.fromkeys(names, 7)
        # each name's use too (segtxn/broker/dedup.py, "A name used again")
        assert {n: s.use for n, s in reloaded.producers.items()} == uses
        await reloaded.delete()
    finally:
        await ledger.close()
    assert not (await store.list_prefix(parts_prefix(DEDUP_TOPIC))).records


# ---------------------------------------------------------------------- 3

SCALABLE = "topic://acme/review/placed"


class PausedAfterHomeCheck(Catalog):
    """A controller's catalog that, the first time it finds a segment without a home,
    pauses (as a controller stalled past its lease does) until ``resume`` is set."""

    def __init__(self, catalog: Catalog) -> None:
        super().__init__(catalog.store)
        self.checked = asyncio.Event()
        self.resume = asyncio.Event()

    async def home_of(self, ledger: TopicName) -> str | None:
        home = await super().home_of(ledger)
        if home is None and not self.checked.is_set():
            self.checked.set()
            await self.resume.wait()
        return home


async def test_a_controller_paused_after_its_home_check_keeps_the_home_placed_meanwhile(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Controller A plans a split, finds a child without a home and stalls before writing
    one. Controller B (the next holder of the lease) finishes the split: it places the
    child, prepares it there, completes; messages go to it. A resumes, and the broker it
    would now place the child on is another: its write must not replace B's home (the
    child's data is on B's pick). It was an unconditional put: the child moved to a broker
    that holds none of its data."""
    async with Client(cluster.url) as client:
        await client.admin.create_topic(SCALABLE, segments=1)  # segment 0 on b1
        b2 = await start_second_broker(cluster, tmp_path)
        try:
            service = cluster.broker.service
            ops = HttpSegmentOps(service.catalog, cluster.broker.app[HTTP])
            paused = PausedAfterHomeCheck(service.catalog)
            name = TopicName.parse(SCALABLE)
            a = asyncio.create_task(Controller(service.store, paused, ops).split(name, 0))
            await paused.checked.wait()
            await Controller(service.store, service.catalog, ops).finish(name)
            child = name.segment_name(1)
            placed = await service.catalog.home_of(child)
            await client.admin.create_topic("persistent://acme/review/other")  # on b2
            assert placed is not None and (await service.catalog.place(1)) != [placed]

            producer = await client.create_producer(SCALABLE)
            for i in range(6):
                await producer.send(f"m{i}".encode(), key=f"k{i}")
            await producer.close()
            paused.resume.set()
            await asyncio.gather(a, return_exceptions=True)  # (B completed the split)
            assert await service.catalog.home_of(child) == placed
            consumer = await client.subscribe(SCALABLE, "s", initial_position="earliest")
            got = {(await consumer.receive(timeout_s=10)).value for _ in range(6)}
            assert got == {f"m{i}".encode() for i in range(6)}
            await consumer.close()
        finally:
            await b2.stop()


async def start_second_broker(cluster: Cluster, tmp_path: Path) -> BrokerServer:
    """Broker ``b2`` on the cluster's store (stopped by the caller)."""
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    settings = dataclasses.replace(
        cluster.broker.settings,
        broker_id="b2",
        advertise_url=f"http://127.0.0.1:{listener.port}",
        ledger_url=f"file://{tmp_path / 'b2'}",
    )
    b2 = BrokerServer(settings, store=cluster.store, listener=listener)
    await b2.start()
    return b2


async def test_a_create_paused_after_its_existence_check_keeps_the_home_of_the_topic_made_meanwhile(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two creates of one persistent topic (two brokers auto-creating it for their
    clients, say): the first finds no topic, picks its home and stalls before writing it;
    the second creates the topic on another broker, where messages are then stored. The
    first one's homes must not be written over the live topic's (it then fails with
    TopicExists). They were: the topic moved to a broker holding none of its data."""
    name = TopicName.parse("persistent://acme/review/twice")
    key = home_key(name)
    checked, resume = asyncio.Event(), asyncio.Event()
    commit = cluster.store.commit

    async def paused_commit(ops: Sequence[Op]) -> list[Record | None]:
        if not checked.is_set() and any(isinstance(op, Put) and op.key == key for op in ops):
            checked.set()
            await resume.wait()
        return await commit(ops)

    monkeypatch.setattr(cluster.store, "commit", paused_commit)
    b2 = await start_second_broker(cluster, tmp_path)
    try:
        catalog = cluster.broker.service.catalog
        first = asyncio.create_task(catalog.create_persistent(name))  # picks b1
        await checked.wait()
        async with Client(cluster.url) as client:
            await client.admin.create_topic("persistent://acme/review/other")  # on b1
            await client.admin.create_topic(str(name))  # so this one goes to b2
            assert await catalog.home_of(name) == "b2"
            producer = await client.create_producer(str(name))
            sent = [await producer.send(f"m{i}".encode()) for i in range(3)]
            await producer.close()
            resume.set()
            with pytest.raises(TopicExists):
                await first
            assert await catalog.home_of(name) == "b2"
            consumer = await client.subscribe(str(name), "s", initial_position="earliest")
            got = [(await consumer.receive(timeout_s=10)).message_id for _ in range(3)]
            assert got == sent
            await consumer.close()
    finally:
        resume.set()
        await b2.stop()


# ---------------------------------------------------------------------- 4

FAILOVER_TOPIC = "persistent://acme/review/failover"


async def test_a_failover_member_back_before_its_old_link_went_gets_everything_in_order(
    broker: BrokerServer,
) -> None:
    """A Failover member reconnects under its name while the broker still holds its old
    connection (the drop not seen yet): for a while the subscription counts both links,
    the new one a standby behind the old. When the old one goes, the new one takes over
    from the earliest unacknowledged message, in order, nothing lost (not a bug: the
    count is briefly one more, and the hand-overs it causes rewind in order)."""
    url = broker.settings.advertise_url
    async with Client(url) as old, Client(url) as new:
        await old.admin.create_topic(FAILOVER_TOPIC)
        first = await old.subscribe(FAILOVER_TOPIC, "fo", subscription_type="Failover", name="c")
        ids = await produce(old, FAILOVER_TOPIC, 10)
        got = await receive_n(first, 10)
        for message in got[:4]:
            await first.acknowledge(message)
        again = await new.subscribe(FAILOVER_TOPIC, "fo", subscription_type="Failover", name="c")
        subscription = broker.service.topics[TopicName.parse(FAILOVER_TOPIC)].subscriptions["fo"]
        assert [link.name for link in subscription.consumers] == ["c", "c"]  # both, briefly
        assert first.active and not again.active
        await assert_nothing_more(again)
        await old.close()
        taken_over = await receive_n(again, 6)
        assert [m.message_id for m in taken_over] == ids[4:]  # in order, none lost
        for message in taken_over:
            await again.acknowledge(message)
        await assert_nothing_more(again)
