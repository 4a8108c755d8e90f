"""Sends of one transaction that arrive together in a ``send_batch`` are published together
(Publishing.publish_txn, MetadataTransactionBuffer.append_together): one header check and
one request to record them all, each still answered on its own, in the producer's order,
with de-duplication and refusals per send."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from segtxn.broker.publishing import Publishing
from segtxn.broker.topic import Topic
from segtxn.broker.txn.buffer import MetadataTransactionBuffer
from segtxn.client import Client, Message
from segtxn.client.consumer import Consumer
from segtxn.ledger import Position
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import Error, ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until
from tests.wsframes import next_frame

TOPIC = "topic://acme/together/orders"
SEGMENT = TopicName.parse("segment://acme/together/orders/0")


@asynccontextmanager
async def raw_producer(
    cluster: Cluster, name: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    url = f"{cluster.broker.settings.advertise_url}/ws/v2/producer/{SEGMENT.path}?name={name}"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        yield ws


async def answers(ws: aiohttp.ClientWebSocketResponse, count: int) -> dict[int, frames.Frame]:
    got: dict[int, frames.Frame] = {}
    for _ in range(count):
        frame = await next_frame(ws)
        assert isinstance(frame, Receipt | Error), frame
        assert frame.seq is not None and frame.seq not in got, frame
        got[frame.seq] = frame
    return got


async def send_batch(ws: aiohttp.ClientWebSocketResponse, *sends: Send) -> None:
    await ws.send_bytes(frames.encode(SendBatch(sends=list(sends))))


async def receive_all(consumer: Consumer, n: int) -> list[Message]:
    return [await consumer.receive(timeout_s=10) for _ in range(n)]


async def test_a_transactions_batch_is_recorded_in_one_step(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    txn = await client.transaction().start()
    steps = cluster.faults.count("txn", key_prefix="/txn-op/")
    writer = cluster.broker.service.op_records
    writes: list[object] = []
    original = writer.write

    async def counted(*args: Any, **kwargs: Any) -> None:
        writes.append(args)
        await original(*args, **kwargs)

    monkeypatch.setattr(writer, "write", counted)
    async with raw_producer(cluster, "p") as ws:
        await send_batch(ws, *(Send(seq=i, payload=b"%d" % i, txn=txn.wire_id) for i in range(30)))
        got = await answers(ws, 30)
    receipts = [got[i] for i in range(30)]
    assert all(isinstance(r, Receipt) and not r.duplicate for r in receipts), receipts
    ids = [r.message_id for r in receipts if isinstance(r, Receipt)]
    assert ids == sorted(ids) and len(set(ids)) == 30  # stored in send order
    assert len(writes) == 1  # a send at a time: each asked for the record to cover it
    assert steps.calls == 1
    await txn.commit()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [m.value for m in await receive_all(reader, 30)] == [b"%d" % i for i in range(30)]


async def test_runs_of_two_transactions_and_plain_sends_in_one_batch(
    client: Client, cluster: Cluster
) -> None:
    """Consecutive sends of one transaction go together; each run keeps its place in the
    producer's order, and each transaction's outcome applies to its own sends only."""
    await client.admin.create_topic(TOPIC, segments=1)
    kept = await client.transaction().start()
    dropped = await client.transaction().start()
    plan = [None, kept, kept, dropped, dropped, None, kept, None]
    async with raw_producer(cluster, "p") as ws:
        await send_batch(
            ws,
            *(
                Send(seq=i, payload=b"%d" % i, txn=None if t is None else t.wire_id)
                for i, t in enumerate(plan)
            ),
        )
        got = await answers(ws, len(plan))
    ids = [r.message_id for r in (got[i] for i in range(len(plan))) if isinstance(r, Receipt)]
    assert len(ids) == len(plan) and ids == sorted(ids)
    await kept.commit()
    await dropped.abort()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    expected = [b"%d" % i for i, t in enumerate(plan) if t is not dropped]
    assert [m.value for m in await receive_all(reader, len(expected))] == expected


async def test_a_resend_in_a_transactions_batch_is_a_duplicate(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    txn = await client.transaction().start()
    async with raw_producer(cluster, "p") as ws:
        await send_batch(ws, *(Send(seq=i, payload=b"%d" % i, txn=txn.wire_id) for i in range(3)))
        first = await answers(ws, 3)
        await send_batch(
            ws, *(Send(seq=i, payload=b"%d" % i, txn=txn.wire_id) for i in range(2, 5))
        )
        again = await answers(ws, 3)
    resent = again[2]
    assert isinstance(resent, Receipt) and resent.duplicate
    assert isinstance(first[2], Receipt) and resent.message_id == first[2].message_id
    assert all(isinstance(r, Receipt) and not r.duplicate for r in (again[3], again[4]))
    await txn.commit()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [m.value for m in await receive_all(reader, 5)] == [b"%d" % i for i in range(5)]


async def test_a_batch_of_an_ended_transaction_is_refused_send_by_send(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    txn = await client.transaction().start()
    await txn.abort()
    async with raw_producer(cluster, "p") as ws:
        await send_batch(ws, *(Send(seq=i, payload=b"x", txn=txn.wire_id) for i in range(4)))
        got = await answers(ws, 4)
        assert all(
            isinstance(e, Error) and e.error == ErrorName.TRANSACTION_CONFLICT
            for e in [got[i] for i in range(4)]
        ), got
        await send_batch(ws, Send(seq=4, payload=b"plain"))  # the producer goes on
        after = await answers(ws, 1)
    assert isinstance(after[4], Receipt)
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [m.value for m in await receive_all(reader, 1)] == [b"plain"]


def segment_topic(cluster: Cluster) -> tuple[Topic, MetadataTransactionBuffer]:
    topic = cluster.broker.service.topics[SEGMENT]
    assert isinstance(topic.buffer, MetadataTransactionBuffer)
    return topic, topic.buffer


def appended(topic: Topic, after: Position | None, count: int) -> list[Position]:
    """The ``count`` entries appended after ``after`` (one ledger: this test's)."""
    last = topic.ledger.last_confirmed
    assert last is not None and last.entry_id - (-1 if after is None else after.entry_id) == count
    return [Position(last.ledger_id, last.entry_id - i) for i in reversed(range(count))]


async def test_a_batch_whose_record_failed_is_all_orphaned_even_if_cancelled_at_the_first_put(
    client: Client, cluster: Cluster
) -> None:
    """A failed record makes every entry of the batch an orphan. The publisher may be
    cancelled while the first orphan is being put (a broker stopping): the others must be
    orphans already (in memory), or a commit of the transaction (it has a recorded entry
    here) shows them, though their sends were never acknowledged."""
    await client.admin.create_topic(TOPIC, segments=1)
    txn = await client.transaction().start()
    async with raw_producer(cluster, "p") as ws:
        await send_batch(ws, Send(seq=0, payload=b"good", txn=txn.wire_id))
        assert isinstance((await answers(ws, 1))[0], Receipt)
    topic, buffer = segment_topic(cluster)
    before = topic.ledger.last_confirmed
    cluster.faults.fail("txn", key_prefix="/txn-op/", times=1)  # the batch's record fails
    put = cluster.faults.hold("txn", key_prefix="/txn-orphans/", times=1)
    sends = [
        (Send(seq=i, payload=b"lost-%d" % i, txn=txn.wire_id), topic.turn("p")) for i in (1, 2, 3)
    ]
    task = asyncio.create_task(topic.publish_txn("p", sends))
    await put.wait_for(1)  # the first orphan's put: applied, its answer parked
    # a broker stopping cancels every task: the publisher and the one finishing its appends
    finishing = [t for t in asyncio.all_tasks() if t.get_name().startswith("txn-append-")]
    assert len(finishing) == 1
    for stopped in (task, *finishing):
        stopped.cancel()
    await asyncio.gather(task, *finishing, return_exceptions=True)
    lost = appended(topic, before, 3)
    assert [buffer.is_orphan(p) for p in lost] == [True, True, True]
    assert not topic.dedup.state("p").in_flight
    put.release()
    # the puts the cancel cut short are left to the background retry: all three durable
    await wait_until(lambda: not buffer._orphans.unsettled, what="the orphans put")
    listing = await cluster.store.list_prefix(buffer._orphans._prefix)
    assert len(listing.records) == 3
    await txn.commit()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    async with raw_producer(cluster, "plain") as ws:
        await send_batch(ws, Send(seq=0, payload=b"after"))
        await answers(ws, 1)
    assert [m.value for m in await receive_all(reader, 2)] == [b"good", b"after"]


@pytest.mark.parametrize("together", [True, False], ids=["batch", "single"])
async def test_a_resend_after_the_publisher_was_cancelled_during_the_record_is_stored_once(
    client: Client, cluster: Cluster, together: bool
) -> None:
    """Once queued, transactional sends are written and recorded whatever becomes of the
    task that queued them (the record's step goes on in the writer): a resend after the
    publisher was cancelled must be a duplicate, not a second copy that the commit shows
    next to the first."""
    await client.admin.create_topic(TOPIC, segments=1)
    txn = await client.transaction().start()
    async with raw_producer(cluster, "p"):
        pass  # loads the segment
    topic, _ = segment_topic(cluster)
    record = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1)
    sends = [Send(seq=i, payload=b"m%d" % i, txn=txn.wire_id) for i in range(3)]
    task: asyncio.Task[object]
    if together:
        task = asyncio.create_task(topic.publish_txn("p", [(s, topic.turn("p")) for s in sends]))
    else:
        task = asyncio.create_task(topic.publish("p", sends[0], topic.turn("p")))
        sends = sends[:1]
    await record.wait_for(1)  # queued, written, the record's step applied and parked
    task.cancel()
    record.release()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert not topic.dedup.state("p").in_flight
    async with raw_producer(cluster, "p") as ws:  # the producer sends them again
        await send_batch(ws, *sends)
        again = await answers(ws, len(sends))
    assert all(isinstance(a, Receipt) and a.duplicate for a in again.values()), again
    await txn.commit()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    async with raw_producer(cluster, "plain") as ws:
        await send_batch(ws, Send(seq=0, payload=b"after"))
        await answers(ws, 1)
    expected = [s.payload for s in sends] + [b"after"]
    assert [m.value for m in await receive_all(reader, len(expected))] == expected


