"""Acknowledgments made in one turn of the loop travel as one Ack frame per (transaction,
epoch), and each still gets its own answer: segtxn/client/acks.py."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from segtxn.broker.dispatch import Subscription
from segtxn.client import Client, ErrorName, Message, MessageId, ServerError
from segtxn.client.consumer import Consumer
from segtxn.client.errors import ClientClosed
from segtxn.client.timeouts import Deadline
from segtxn.ledger import Position
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/acks/in"
SEGMENT = TopicName.parse("segment://acme/acks/in/0")
SUB = "gathered"


async def setup(client: Client, n: int, **options: Any) -> tuple[Consumer, list[Message]]:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(n):
        await producer.send(f"m{i}".encode())
    await producer.close()
    consumer = await client.subscribe(TOPIC, SUB, initial_position="earliest", **options)
    return consumer, [await consumer.receive(timeout_s=10) for _ in range(n)]


def subscription(cluster: Cluster) -> Subscription:
    return cluster.broker.service.topics[SEGMENT].subscriptions[SUB]


def record_calls(
    monkeypatch: pytest.MonkeyPatch, target: object, name: str
) -> list[list[Position]]:
    """The ids of every ``target.name(link?, [txn?,] ids, ...)`` call, in order."""
    calls: list[list[Position]] = []
    original = getattr(target, name)

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append(next(a for a in args if isinstance(a, list)))
        return await original(*args, **kwargs)

    monkeypatch.setattr(target, name, recorded)
    return calls


def forged(message: Message) -> MessageId:
    """An id of ``message``'s segment that it never held."""
    return MessageId(message.message_id.topic, message.message_id.ledger_id, 10**9)


def position(message: Message) -> Position:
    return Position(message.message_id.ledger_id, message.message_id.entry_id)


