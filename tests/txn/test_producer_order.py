"""A producer's order is storage order: pipelined sends, plain or transactional (v5 on a
segment, v4 on a persistent topic), across batch frames and reconnects, are stored in
sequence-id order (issue 14). Each race is provoked on purpose: store answers held and let
go in reverse (FaultInjector.hold), or a ledger write held at a gate; never with timers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from urllib.parse import quote

import pytest

from segtxn.broker.dedup import ProducerState
from segtxn.broker.topic import Topic
from segtxn.broker.txn import headers
from segtxn.client import Client, MessageId
from segtxn.client.producer import Producer
from segtxn.client.scalable import ScalableProducer
from segtxn.client.transaction import Transaction
from segtxn.ledger.managed import METADATA_PREFIX
from tests.cluster import Cluster
from tests.ledger.held import hold_writes
from tests.waiting import wait_until

SCALABLE = "topic://acme/order/events"
PLAIN = "persistent://acme/order/events"


def loaded(cluster: Cluster, topic: str) -> Topic:
    found = [t for n, t in cluster.broker.service.topics.items() if str(n) == topic]
    assert found, f"{topic} is not loaded"
    return found[0]


def state(cluster: Cluster, topic: str, producer: str) -> ProducerState:
    return loaded(cluster, topic).dedup.state(producer)


async def arrived(cluster: Cluster, topic: str, producer: str, seqs: Sequence[int]) -> None:
    """Wait until the broker has taken every one of ``seqs`` in (in flight or stored)."""
    st = state(cluster, topic, producer)
    await wait_until(
        lambda: all(s in st.in_flight or s <= st.last for s in seqs),
        what=f"sends {list(seqs)} reaching the broker",
    )


def assert_stored_in_send_order(ids: Sequence[MessageId]) -> None:
    """``ids`` are the receipts of sends in send order: their positions must increase."""
    positions = [(i.ledger_id, i.entry_id) for i in ids]
    for n, (before, after) in enumerate(itertools.pairwise(positions)):
        assert before < after, f"send {n + 1} stored at {after}, before send {n} at {before}"


async def read_all(client: Client, topic: str, count: int) -> list[bytes]:
    reader = await client.create_reader(topic, start="earliest")
    try:
        return [(await reader.receive(timeout_s=10)).value for _ in range(count)]
    finally:
        await reader.close()


def only_segment(producer: ScalableProducer) -> Producer:
    """The producer of the (only) segment ``producer`` has written to."""
    (inner,) = producer._producers.values()
    return inner


@pytest.fixture(autouse=True)
def header_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests here hold the broker's header reads to answer them out of order: it must not
    know the transactions from its watch beforehand (segtxn/broker/txn/headers.py)."""
    monkeypatch.setattr(headers, "RECENT_OPEN", 0)


# ---------------------------------------------------------------------- v5 (segments)


async def test_first_sends_of_a_transaction_are_stored_in_send_order(
    client: Client, cluster: Cluster
) -> None:
    """Issue 14: the first send of a transaction reads its header (a cache miss; sends of
    one transaction share that read, so each send here is in its own transaction); the
    store answers them in reverse, and plain sends pipelined after them need no read."""
    await client.admin.create_topic(SCALABLE, segments=1)
    producer = await client.create_producer(SCALABLE, name="p")
    assert isinstance(producer, ScalableProducer)
    await producer.send(b"warm-up", key="k")
    inner = only_segment(producer)
    segment = str(inner.topic)
    txns = [client.transaction() for _ in range(5)]
    for txn in txns:  # NEW_TXN and ADD_PARTITION done: no header reads left
        await txn.add_partition(SCALABLE)
    hold = cluster.faults.hold("range", key_prefix="/txn/", times=5)
    futures = [await producer.send_async(f"t{i}".encode(), key="k", txn=txns[i]) for i in range(5)]
    futures += [await producer.send_async(f"p{i}".encode(), key="k") for i in range(2)]
    await hold.wait_for(5)  # the five header reads, answered and parked
    await arrived(cluster, segment, inner.name, range(1, 8))
    hold.release(4, 3, 2, 1, 0)  # answered last-sent first
    ids = await asyncio.gather(*futures)
    assert_stored_in_send_order(ids)
    for txn in txns:
        await txn.commit()
    values = await read_all(client, segment, 8)
    assert values == [b"warm-up", *(f"t{i}".encode() for i in range(5)), b"p0", b"p1"]


