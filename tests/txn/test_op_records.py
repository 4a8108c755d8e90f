"""Op records per transaction and segment (issue 16): what a transaction leaves in the store
while open, that a step in flight collects what arrives meanwhile, that a failed record
refuses the rest of its transaction's writes there, chunked acks, and shared header reads.

Each test makes the interleaving it needs with ``cluster.faults.hold`` (the store's answer
to a chosen call is parked until the test lets it go)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from segtxn.broker.txn import oprecords
from segtxn.broker.txn.buffer import MetadataTransactionBuffer
from segtxn.broker.txn.headers import HeaderCache
from segtxn.client import (
    Client,
    ErrorName,
    Message,
    ScalableProducer,
    ServerError,
    TransactionFailed,
)
from segtxn.client.consumer import Consumer
from segtxn.client.timeouts import Deadline
from segtxn.client.transaction import Transaction, TransactionState
from segtxn.ledger import Position
from segtxn.ledger.fencing import OutcomeUnknown
from segtxn.ledger.metadata import metadata_key
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnAction, TxnId
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/ops/orders"
OUT = "topic://acme/ops/out"
SEGMENT = TopicName.parse("segment://acme/ops/orders/0")
OUT_SEGMENT = TopicName.parse("segment://acme/ops/out/0")
OUT2 = "topic://acme/ops/out2"
OUT2_SEGMENT = TopicName.parse("segment://acme/ops/out2/0")


async def op_records(cluster: Cluster, txn_id: str) -> dict[str, T.OpRecord]:
    txn = TxnId.parse(txn_id)
    listing = await cluster.store.list_prefix(T.ops_prefix(txn))
    return {r.key[len(T.ops_prefix(txn)) :]: T.decode_op(r.value) for r in listing.records}


async def receive_all(consumer: Consumer, n: int) -> list[Message]:
    return [await consumer.receive(timeout_s=10) for _ in range(n)]


async def test_a_transaction_leaves_one_writes_record_per_segment(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()
    ids = await asyncio.gather(
        *[await producer.send_async(f"m{i}".encode(), txn=txn) for i in range(30)]
    )
    records = await op_records(cluster, str(txn.id))
    assert len(records) == 1, records  # not 30
    (record,) = records.values()
    assert isinstance(record, T.WritesRecord)
    positions = sorted((i.ledger_id, i.entry_id) for i in ids)
    assert record.first == positions[0] and record.last == positions[-1]
    await txn.commit()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [m.value for m in await receive_all(reader, 30)] == [f"m{i}".encode() for i in range(30)]


async def test_writes_arriving_during_a_step_share_the_next_one(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()
    held = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1)
    first = await producer.send_async(b"first", txn=txn)
    await held.wait_for(1)  # the first step is in flight, parked
    rest = [await producer.send_async(f"r{i}".encode(), txn=txn) for i in range(20)]
    writer = cluster.broker.service.op_records
    ledger = cluster.broker.service.topics[SEGMENT].ledger

    def all_appended_and_waiting() -> bool:  # in one batch or several, each one waiter
        last = ledger.last_confirmed
        return last is not None and last.entry_id == 20 and writer.waiting(txn.id) >= 1

    await wait_until(all_appended_and_waiting, timeout=10, what="the twenty appends, waiting")
    steps = cluster.faults.count("txn", key_prefix="/txn-op/")
    held.release(0)
    await asyncio.gather(first, *rest)
    assert 1 <= steps.calls <= 2, steps  # twenty appends, one more step (a retry at most)
    await txn.commit()


async def test_a_failed_record_refuses_the_transactions_later_writes_there(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    txn = await client.transaction().start()
    await producer.send(b"good", txn=txn)
    cluster.faults.fail("txn", key_prefix="/txn-op/", times=1)  # the store did not answer
    with pytest.raises(ServerError) as failed:
        await producer.send(b"lost", txn=txn)
    # the store's trouble, not "stored data is damaged or missing" (PersistenceError)
    assert failed.value.name is ErrorName.SERVICE_NOT_READY
    assert "could not record the op" in failed.value.message
    # The broker refuses to extend that record again, whatever the client does: a second
    # handle on the same id (as a client that ignores the failure would) says so.
    raw = Transaction(txn._coordinators, 60)
    raw._id, raw.state = txn.id, TransactionState.OPEN
    with pytest.raises(ServerError) as again:
        await producer.send(b"later", txn=raw)
    assert "could not be written" in again.value.message
    with pytest.raises(TransactionFailed):
        await txn.commit()
    await producer.send(b"plain")
    assert [m.value for m in await receive_all(reader, 1)] == [b"plain"]


async def test_acks_are_ranges_and_roll_over_to_new_chunks(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(T, "MAX_ACKS_PER_RECORD", 4)
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(10):
        await producer.send(f"m{i}".encode())
    consumer = await client.subscribe(
        TOPIC, "s", initial_position="earliest", subscription_type="Shared"
    )
    messages = await receive_all(consumer, 10)
    txn = await client.transaction().start()
    for m in messages[:9]:  # one at a time: each goes to the chunk open then
        await consumer.acknowledge(m, txn=txn)
    records = await op_records(cluster, str(txn.id))
    chunks = [r for r in records.values() if isinstance(r, T.AcksRecord)]
    assert len(chunks) == 3, records  # 4 + 4 + 1
    ranges = [(r.ledger_id, r.first_entry, r.last_entry) for c in chunks for r in c.ranges]
    assert sum(last - first + 1 for _, first, last in ranges) == 9
    await txn.commit()
    await consumer.close()
    again = await client.subscribe(
        TOPIC, "s", initial_position="earliest", subscription_type="Shared"
    )
    (left,) = await receive_all(again, 1)  # the nine are acknowledged, the tenth is not
    assert left.value == b"m9"


async def test_a_header_read_in_flight_is_shared(cluster: Cluster) -> None:
    cache = HeaderCache(cluster.store)
    await cache.start()
    try:
        txn_id = TxnId(0x5_0000, 77)  # no such header: the read answers "absent"
        held = cluster.faults.hold("range", key_prefix=T.header_key(txn_id), times=1)
        reads = cluster.faults.count("range", key_prefix=T.header_key(txn_id))
        readers = [asyncio.ensure_future(cache.get(txn_id)) for _ in range(50)]
        await held.wait_for(1)
        held.release(0)
        assert await asyncio.gather(*readers) == [(None, 0)] * 50
        assert reads.calls == 1
    finally:
        await cache.close()


async def test_clean_up_is_batched_across_segments_and_transactions(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=4)
    producer = await client.create_producer(TOPIC)
    txns = [await client.transaction().start() for _ in range(8)]
    for txn in txns:
        await asyncio.gather(
            *[await producer.send_async(b"m", key=f"k{i}", txn=txn) for i in range(16)]
        )
    for txn in txns:
        assert len(await op_records(cluster, str(txn.id))) == 4  # one per segment
    steps = cluster.faults.count("txn", key_prefix="/txn-buffer/")  # each carries a watermark
    await asyncio.gather(*(t.commit() for t in txns))

    async def cleaned() -> bool:
        return not (await cluster.store.list_prefix(T.OPS)).records

    await wait_until(cleaned, timeout=10, what="every writes record deleted")
    # 32 segment clean-ups (8 transactions x 4 segments); alone, each would be a step or two.
    assert 1 <= steps.calls <= 16, steps


async def test_records_whose_delete_failed_are_deleted_later(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"m")
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    message = await consumer.receive(timeout_s=10)
    txn = await client.transaction().start()
    await consumer.acknowledge(message, txn=txn)
    assert len(await op_records(cluster, str(txn.id))) == 1
    injected = cluster.faults.injected
    cluster.faults.fail("txn", key_prefix="/txn-op/", times=1)  # the first delete fails
    await txn.commit()

    async def deleted() -> bool:
        return not await op_records(cluster, str(txn.id))

    await wait_until(deleted, timeout=10, what="the acks record deleted after a retry")
    assert cluster.faults.injected == injected + 1


async def test_the_first_send_finds_the_header_the_watch_reported(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    await producer.send(b"warm-up")
    cache = cluster.broker.service.headers
    txn = await client.transaction().start()
    await wait_until(lambda: cache.cached(txn.id) is not None, what="the watch reporting it")
    reads = cluster.faults.count("range", key_prefix=T.HEADERS)
    await producer.send(b"m", txn=txn)
    assert reads.calls == 0  # no header read on the send path
    await txn.commit()


async def test_a_step_that_fails_unexpectedly_fails_its_sends_instead_of_hanging(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()

    def broken(record: T.OpRecord) -> dict[str, str]:
        raise RuntimeError("a bug in building the step")

    monkeypatch.setattr(T, "op_indexes", broken)
    async with asyncio.timeout(10):  # not forever
        with pytest.raises(ServerError) as failed:
            await producer.send(b"m", txn=txn)
    assert failed.value.name is ErrorName.UNKNOWN
    monkeypatch.undo()
    await txn.abort()


@contextlib.asynccontextmanager
async def _holding_appends(
    cluster: Cluster, segment: TopicName
) -> AsyncIterator[tuple[asyncio.Event, asyncio.Event]]:
    """Park ``segment``'s ledger writes: (set once one is parked, set to let them go); let
    them go at the end whatever happened (a parked write would hold the broker's close)."""
    writer = cluster.broker.service.topics[segment].ledger._writer
    original = writer._write
    parked, gate = asyncio.Event(), asyncio.Event()

    async def held(batch: list[bytes]) -> list[Position]:
        parked.set()
        await gate.wait()
        return await original(batch)

    writer._write = held
    try:
        yield parked, gate
    finally:
        gate.set()


async def _consumed(client: Client) -> tuple[Consumer, Message, ScalableProducer]:
    """A message received from TOPIC, and a producer on OUT that has sent ``warm-up``."""
    await client.admin.create_topic(TOPIC, segments=1)
    await client.admin.create_topic(OUT, segments=1)
    await (await client.create_producer(TOPIC)).send(b"in")
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    (message,) = await receive_all(consumer, 1)
    out = await client.create_producer(OUT)
    assert isinstance(out, ScalableProducer)
    await out.send(b"warm-up")  # OUT's segment is loaded
    return consumer, message, out


async def test_an_ack_waits_for_its_transactions_appends_and_shares_their_step(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consume-transform-produce: the ack's record is ready before the send's entry is
    durable; it waits for it, and both records land in one store step, not two in turn."""
    monkeypatch.setattr(oprecords, "APPEND_WAIT_S", 30.0)
    consumer, message, out = await _consumed(client)
    txn = await client.transaction().start()
    steps = cluster.faults.count("txn", key_prefix="/txn-op/")
    async with _holding_appends(cluster, OUT_SEGMENT) as (parked, gate):
        sent = await out.send_async(b"out", txn=txn)
        await asyncio.wait_for(parked.wait(), 10)  # the send's entry is being written
        acked = asyncio.ensure_future(consumer.acknowledge(message, txn=txn))
        writer = cluster.broker.service.op_records
        await wait_until(lambda: writer.waiting(txn.id) == 1, timeout=10, what="the ack waiting")
        assert steps.calls == 0  # it waits for the append instead of taking a step alone
        gate.set()
        await asyncio.gather(sent, acked)
    assert steps.calls == 1
    records = await op_records(cluster, str(txn.id))
    assert sorted(type(r).__name__ for r in records.values()) == ["AcksRecord", "WritesRecord"]
    await txn.commit()


async def test_a_step_waits_only_for_the_appends_in_flight_when_it_began(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that keeps sending does not hold its records back: appends that start
    while a step waits for earlier ones are not waited for."""
    monkeypatch.setattr(oprecords, "APPEND_WAIT_S", 30.0)
    consumer, message, out = await _consumed(client)
    await client.admin.create_topic(OUT2, segments=1)
    out2 = await client.create_producer(OUT2)
    await out2.send(b"warm-up")
    txn = await client.transaction().start()
    writer = cluster.broker.service.op_records
    async with (
        _holding_appends(cluster, OUT_SEGMENT) as (parked, gate),
        _holding_appends(cluster, OUT2_SEGMENT) as (parked2, gate2),
    ):
        first = await out.send_async(b"first", txn=txn)
        await asyncio.wait_for(parked.wait(), 10)
        acked = asyncio.ensure_future(consumer.acknowledge(message, txn=txn))
        # (the step for the ack starts waiting, for `first`, before this poll returns:
        # asyncio runs callbacks in the order they were scheduled)
        await wait_until(lambda: writer.waiting(txn.id) == 1, timeout=10, what="the ack waiting")
        second = await out2.send_async(b"second", txn=txn)
        await asyncio.wait_for(parked2.wait(), 10)  # a run that began after the step
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, acked), 10)  # not held back by `second`
        assert not second.done()
        gate2.set()
        await second
    await txn.commit()