async def test_runs_of_transactions_and_plain_sends_larger_than_the_window_keep_their_order(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch with runs of two transactions and plain sends, each run longer than the
    window of sends in flight (so runs are split into several publishing tasks): stored in
    send order, every send answered once, and each transaction's outcome applies to its
    own sends only."""
    service = cluster.broker.service
    monkeypatch.setattr(
        service, "settings", dataclasses.replace(service.settings, max_pending_sends=3)
    )
    await client.admin.create_topic(TOPIC, segments=1)
    sizes: list[int] = []
    original = Publishing.publish_txn

    async def recorded(self: Publishing, producer: str, sends: list[Any]) -> Any:
        sizes.append(len(sends))
        return await original(self, producer, sends)

    monkeypatch.setattr(Publishing, "publish_txn", recorded)
    kept = await client.transaction().start()
    dropped = await client.transaction().start()
    plan = [None] * 4 + [kept] * 7 + [dropped] * 5 + [None] * 2 + [kept] * 4 + [dropped] * 1
    async with raw_producer(cluster, "p") as ws:
        await send_batch(
            ws,
            *(
                Send(seq=i, payload=b"%d" % i, txn=None if t is None else t.wire_id)
                for i, t in enumerate(plan)
            ),
        )
        got = await answers(ws, len(plan))
    receipts = [got[i] for i in range(len(plan))]
    assert all(isinstance(r, Receipt) and not r.duplicate for r in receipts), receipts
    ids = [r.message_id for r in receipts if isinstance(r, Receipt)]
    assert ids == sorted(ids) and len(set(ids)) == len(plan)
    assert max(sizes) <= 3 and sum(sizes) == plan.count(kept) + plan.count(dropped), sizes
    topic, _ = segment_topic(cluster)
    assert topic.dedup.state("p").order.idle and not topic.dedup.state("p").in_flight
    await kept.commit()
    await dropped.abort()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    expected = [b"%d" % i for i, t in enumerate(plan) if t is not dropped]
    assert [m.value for m in await receive_all(reader, len(expected))] == expected


async def test_a_txn_publisher_cancelled_before_queueing_leaves_no_send_in_flight(
    client: Client, cluster: Cluster
) -> None:
    """Cancelled while waiting for an earlier send's turn (nothing of the batch queued):
    every send is given up at once, every turn is passed on, and a resend is stored once."""
    await client.admin.create_topic(TOPIC, segments=1)
    txn = await client.transaction().start()
    async with raw_producer(cluster, "p"):
        pass
    topic, _ = segment_topic(cluster)
    state = topic.dedup.state("p")
    earlier = topic.turn("p")  # an earlier send that has not queued yet
    sends = [Send(seq=i, payload=b"m%d" % i, txn=txn.wire_id) for i in range(3)]
    task = asyncio.create_task(topic.publish_txn("p", [(s, topic.turn("p")) for s in sends]))
    await wait_until(lambda: len(state.in_flight) == 3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and not state.in_flight
    earlier.release()
    await wait_until(lambda: state.order.idle)
    again = await topic.publish_txn("p", [(s, topic.turn("p")) for s in sends])
    assert all(isinstance(o, tuple) and not o[1] for o in again), again
    await txn.commit()
    reader = await client.subscribe(TOPIC, "r", initial_position="earliest")
    assert [m.value for m in await receive_all(reader, 3)] == [b"m0", b"m1", b"m2"]