async def test_a_reconnected_producer_queues_behind_its_old_connection(
    client: Client, cluster: Cluster
) -> None:
    """The old connection's transactional sends wait for their header reads; the connection
    drops; the producer sends them again (duplicates: they wait for the originals) and new
    plain ones on the new connection. The new ones are stored after the old ones."""
    await client.admin.create_topic(SCALABLE, segments=1)
    producer = await client.create_producer(SCALABLE, name="p")
    assert isinstance(producer, ScalableProducer)
    await producer.send(b"warm-up", key="k")
    inner = only_segment(producer)
    segment = str(inner.topic)
    txns = [client.transaction() for _ in range(3)]  # one header read each (see above)
    for txn in txns:
        await txn.add_partition(SCALABLE)
    hold = cluster.faults.hold("range", key_prefix="/txn/", times=3)
    futures = [await producer.send_async(f"t{i}".encode(), key="k", txn=txns[i]) for i in range(3)]
    await hold.wait_for(3)
    await arrived(cluster, segment, inner.name, range(1, 4))
    old = loaded(cluster, segment).producers[inner.name]
    await old.close(code=1001, message=b"dropped by the test")  # type: ignore[attr-defined]
    await wait_until(lambda: inner.reconnects >= 1, what="the producer reconnecting")
    futures += [await producer.send_async(f"p{i}".encode(), key="k") for i in range(3)]
    await arrived(cluster, segment, inner.name, range(4, 7))  # on the new connection
    hold.release(2, 1, 0)
    ids = await asyncio.gather(*futures)
    assert_stored_in_send_order(ids)
    for txn in txns:
        await txn.commit()
    values = await read_all(client, segment, 7)
    assert values == [b"warm-up", b"t0", b"t1", b"t2", b"p0", b"p1", b"p2"]


async def test_hundreds_of_pipelined_sends_in_and_out_of_transactions_keep_their_order(
    client: Client, cluster: Cluster
) -> None:
    """v5: plain sends and sends of several open transactions, interleaved, all pipelined
    (batch frames, op-record batches); every new transaction's first sends miss the header
    cache, and those reads are answered in reverse."""
    await client.admin.create_topic(SCALABLE, segments=1)
    producer = await client.create_producer(SCALABLE, name="p", max_pending=500)
    assert isinstance(producer, ScalableProducer)
    txns = [client.transaction() for _ in range(3)]
    for txn in txns:
        await txn.add_partition(SCALABLE)
    hold = cluster.faults.hold("range", key_prefix="/txn/", times=3)
    choices = itertools.cycle([None, txns[0], txns[1], None, txns[2], txns[0]])
    futures = []
    for i, chosen in zip(range(400), choices, strict=False):
        futures.append(await producer.send_async(f"m{i}".encode(), key="k", txn=chosen))
    await hold.wait_for(3)  # one first read of each transaction
    hold.release(2, 1, 0)
    ids = await asyncio.gather(*futures)
    assert_stored_in_send_order(ids)
    for txn in txns:
        await txn.commit()
    values = await read_all(client, ids[0].topic, 400)
    assert values == [f"m{i}".encode() for i in range(400)]


# ---------------------------------------------------------------------- v4 (persistent)


async def v4_producer(client: Client, cluster: Cluster) -> tuple[Producer, Transaction]:
    await client.admin.create_topic(PLAIN)
    producer = await client.create_producer(PLAIN, name="p")
    assert isinstance(producer, Producer)
    txn = client.transaction()
    await txn.add_partition(PLAIN)
    return producer, txn


async def test_a_v4_send_waiting_for_pip_373s_property_is_not_overtaken(
    client: Client, cluster: Cluster
) -> None:
    """The topic's first transactional send writes ``__contains_txn_messages`` first; a
    plain send pipelined after it does not wait for that, unless it waits its turn."""
    producer, txn = await v4_producer(client, cluster)
    hold = cluster.faults.hold("txn", key_prefix=METADATA_PREFIX + quote(PLAIN, safe=""))
    futures = [
        await producer.send_async(b"t0", txn=txn),
        await producer.send_async(b"p0"),
        await producer.send_async(b"t1", txn=txn),
    ]
    await hold.wait_for(1)  # the property is written; its answer is parked
    await arrived(cluster, PLAIN, "p", range(3))
    hold.release()
    ids = await asyncio.gather(*futures)
    assert_stored_in_send_order(ids)
    await txn.commit()
    assert await read_all(client, PLAIN, 3) == [b"t0", b"p0", b"t1"]


