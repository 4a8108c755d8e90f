"""A transaction's writes record is written while its entries are synced, not after
(issue 16; segtxn/broker/txn/buffer.py): the record lands once the ledger has chosen the
entries' positions, and the send is answered once both are done. What that leaves to get
right: a write that moves to the next ledger after its record landed, and one that fails.

Each race is made on purpose: the ledger's write of a batch is held at a gate (a thread
event, as the write runs on a worker thread) after the positions are chosen."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

import pytest

from segtxn.client import Client, ErrorName, ServerError, TransactionFailed
from segtxn.ledger import ManagedLedger, Position
from segtxn.ledger.errors import LedgerUnwritable, NotEnoughReplicas
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.txn.test_ordered_redelivery import nothing_arrives
from tests.waiting import wait_until

TOPIC = "topic://acme/sync/orders"
SEGMENT = TopicName.parse("segment://acme/sync/orders/0")


def _ledger(cluster: Cluster) -> ManagedLedger:
    return cluster.broker.service.topics[SEGMENT].ledger


@contextlib.contextmanager
def _held_write(
    ledger: ManagedLedger, then: Callable[[Sequence[bytes]], None] | None = None
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold the next batch written to ``ledger``'s current log: (set once it is held, set to
    let it go); it then runs ``then`` instead of the write, if given. Let go at the end
    whatever happened (a held write would hold the broker's close)."""
    current = ledger._current
    assert current is not None
    original = current.append_batch
    held, gate = threading.Event(), threading.Event()

    def write(payloads: Sequence[bytes]) -> None:
        current.append_batch = original  # type: ignore[method-assign]  # the next batch
        held.set()
        gate.wait(30)
        (then or original)(payloads)

    current.append_batch = write  # type: ignore[method-assign]
    try:
        yield held, gate
    finally:
        gate.set()
        current.append_batch = original  # type: ignore[method-assign]


async def _writes_record(cluster: Cluster, txn: TxnId) -> T.WritesRecord | None:
    key = T.writes_key(txn, str(SEGMENT))
    record = await cluster.store.get(key)
    if record is None:
        return None
    decoded = T.decode_op(record.value)
    assert isinstance(decoded, T.WritesRecord)
    return decoded


async def _record_lands(cluster: Cluster, txn: TxnId) -> T.WritesRecord:
    found: list[T.WritesRecord] = []

    async def landed() -> bool:
        record = await _writes_record(cluster, txn)
        if record is not None:
            found.append(record)
        return record is not None

    await wait_until(landed, timeout=10, what="the writes record landing")
    return found[-1]


async def _held(held: threading.Event) -> None:
    await wait_until(held.is_set, timeout=10, what="the write being held")


async def test_the_writes_record_lands_while_its_entry_is_synced(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"plain")  # the segment is loaded
    ledger = _ledger(cluster)
    txn = await client.transaction().start()
    with _held_write(ledger) as (held, gate):
        sent = await producer.send_async(b"t", txn=txn)
        await _held(held)
        record = await _record_lands(cluster, txn.id)
        chosen = Position(*record.last)
        assert record.first == record.last
        last = ledger.last_confirmed
        assert last is not None and last < chosen  # not durable yet
        assert not sent.done()  # answered only once durable too
        gate.set()
        stored = await asyncio.wait_for(sent, 10)
    assert (stored.ledger_id, stored.entry_id) == (chosen.ledger_id, chosen.entry_id)
    await txn.commit()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [(await reader.receive(timeout_s=10)).value for _ in range(2)] == [b"plain", b"t"]
    await nothing_arrives(reader)