async def test_an_entry_whose_record_lands_after_the_commit_is_an_orphan(
    client: Client, cluster: Cluster
) -> None:
    """The late-write race: the entry is durable, but the step covering it reaches the
    store only after END_TXN (a client that commits without waiting for its send). The
    step's header check fails, the entry is an orphan, the send fails, and the committed
    transaction shows only what was recorded in time."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    txn = await client.transaction().start()
    await producer.send(b"in time", txn=txn)
    step = cluster.faults.hold("txn", key_prefix=T.writes_key(txn.id, str(SEGMENT)), before=True)
    ledger = cluster.broker.service.topics[SEGMENT].ledger
    before = ledger.last_confirmed
    late = await producer.send_async(b"late", txn=txn)
    await step.wait_for(1)  # the step covering it, on its way to the store
    await wait_until(lambda: ledger.last_confirmed != before, timeout=10, what="late, durable")
    position = ledger.last_confirmed
    assert position is not None
    await txn._end(TxnAction.COMMIT, Deadline(10))  # END_TXN without waiting for the send
    step.release()
    with pytest.raises(ServerError) as refused:
        await late
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT
    buffer = cluster.broker.service.topics[SEGMENT].buffer
    assert isinstance(buffer, MetadataTransactionBuffer) and buffer.is_orphan(position)
    await producer.send(b"after")
    got = [await consumer.receive(timeout_s=10) for _ in range(2)]
    assert [m.value for m in got] == [b"in time", b"after"]  # never "late"


async def test_an_ack_does_not_wait_long_for_an_append_that_hangs(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait is bounded: a slow disk delays only the send whose entry it holds."""
    monkeypatch.setattr(oprecords, "APPEND_WAIT_S", 0.05)
    consumer, message, out = await _consumed(client)
    txn = await client.transaction().start()
    async with _holding_appends(cluster, OUT_SEGMENT) as (parked, gate):
        sent = await out.send_async(b"out", txn=txn)
        await asyncio.wait_for(parked.wait(), 10)
        await asyncio.wait_for(consumer.acknowledge(message, txn=txn), 10)  # while it is held
        assert not sent.done()
        gate.set()
        await sent
    await txn.commit()
    await consumer.close()
    again = await client.subscribe(TOPIC, "s", initial_position="earliest")
    reader = await client.subscribe(OUT, "r", initial_position="earliest")
    assert [m.value for m in await receive_all(reader, 2)] == [b"warm-up", b"out"]
    with pytest.raises(asyncio.TimeoutError):  # the ack committed with the send
        await again.receive(timeout_s=0.5)