async def test_a_v4_transaction_does_not_hold_its_producer_to_one_write_at_a_time(
    client: Client, cluster: Cluster
) -> None:
    """A v4 send used to hold its transaction's lock until durable: the next send of the
    transaction waited for the write, and a plain send behind it went first."""
    producer, txn = await v4_producer(client, cluster)
    await producer.send(b"t0", txn=txn)  # PIP-373's property is written: no wait left
    ledger = loaded(cluster, PLAIN).ledger
    gate = hold_writes(ledger)
    try:
        futures = [
            await producer.send_async(b"t1", txn=txn),
            await producer.send_async(b"t2", txn=txn),
            await producer.send_async(b"p0"),
        ]
        await arrived(cluster, PLAIN, "p", range(1, 4))
    finally:
        gate.set()
    ids = await asyncio.gather(*futures)
    assert_stored_in_send_order(ids)
    await txn.commit()
    assert await read_all(client, PLAIN, 4) == [b"t0", b"t1", b"t2", b"p0"]


async def test_hundreds_of_pipelined_v4_sends_in_and_out_of_transactions_keep_their_order(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(PLAIN)
    producer = await client.create_producer(PLAIN, name="p", max_pending=500)
    txns = [client.transaction() for _ in range(3)]
    for txn in txns:
        await txn.add_partition(PLAIN)
    choices = itertools.cycle([None, txns[0], txns[1], None, txns[2], txns[0]])
    futures = []
    for i, chosen in zip(range(400), choices, strict=False):
        futures.append(await producer.send_async(f"m{i}".encode(), txn=chosen))
    ids = await asyncio.gather(*futures)
    assert_stored_in_send_order(ids)
    for txn in txns:
        await txn.commit()
    assert await read_all(client, PLAIN, 400) == [f"m{i}".encode() for i in range(400)]


# ---------------------------------------------------------------------- client (scalable)


async def test_a_transactions_sends_keep_per_key_order_across_a_split(
    client: Client, cluster: Cluster
) -> None:
    """A send of a transaction waits (its header read is held) while its segment is split;
    then it is refused (sealed) and goes again to the child, ahead of the key's later sends.
    From the moment the segment producer forgets the refused send, the scalable producer is
    in transition (new sends queue behind the re-send): there is no gap in between."""
    await client.admin.create_topic(SCALABLE, segments=1)
    producer = await client.create_producer(SCALABLE, name="p")
    assert isinstance(producer, ScalableProducer)
    await producer.send(b"warm-up", key="k")
    parent = only_segment(producer)
    txn = client.transaction()
    await txn.add_partition(SCALABLE)
    hold = cluster.faults.hold("range", key_prefix="/txn/")
    first = await producer.send_async(b"k0", key="k", txn=txn)
    await hold.wait_for(1)
    await client.admin.split(SCALABLE, 0)  # seals the parent: nothing of the txn is queued
    in_transition: list[bool] = []
    settle = parent._settle

    def spy(seq: int, **outcome: object) -> None:
        settle(seq, **outcome)  # type: ignore[arg-type]
        if outcome.get("error") is not None:
            in_transition.append(producer._in_transition())

    parent._settle = spy  # type: ignore[method-assign]
    hold.release()  # the send goes on to the sealed ledger and is refused
    await wait_until(lambda: bool(in_transition), what="the refusal")
    futures = [first]
    for i in range(1, 60):
        key = "k" if i % 2 else f"other-{i}"
        futures.append(await producer.send_async(f"{key}:{i}".encode(), key=key, txn=txn))
    ids = await asyncio.gather(*futures)
    assert in_transition == [True], "the refused send was not seen as in transition"
    assert producer.reroutes >= 1 and ids[0].topic != str(parent.topic)
    keyed = [ids[i] for i in range(60) if i == 0 or i % 2]
    assert {i.topic for i in keyed} == {ids[0].topic}  # one child covers "k"
    assert_stored_in_send_order(keyed)
    await txn.commit()
    consumer = await client.subscribe(SCALABLE, "check", initial_position="earliest")
    got: list[bytes] = []
    while len(got) < 61:
        message = await consumer.receive(timeout_s=10)
        await consumer.acknowledge(message)
        got.append(message.value)
    assert [v for v in got if v == b"k0" or v.startswith(b"k:")] == [
        b"k0",
        *(f"k:{i}".encode() for i in range(1, 60, 2)),
    ]