async def test_a_write_moved_to_the_next_ledger_after_its_record_landed_is_recorded_there(
    client: Client, cluster: Cluster
) -> None:
    """The record covers the position first chosen; the write then goes to the next ledger
    (the log took no more entries): a rewrite covers where it went before the send is
    answered, and the transaction's message is delivered once."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"plain")
    ledger = _ledger(cluster)

    def unwritable(_: Sequence[bytes]) -> None:
        raise LedgerUnwritable("too few replicas answered (test)")

    txn = await client.transaction().start()
    with _held_write(ledger, then=unwritable) as (held, gate):
        sent = await producer.send_async(b"t", txn=txn)
        await _held(held)
        first = await _record_lands(cluster, txn.id)
        gate.set()
        stored = await asyncio.wait_for(sent, 10)
    moved = Position(stored.ledger_id, stored.entry_id)
    assert moved.ledger_id > first.last[0]  # in the next ledger
    record = await _writes_record(cluster, txn.id)
    assert record is not None
    assert Position(*record.first) <= moved <= Position(*record.last)
    await txn.commit()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [(await reader.receive(timeout_s=10)).value for _ in range(2)] == [b"plain", b"t"]
    await nothing_arrives(reader)


async def test_a_write_that_fails_after_its_record_landed_leaves_nothing_behind(
    client: Client, cluster: Cluster
) -> None:
    """The record covers a position whose write then fails, and the segment is unloaded
    (reopening may cure it): the producer sends again to the reopened segment (a fresh
    ledger), where the record is extended. Aborted, nothing of the transaction is
    delivered, and its record, which also covers a position that holds nothing, is cleaned
    once the segment has moved past it."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"before")
    ledger = _ledger(cluster)

    def failing(_: Sequence[bytes]) -> None:
        raise NotEnoughReplicas("no storage node answered (test)")

    txn = await client.transaction().start()
    with _held_write(ledger, then=failing) as (held, gate):
        sent = await producer.send_async(b"aborted", txn=txn)
        await _held(held)
        dead = await _record_lands(cluster, txn.id)
        gate.set()
        stored = await asyncio.wait_for(sent, 10)  # sent again, to the reopened segment
    assert _ledger(cluster) is not ledger
    assert (stored.ledger_id, stored.entry_id) > dead.last
    record = await _writes_record(cluster, txn.id)
    assert record is not None and record.first == dead.first  # extended, not replaced
    await txn.abort()
    await producer.send(b"after")
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [(await reader.receive(timeout_s=10)).value for _ in range(2)] == [b"before", b"after"]
    await nothing_arrives(reader)

    async def cleaned() -> bool:
        return await _writes_record(cluster, txn.id) is None

    await wait_until(cleaned, timeout=10, what="the record cleaned")


async def test_a_moved_write_whose_rewrite_fails_is_an_orphan_and_its_record_is_cleaned(
    client: Client, cluster: Cluster
) -> None:
    """The record landed for the position first chosen; the write went to the next ledger
    and the rewrite that should cover it fails: the entry is an orphan (the send fails,
    nothing is delivered), and the record, which covers only a position that holds
    nothing, is still cleaned once the transaction is aborted."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"before")
    ledger = _ledger(cluster)

    def unwritable(_: Sequence[bytes]) -> None:
        cluster.faults.fail("txn", key_prefix="/txn-op/", times=1)  # the rewrite fails
        raise LedgerUnwritable("too few replicas answered (test)")

    txn = await client.transaction().start()
    with _held_write(ledger, then=unwritable) as (held, gate):
        sent = await producer.send_async(b"orphan", txn=txn)
        await _held(held)
        await _record_lands(cluster, txn.id)
        gate.set()
        with pytest.raises(ServerError) as failed:
            await asyncio.wait_for(sent, 10)
    assert failed.value.name is ErrorName.PERSISTENCE
    assert _ledger(cluster) is ledger  # the ledger moved on by itself: no reopening
    with pytest.raises(TransactionFailed):
        await txn.commit()
    await producer.send(b"after")
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [(await reader.receive(timeout_s=10)).value for _ in range(2)] == [b"before", b"after"]
    await nothing_arrives(reader)

    async def cleaned() -> bool:
        return await _writes_record(cluster, txn.id) is None

    await wait_until(cleaned, timeout=10, what="the record cleaned")