async def test_a_rollover_during_a_step_is_not_taken_for_another_owner(
    client: Client, cluster: Cluster
) -> None:
    """A step is conditional on the segment's ledger metadata at the version this broker
    last wrote; its own rollover changed it meanwhile: the step is tried again, and lands."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    txn = await client.transaction().start()
    await producer.send(b"first", txn=txn)
    held = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1, before=True)
    second = await producer.send_async(b"second", txn=txn)
    await held.wait_for(1)  # the step is built (with the ledger's version), not yet sent
    await cluster.broker.service.topics[SEGMENT].ledger.roll_over()
    held.release(0)
    await second
    await txn.commit()
    assert [m.value for m in await receive_all(reader, 2)] == [b"first", b"second"]


async def test_a_step_is_refused_once_another_broker_opened_the_segments_ledger(
    client: Client, cluster: Cluster
) -> None:
    """As a broker paused past its session finds it when it resumes: another broker took
    the segment over, whose recovery changed its ledger's metadata record (and then read
    the op records, taking what they do not cover for orphans). A record written now would
    land after that: it is refused, the send fails, and the transaction cannot commit. (The
    segment is unloaded from this broker too, its producer hung up on: the refusal reaches
    it, or its resend is refused where the segment is served now, as never recorded.)"""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()
    await producer.send(b"first", txn=txn)
    held = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1, before=True)
    second = await producer.send_async(b"second", txn=txn)
    await held.wait_for(1)
    key = metadata_key(str(SEGMENT))
    record = await cluster.store.get(key)
    assert record is not None
    await cluster.store.put(key, record.value, expected_version=record.version)  # "recovered"
    held.release(0)
    with pytest.raises(ServerError) as refused:
        await second
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT
    said = refused.value.message
    assert "is not served by this broker any more" in said or "never recorded" in said, said
    with pytest.raises(TransactionFailed):
        await txn.commit()


async def test_a_step_that_cannot_tell_whose_ledger_change_it_met_is_a_store_error(
    client: Client, cluster: Cluster
) -> None:
    """The segment's ledger's own change of its record is in doubt (landed, its answer and
    read-back lost) as a step built on the version before it is refused, and the store then
    fails the read that would tell that change from another broker's: the send gets the
    store's trouble (ServiceNotReady, retriable: nothing was decided), not "not served by
    this broker any more" (TransactionConflict) for a take-over that never happened. The
    segment stays served here: once the store answers, the ledger takes its change up and
    a new transaction's sends are recorded."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()
    await producer.send(b"first", txn=txn)
    held = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1, before=True)
    second = await producer.send_async(b"second", txn=txn)
    await held.wait_for(1)  # the step is built (with the ledger's version), not yet sent
    ledger = cluster.broker.service.topics[SEGMENT].ledger
    key = metadata_key(str(SEGMENT))
    cluster.faults.fail("txn", key_prefix=key, after_apply=True)  # its own change, in doubt
    cluster.faults.fail("range", key_prefix=key, times=None)  # and the record unreadable
    with pytest.raises(OutcomeUnknown):
        await ledger.update_properties({"changed": "yes"})
    held.release(0)
    with pytest.raises(ServerError) as refused:
        await second
    assert refused.value.name is ErrorName.SERVICE_NOT_READY, refused.value
    assert "could not tell whether" in refused.value.message, refused.value.message
    assert "not served by this broker any more" not in refused.value.message
    cluster.faults.clear()
    await txn.abort()  # (its client gives it up: it cannot commit without "second")

    again = await client.transaction().start()
    await producer.send(b"third", txn=again)  # recorded: the segment is still served here
    await again.commit()
    assert ledger.properties.get("changed") == "yes"  # its own change, taken up
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert (await reader.receive(timeout_s=10)).value == b"third"
