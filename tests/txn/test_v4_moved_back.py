"""A v4 topic that moves from broker X to broker Y and back to X (in-process brokers on one
store and one ledger directory; the move is a drain's: marked moving, unloaded, home moved).

X's transaction-buffer snapshot log still holds X's snapshot from before the move: of the
same incarnation of the topic, older than what Y did with it. Recovery on X loads it and
replays the ledger from the position it covers, so the markers Y wrote after it (a
commit, an abort) are replayed and count. Unless Y's retention trimmed the ledgers holding
them: the replay then started at the first retained entry, the snapshot's ``ongoing``
transactions (committed and aborted on Y, their markers gone) stayed open on X, and X's
readers stopped before them (``max_read_position``), delivering nothing more until the v4
checks' sweep asked their coordinator and wrote second markers (5 s by default; an hour
and more while no coordinator answered). A snapshot whose position is in a trimmed ledger
is now set aside and the retained ledger replayed whole
(:mod:`segtxn.broker.txn.snapshots`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.service import BrokerService
from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.client import Client
from segtxn.ledger import LedgerSettings, RetentionPolicy
from segtxn.protocol.names import TopicName
from segtxn.web import Listener
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "persistent://acme/v4/moved"
NAME = TopicName.parse(TOPIC)
SMALL = LedgerSettings(max_ledger_bytes=600)
"""Ledgers roll over every few entries: retention has closed ledgers to trim."""


@pytest.fixture
async def brokers(cluster: Cluster) -> AsyncIterator[tuple[BrokerServer, BrokerServer]]:
    """X (the cluster's broker, restarted with small ledgers and retention at 0) and Y
    (another broker on the same store and ledger directory)."""
    settings = dataclasses.replace(
        cluster.broker.settings,
        ledger=SMALL,
        retention=RetentionPolicy(retention_time_s=0),
        retention_check_s=3600.0,  # trimmed by the test, not by the broker's upkeep
        # no sweep ends a transaction left open by mistake: only recovery lets readers on
        v4_txns=dataclasses.replace(cluster.broker.settings.v4_txns, sweep_s=3600.0),
    )
    await cluster.broker.stop()
    cluster.broker = BrokerServer(settings, store=cluster.store)
    await cluster.broker.start()
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    y = BrokerServer(
        dataclasses.replace(
            settings, broker_id="b2", advertise_url=f"http://127.0.0.1:{listener.port}"
        ),
        store=cluster.store,
        listener=listener,
    )
    await y.start()
    try:
        yield cluster.broker, y
    finally:
        await y.stop()


async def move(source: BrokerService, target: BrokerService, name: TopicName = NAME) -> None:
    """What a drain does to topic ``name`` (:func:`segtxn.broker.handoff._move`), to a
    chosen broker."""
    source.moving.add(name)
    try:
        await source.unload(name)
        to = target.broker_id
        assert await source.catalog.move_home(name, away_from=source.broker_id, to=to) == to
    finally:
        source.moving.discard(name)


def buffer(service: BrokerService) -> MarkerTransactionBuffer:
    topic = service.topics[NAME]
    assert isinstance(topic.buffer, MarkerTransactionBuffer)
    return topic.buffer


async def take(consumer: object, n: int) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(n):
        message = await consumer.receive(timeout_s=10)  # type: ignore[attr-defined]
        out.append(message.value)
        await consumer.acknowledge(message)  # type: ignore[attr-defined]
    return out


async def rest(consumer: object) -> list[bytes]:
    """Everything the consumer is given until none comes for a bounded while."""
    out: list[bytes] = []
    while True:
        try:
            message = await consumer.receive(timeout_s=0.5)  # type: ignore[attr-defined]
        except TimeoutError:
            return out
        out.append(message.value)
        await consumer.acknowledge(message)  # type: ignore[attr-defined]


@pytest.mark.parametrize("trim", [False, True], ids=["kept", "trimmed-on-y"])
async def test_a_topic_moved_back_reads_exactly_what_was_committed(
    brokers: tuple[BrokerServer, BrokerServer], trim: bool
) -> None:
    x, y = brokers
    async with Client(x.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        await producer.send(b"p0")
        committed_on_y, aborted_on_y = client.transaction(), client.transaction()
        await producer.send(b"c-x", txn=committed_on_y)
        await producer.send(b"a-x", txn=aborted_on_y)
        on_x = buffer(x.service)
        assert on_x.ongoing == {committed_on_y.id, aborted_on_y.id}
        await on_x.snapshot()  # X's latest: both ongoing

        await move(x.service, y.service)
        await producer.send(b"a-y", txn=aborted_on_y)  # on Y now
        await committed_on_y.commit()
        await aborted_on_y.abort()
        async with client.transaction() as plain_txn:
            await producer.send(b"t-y", txn=plain_txn)
        await producer.send(b"p1")
        expected = [b"p0", b"c-x", b"t-y", b"p1"]
        assert await take(consumer, 4) == expected
        on_y = buffer(y.service)
        assert on_y.recovery["snapshot"] == 0 and not on_y.ongoing
        if trim:
            ledger = y.service.topics[NAME].ledger
            markers = ledger.last_confirmed
            assert markers is not None
            filler: list[bytes] = []
            while ledger.last_confirmed.ledger_id == markers.ledger_id:  # type: ignore[union-attr]
                filler.append(f"f{len(filler)}".encode())
                await producer.send(filler[-1])
            assert await take(consumer, len(filler)) == filler
            expected += filler

            async def trimmed_past_the_markers() -> bool:
                await y.service.topics[NAME].trim()
                first = ledger.first_position()
                return first is not None and first > markers

            await wait_until(trimmed_past_the_markers, timeout=10, what="Y trimming the markers")

        await move(y.service, x.service)
        await producer.send(b"p2")  # loads it on X again
        on_x = buffer(x.service)
        assert on_x.ongoing == set(), on_x.ongoing  # both ended on Y
        assert on_x.recovery["snapshot"] == (0 if trim else 1)
        late_committed, late_aborted = client.transaction(), client.transaction()
        await producer.send(b"a-late", txn=late_aborted)
        await producer.send(b"c-late", txn=late_committed)
        await late_aborted.abort()
        await late_committed.commit()
        after = [b"p2", b"c-late"]
        assert await take(consumer, 2) == after  # nothing stalls behind an ended transaction
        assert await rest(consumer) == []
        expected += after
        again = await client.subscribe(TOPIC, "again", initial_position="earliest")
        retained = await rest(again)  # what retention kept, in order, nothing aborted
        assert retained == (expected[-len(retained) :] if trim else expected)
        assert b"p2" in retained