async def test_plain_acks_of_one_turn_are_one_request(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer, got = await setup(client, 5)
    sub = subscription(cluster)
    calls = record_calls(monkeypatch, sub, "ack")
    await asyncio.gather(*(consumer.acknowledge(m) for m in got))
    assert calls == [[position(m) for m in got]]
    assert sub.cursor.mark_delete == position(got[-1])


async def test_transactional_acks_of_one_turn_are_one_request(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer, got = await setup(client, 5)
    sub = subscription(cluster)
    calls = record_calls(monkeypatch, sub.pending_acks, "ack")
    txn = await client.transaction().start()
    await asyncio.gather(*(consumer.acknowledge(m, txn=txn) for m in got))
    assert calls == [[position(m) for m in got]]
    await txn.commit()
    await wait_until(
        lambda: sub.cursor.mark_delete == position(got[-1]), timeout=10, what="acks applied"
    )


async def test_a_refused_plain_ack_fails_only_its_own_caller(
    client: Client, cluster: Cluster
) -> None:
    """An id the topic never held, gathered with good ones: the broker refuses the frame;
    each call is then sent on its own, so only the bad one fails and the others apply."""
    consumer, got = await setup(client, 3)
    sub = subscription(cluster)
    bad = forged(got[0])
    acked: list[Message | MessageId] = [got[0], bad, got[1], got[2]]
    outcomes = await asyncio.gather(
        *(consumer.acknowledge(m) for m in acked),
        return_exceptions=True,
    )
    assert outcomes[0] is None and outcomes[2] is None and outcomes[3] is None
    assert isinstance(outcomes[1], ServerError)
    assert outcomes[1].name is ErrorName.INVALID_ARGUMENT
    assert sub.cursor.mark_delete == position(got[-1])


async def test_a_refused_transactional_ack_fails_the_acks_with_it_and_the_transaction(
    client: Client, cluster: Cluster
) -> None:
    """In a transaction a refused ack dooms the transaction anyway: the acks that travelled
    with it share its refusal, the commit aborts, and the messages come again."""
    consumer, got = await setup(client, 3)
    txn = await client.transaction().start()
    bad = dataclasses.replace(got[0], message_id=forged(got[0]))  # the same epoch
    outcomes = await asyncio.gather(
        *(consumer.acknowledge(m, txn=txn) for m in [got[0], bad, got[1]]),
        return_exceptions=True,
    )
    assert all(isinstance(o, ServerError) for o in outcomes), outcomes
    with pytest.raises(Exception):  # noqa: B017 - the commit's own error class is not the point
        await txn.commit()
    again = [await consumer.receive(timeout_s=10) for _ in range(3)]
    assert sorted(m.value for m in again) == [b"m0", b"m1", b"m2"]


async def test_a_cumulative_ack_travels_alone(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer, got = await setup(client, 3, subscription_type="Failover")
    sub = subscription(cluster)
    calls = record_calls(monkeypatch, sub, "ack")
    await asyncio.gather(consumer.acknowledge(got[0]), consumer.acknowledge_cumulative(got[2]))
    assert sorted(calls) == sorted([[position(got[0])], [position(got[2])]])
    assert sub.cursor.mark_delete == position(got[2])


async def test_interleaved_plain_and_transactional_acks_of_one_turn_keep_their_order(
    client: Client, cluster: Cluster
) -> None:
    """On an ordered subscription a transaction acknowledges in order: its ack of m2 is
    refused while m1, before it, is neither acknowledged nor held by it. Acks made in one
    turn must reach the broker in the order they were made: gathered by key alone, the
    plain ack of m1 went after the transaction's frame [m0, m2], which was refused
    (TransactionConflict) and doomed the transaction."""
    consumer, got = await setup(client, 3, subscription_type="Failover")
    txn = await client.transaction().start()
    await txn.add_subscription(TOPIC, SUB)
    outcomes = await asyncio.gather(
        consumer.acknowledge(got[0], txn=txn),
        consumer.acknowledge(got[1]),
        consumer.acknowledge(got[2], txn=txn),
        return_exceptions=True,
    )
    assert list(outcomes) == [None, None, None], outcomes
    await txn.commit()
    sub = subscription(cluster)
    await wait_until(
        lambda: sub.cursor.mark_delete == position(got[-1]), timeout=10, what="acks applied"
    )


async def test_a_cumulative_ack_made_first_reaches_the_broker_first(
    client: Client, cluster: Cluster
) -> None:
    """A cumulative ack travels alone, but not after acks made after it: the
    transaction's ack of m1 counts m0 as acknowledged only once m0's cumulative ack in
    the same transaction has reached the broker."""
    consumer, got = await setup(client, 2, subscription_type="Failover")
    txn = await client.transaction().start()
    await txn.add_subscription(TOPIC, SUB)
    outcomes = await asyncio.gather(
        consumer.acknowledge_cumulative(got[0], txn=txn),
        consumer.acknowledge(got[1], txn=txn),
        return_exceptions=True,
    )
    assert list(outcomes) == [None, None], outcomes
    await txn.commit()


async def test_a_connection_lost_in_the_middle_of_a_write_fails_no_caller(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of several frames (gathered acks, then a nack) may wait for the socket
    between two frames (aiohttp drains its buffer). If the connection is lost meanwhile, the
    read loop sets the stream's socket to None before the writer goes on: the writer must
    not send the next frame on None (an AttributeError out of nack / receive / the
    background ack write). The acks it took are sent again on the new connection."""
    consumer, got = await setup(client, 2, subscription_type="Shared")
    stream = consumer._streams[str(SEGMENT)]
    ws = stream._ws
    assert ws is not None
    original = ws.send_bytes
    first_sent, go_on, lost = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def draining(data: bytes, *args: Any, **kwargs: Any) -> None:
        await original(data, *args, **kwargs)
        if not first_sent.is_set():  # written; the drain waits for the peer
            first_sent.set()
            await go_on.wait()

    monkeypatch.setattr(ws, "send_bytes", draining)
    drop_queued = stream._drop_queued

    def noticed() -> int:
        if stream._ws is None:
            lost.set()  # the read loop gave the socket up (its finally ran)
        return drop_queued()

    monkeypatch.setattr(stream, "_drop_queued", noticed)
    ack = asyncio.ensure_future(consumer.acknowledge(got[0]))
    nack = asyncio.ensure_future(consumer.negative_acknowledge(got[1]))
    await first_sent.wait()  # the nack's write took the ack with it and wrote it
    link = subscription(cluster).consumers[0]
    assert link.disconnect is not None
    await link.disconnect()
    await lost.wait()
    go_on.set()
    await nack  # the nack is lost with its connection (the new one starts from a rewind)
    await asyncio.wait_for(ack, 10)  # the ack: sent again on the new connection
    assert subscription(cluster).cursor.mark_delete >= position(got[0])


async def test_acks_gathered_while_reconnecting_are_sent_on_the_new_attachment(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks made while the stream has no socket are taken (in flight) and sent by the new
    attachment before anything new; each caller gets its receipt."""
    consumer, got = await setup(client, 3, subscription_type="Shared")
    stream = consumer._streams[str(SEGMENT)]
    lost = asyncio.Event()
    drop_queued = stream._drop_queued

    def noticed() -> int:
        if stream._ws is None:
            lost.set()
        return drop_queued()

    monkeypatch.setattr(stream, "_drop_queued", noticed)
    link = subscription(cluster).consumers[0]
    assert link.disconnect is not None
    await link.disconnect()
    await lost.wait()
    assert stream._ws is None
    acks = asyncio.gather(*(consumer.acknowledge(m) for m in got))
    await asyncio.wait_for(acks, 10)
    assert stream.reconnects == 1
    sub = subscription(cluster)
    assert sub.cursor.mark_delete == position(got[-1])


async def test_close_fails_the_acks_not_yet_confirmed_and_leaves_no_task(
    client: Client, cluster: Cluster
) -> None:
    consumer, got = await setup(client, 2)
    stream = consumer._streams[str(SEGMENT)]
    pending = [stream.ack([m.message_id], cumulative=False, deadline=Deadline(10)) for m in got]
    assert stream._writes  # their write is scheduled, not yet run
    await consumer.close()
    assert not stream._writes
    outcomes = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(o, ClientClosed) for o in outcomes), outcomes
    assert stream._acks.pending() == []


async def test_plain_acks_sent_again_after_a_refusal_go_before_acks_gathered_after_them(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain acks of m0 and of an id the segment never held share a frame; the broker
    refuses it. Meanwhile the transaction's ack of m1, made after them, is gathered and not
    yet written (another write holds the socket). The plain acks go again one per frame,
    and still before m1's: on an ordered subscription the transaction's ack of m1 is
    refused (TransactionConflict) while m0 before it is not acknowledged."""
    consumer, got = await setup(client, 2, subscription_type="Failover")
    stream = consumer._streams[str(SEGMENT)]
    sub = subscription(cluster)
    bad = forged(got[0])
    reached, go_on = asyncio.Event(), asyncio.Event()
    original = sub.ack

    async def held(link: Any, ids: list[Position], **kwargs: Any) -> None:
        if len(ids) == 2:  # the shared frame: hold it until m1's ack is gathered
            reached.set()
            await go_on.wait()
        await original(link, ids, **kwargs)

    monkeypatch.setattr(sub, "ack", held)
    txn_acks = record_calls(monkeypatch, sub.pending_acks, "ack")
    txn = await client.transaction().start()
    plain = asyncio.gather(
        consumer.acknowledge(got[0]), consumer.acknowledge(bad), return_exceptions=True
    )
    await reached.wait()  # the shared frame was written and is on the broker
    async with stream._writing:  # a write in progress: m1's ack is gathered, not written
        in_txn = asyncio.ensure_future(consumer.acknowledge(got[1], txn=txn))
        await wait_until(lambda: bool(stream._acks._gathering), what="m1's ack gathered")
        go_on.set()  # the refusal comes back: the plain acks are gathered again
        await wait_until(lambda: len(stream._acks._gathering) == 3, what="sent again")
    outcomes = await asyncio.wait_for(plain, 10)
    assert outcomes[0] is None and isinstance(outcomes[1], ServerError), outcomes
    assert outcomes[1].name is ErrorName.INVALID_ARGUMENT
    await asyncio.wait_for(in_txn, 10)  # not TransactionConflict
    assert txn_acks == [[position(got[1])]]
    await txn.commit()
    await wait_until(
        lambda: sub.cursor.mark_delete == position(got[1]), timeout=10, what="acks applied"
    )
