"""A segment's transaction buffer at its edges: the read horizon when one transaction's runs
of appends land out of order, a decision that stands when its header is collected before
the segment cleaned up, and an unsettled orphan whose ledger is trimmed. Each scenario is
made on purpose (a held producer turn, a forced GC, a refused store write); each test failed
before its fix."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.broker.ordering import Turn
from segtxn.broker.txn.buffer import MetadataTransactionBuffer
from segtxn.broker.txn.buffer_records import ORPHANS
from segtxn.client import Client, Message
from segtxn.client.consumer import Consumer
from segtxn.ledger import Position
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/review/orders"
SEGMENT = TopicName.parse("segment://acme/review/orders/0")


async def receive_all(consumer: Consumer, n: int) -> list[Message]:
    return [await consumer.receive(timeout_s=10) for _ in range(n)]


def _entry(txn: TxnId, producer: str, seq: int, value: bytes) -> bytes:
    return encode_entry(StoredMessage(producer, seq, 0, value, txn=(txn.most, txn.least)))


def _free_turn() -> Turn:
    return Turn(None, asyncio.get_running_loop().create_future())


async def test_an_earlier_entry_recorded_after_a_later_one_still_holds_the_horizon(
    client: Client, cluster: Cluster
) -> None:
    """Two runs of one transaction on one segment (two producers, or a run whose second
    entry waits for its producer's turn): run Y's first entry is at p1, run Z's only entry
    at p2 > p1, and Z is recorded first. The horizon must stay before p1 while the
    transaction is OPEN. It moved to p2 once Y's floor went: the dispatcher found p1 not
    visible, acked it past as never shown, and the committed entry was never delivered."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"plain")
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [m.value for m in await receive_all(reader, 1)] == [b"plain"]
    buffer = cluster.broker.service.topics[SEGMENT].buffer
    assert isinstance(buffer, MetadataTransactionBuffer)
    ledger = cluster.broker.service.topics[SEGMENT].ledger
    txn = await client.transaction().start()
    loop = asyncio.get_running_loop()
    earlier_send = loop.create_future()  # an earlier send of producer "y", not yet queued
    y = asyncio.ensure_future(
        buffer.append_together(
            txn.id,
            [
                (_entry(txn.id, "y", 0, b"y0"), _free_turn()),
                (_entry(txn.id, "y", 1, b"y1"), Turn(earlier_send, loop.create_future())),
            ],
        )
    )
    await wait_until(lambda: ledger.last_confirmed == Position(1, 1), what="y0 durable")
    (z,) = await buffer.append_together(txn.id, [(_entry(txn.id, "z", 0, b"z0"), _free_turn())])
    assert isinstance(z, Position)
    earlier_send.set_result(None)
    y0, y1 = await y
    assert isinstance(y0, Position) and isinstance(y1, Position) and y0 < z < y1
    horizon = buffer.max_read_position
    assert horizon is not None
    assert horizon < y0, f"the horizon {horizon} passed {y0}, an entry of an OPEN transaction"
    await txn.commit()
    got = [m.value for m in await receive_all(reader, 3)]
    assert got == [b"y0", b"z0", b"y1"]


async def test_a_committed_transaction_stays_visible_when_its_header_is_force_collected(
    client: Client, cluster: Cluster
) -> None:
    """The broker materialized T1 COMMITTED but cannot clean it yet (an older open
    transaction holds the segment's horizon), and the coordinator's GC, with
    ``abandon_after_s`` on, force-deletes T1's op records and header. T1 stays visible: the
    header cache's None was taken for an abort (written to the abort index at clean-up),
    and committed data already delivered was hidden for good."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    older = await client.transaction().start()
    await producer.send(b"older", txn=older)
    committed = await client.transaction().start()
    p1 = await producer.send(b"committed", txn=committed)
    await committed.commit()
    buffer = cluster.broker.service.topics[SEGMENT].buffer
    assert isinstance(buffer, MetadataTransactionBuffer)
    await wait_until(lambda: committed.id in buffer._cleanable, what="T1 materialized")
    coordinator = cluster.coordinator.coordinator
    coordinator.settings = dataclasses.replace(coordinator.settings, abandon_after_s=0.001)
    await coordinator.sweep_gc(now_ms=int(time.time() * 1000) + 60_000)
    assert await cluster.store.get(T.header_key(committed.id)) is None  # collected
    await older.abort()
    await producer.send(b"after")
    got = [m.value for m in await receive_all(reader, 1)]
    position = Position(p1.ledger_id, p1.entry_id)
    assert got == [b"committed"], (
        f"received {got} first: the committed entry at {position} is hidden "
        f"(visible={buffer.visible(committed.id, position)}, "
        f"aborted index: {committed.id in buffer._aborted})"
    )


async def test_an_unsettled_orphan_of_a_trimmed_ledger_is_forgotten(
    client: Client, cluster: Cluster
) -> None:
    """An orphan whose record the store refused stays unsettled, holding the read horizon
    before it. Once its ledger is trimmed it is forgotten with the settled ones: it held
    the horizon before entries that are gone, and its record would have been written after
    them."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"plain")
    buffer = cluster.broker.service.topics[SEGMENT].buffer
    assert isinstance(buffer, MetadataTransactionBuffer)
    orphans = buffer._orphans
    txn = await client.transaction().start()
    cluster.faults.fail("txn", key_prefix=ORPHANS)  # its record is refused: unsettled
    await orphans.add(txn.id, Position(1, 0))
    assert orphans.unsettled
    assert orphans.floor() == Position(1, -1)
    await orphans.trimmed(Position(2, -1))  # ledger 1 is trimmed
    assert not orphans.unsettled
    assert orphans.floor() is None
    assert Position(1, 0) not in orphans
    await txn.abort()
