"""Ordered redelivery: after anything hands messages back, an Exclusive or Failover consumer
gets them again from the earliest unacknowledged one, in position order, and never an older
message after a newer one (except as a recognisable redelivery).

Each race is made to happen on purpose: a gate holds the broker's ledger read or its
materialization of a transaction's outcome at the moment that matters, and the test opens
it when the other side of the race has happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from segtxn.broker.dispatch import Subscription
from segtxn.broker.txn.pending_ack import ReservingPendingAckStore
from segtxn.client import Client, ErrorName, Message, ServerError, TransactionFailed
from segtxn.client.consumer import Consumer
from segtxn.ledger import Position
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/ordered/in"
SEGMENT = TopicName.parse("segment://acme/ordered/in/0")
SUB = "ordered"


async def setup(client: Client, n: int, *, queue: int = 1000, **options: Any) -> Consumer:
    """One segment holding m0..m(n-1), and a consumer of it from the earliest."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(n):
        await producer.send(f"m{i}".encode(), key="k")
    await producer.close()
    return await client.subscribe(
        TOPIC, SUB, initial_position="earliest", receiver_queue_size=queue, **options
    )


def subscription(cluster: Cluster) -> Subscription:
    return cluster.broker.service.topics[SEGMENT].subscriptions[SUB]


async def receive(consumer: Consumer, n: int) -> list[Message]:
    return [await consumer.receive(timeout_s=10) for _ in range(n)]


def values(messages: list[Message]) -> list[str]:
    return [m.value.decode() for m in messages]


async def nothing_arrives(consumer: Consumer) -> None:
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout_s=0.3)  # bounded absence check


class Gate:
    """Holds the calls of an async method for which ``when(*args)`` holds, at their start,
    until opened; ``entered`` is set when the first call is held."""

    def __init__(self, when: Callable[..., bool]) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()
        self._when = when

    def wrap(self, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def held(*args: Any, **kwargs: Any) -> Any:
            if self._when(*args, **kwargs):
                self.entered.set()
                await self.opened.wait()
            return await method(*args, **kwargs)

        return held


@contextmanager
def gated(
    target: object, name: str, when: Callable[..., bool] = lambda *_, **__: True
) -> Iterator[Gate]:
    """Hold ``target.name(...)`` calls (those ``when`` picks) while the block runs; they
    go on when it ends."""
    gate = Gate(when)
    original = getattr(target, name)
    setattr(target, name, gate.wrap(original))
    try:
        yield gate
    finally:
        gate.opened.set()
        setattr(target, name, original)


async def test_an_abort_during_a_ledger_read_comes_before_what_the_read_returns(
    client: Client, cluster: Cluster
) -> None:
    """The dispatcher is reading m3, m4 when the abort of a transaction holding m0..m2
    lands: what that read returns must not be delivered before m0..m2."""
    consumer = await setup(client, 5, queue=3)
    sub = subscription(cluster)
    txn = await client.transaction().start()
    with gated(sub.ledger, "read", when=lambda start, **_: start.entry_id >= 3) as read:
        first = await receive(consumer, 3)  # taking them grants permits for m3, m4
        for message in first:
            await consumer.acknowledge(message, txn=txn)
        await asyncio.wait_for(read.entered.wait(), 10)  # m3, m4 are being read
        await txn.abort()
        await wait_until(
            lambda: not sub.pending_acks.transactions(), timeout=10, what="the abort applied"
        )
    got = await receive(consumer, 5)
    assert values(got) == ["m0", "m1", "m2", "m3", "m4"]
    assert [m.redelivery_count for m in got[:3]] == [1, 1, 1]


async def test_the_race_comes_back_with_the_test_only_bug(client: Client, cluster: Cluster) -> None:
    """The same interleaving with ``unordered-redelivery`` (what the soak harness's proof
    turns on): m3 arrives before the aborted m0..m2. This shows the setting re-introduces
    the race, and that the test above would catch it."""
    consumer = await setup(client, 5, queue=3)
    sub = subscription(cluster)
    sub._redelivery.rewinds = False
    txn = await client.transaction().start()
    with gated(sub.ledger, "read", when=lambda start, **_: start.entry_id >= 3) as read:
        first = await receive(consumer, 3)
        for message in first:
            await consumer.acknowledge(message, txn=txn)
        await asyncio.wait_for(read.entered.wait(), 10)
        await txn.abort()
        await wait_until(
            lambda: not sub.pending_acks.transactions(), timeout=10, what="the abort applied"
        )
    got = await receive(consumer, 5)
    assert values(got)[:2] == ["m3", "m4"]


async def test_after_abort_returns_nothing_newer_comes_before_the_aborted_inputs(
    client: Client, cluster: Cluster
) -> None:
    """The client's abort returns before the broker has learnt of it (its materialization
    is held): m3.. are already queued in the client, yet the next message the application
    receives is m0, once the broker has let the acks go."""
    consumer = await setup(client, 6)
    first = await receive(consumer, 3)
    await wait_until(lambda: consumer._queue.qsize() == 3, timeout=10, what="m3..m5 queued")
    pending = subscription(cluster).pending_acks
    assert isinstance(pending, ReservingPendingAckStore)
    txn = await client.transaction().start()
    for message in first:
        await consumer.acknowledge(message, txn=txn)
    with gated(pending, "_settle") as settle:
        await txn.abort()
        next_one = asyncio.create_task(consumer.receive(timeout_s=10))
        await asyncio.wait_for(settle.entered.wait(), 10)
        await nothing_arrives_while(next_one)
    again = await next_one
    assert again.value == b"m0" and again.redelivery_count == 1
    assert values(await receive(consumer, 5)) == ["m1", "m2", "m3", "m4", "m5"]


async def nothing_arrives_while(task: asyncio.Task[Message]) -> None:
    done, _ = await asyncio.wait({task}, timeout=0.3)  # bounded absence check
    assert not done, f"received {task.result()} before the broker applied the abort"


async def test_aborting_a_cumulative_ack_brings_back_everything_it_covered(
    client: Client, cluster: Cluster
) -> None:
    consumer = await setup(client, 5)
    got = await receive(consumer, 5)
    txn = await client.transaction().start()
    await consumer.acknowledge_cumulative(got[3], txn=txn)
    await txn.abort()
    again = await receive(consumer, 5)
    assert values(again) == ["m0", "m1", "m2", "m3", "m4"]
    assert all(m.redelivery_count >= 1 for m in again)  # twice if the abort's own rewind
    async with client.transaction() as commit:  # and the client's ask do not coincide
        await consumer.acknowledge_cumulative(again[4], txn=commit)
    await nothing_arrives(consumer)
    stats = await client.admin.stats(TOPIC)
    assert stats["segments"][0]["stats"]["subscriptions"][SUB]["backlog"] == 0


async def test_a_transaction_cannot_hold_a_message_delivered_before_a_rewind(
    client: Client, cluster: Cluster
) -> None:
    """m1 was taken, then the subscription rewound (a negative ack of m0): acknowledging
    the old copy of m1 in a transaction is refused; the new copy is fine."""
    consumer = await setup(client, 3)
    m0, m1 = await receive(consumer, 2)
    await consumer.negative_acknowledge(m0)
    again = await receive(consumer, 2)
    assert values(again) == ["m0", "m1"] and again[0].epoch > m1.epoch
    txn = await client.transaction().start()
    with pytest.raises(ServerError) as stale:
        await consumer.acknowledge(m1, txn=txn)
    assert stale.value.name is ErrorName.TRANSACTION_CONFLICT and "epoch" in stale.value.message
    with pytest.raises(TransactionFailed):
        await txn.commit()
    assert values(await receive(consumer, 3)) == ["m0", "m1", "m2"]


async def test_a_transaction_whose_acks_all_failed_still_rewinds_on_abort(
    client: Client, cluster: Cluster
) -> None:
    """No ack of the transaction landed, so no outcome will ever release anything: the
    client's Redeliver is answered at once, and what it had taken comes again first."""
    consumer = await setup(client, 3)
    m0, m1 = await receive(consumer, 2)
    await consumer.negative_acknowledge(m1)  # rewinds: m0's copy is now stale
    again = await receive(consumer, 3)
    assert values(again) == ["m0", "m1", "m2"]
    txn = await client.transaction().start()
    with pytest.raises(ServerError):
        await consumer.acknowledge(m0, txn=txn)  # refused: delivered before the rewind
    await txn.abort()
    assert values(await receive(consumer, 3)) == ["m0", "m1", "m2"]


async def test_a_reconnect_resumes_at_the_earliest_unacknowledged_in_order(
    client: Client, cluster: Cluster
) -> None:
    consumer = await setup(client, 6)
    got = await receive(consumer, 6)
    await consumer.acknowledge(got[0])
    await consumer.acknowledge(got[2])  # a hole: m1 is still unacknowledged
    sub = subscription(cluster)
    (link,) = sub.consumers
    assert link.disconnect is not None
    await link.disconnect()  # the broker hangs up; the client comes back
    again = await receive(consumer, 4)
    assert values(again) == ["m1", "m3", "m4", "m5"]
    assert all(m.redelivery_count == 1 for m in again)


async def test_a_failover_hand_over_mid_transaction_keeps_order(
    client: Client, cluster: Cluster
) -> None:
    """Consumer b holds m0..m2 in an open transaction when a (first by name) joins: a gets
    nothing until b's transaction ends; b's further acks are refused, its transaction
    aborts, and a gets m0.. in order."""
    b = await setup(client, 5, subscription_type="Failover", name="b")
    taken = await receive(b, 4)
    txn = await client.transaction().start()
    for message in taken[:3]:
        await b.acknowledge(message, txn=txn)
    a = await client.subscribe(
        TOPIC, SUB, subscription_type="Failover", initial_position="earliest", name="a"
    )
    await wait_until(lambda: not b.active, timeout=5, what="b to stand by")
    await nothing_arrives(a)  # fenced while b's transaction may still commit or abort
    with pytest.raises(ServerError) as refused:
        await b.acknowledge(taken[3], txn=txn)
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT
    with pytest.raises(TransactionFailed):
        await txn.commit()
    assert values(await receive(a, 5)) == ["m0", "m1", "m2", "m3", "m4"]
    await nothing_arrives(b)


async def test_positions_in_the_messages_match_the_stored_order(
    client: Client, cluster: Cluster
) -> None:
    """Rewinds skip what is acknowledged or held by an open transaction."""
    consumer = await setup(client, 6)
    got = await receive(consumer, 6)
    holder = await client.transaction().start()
    await consumer.acknowledge(got[0], txn=holder)
    await consumer.acknowledge(got[1])
    await consumer.negative_acknowledge(got[2])
    again = await receive(consumer, 4)
    assert values(again) == ["m2", "m3", "m4", "m5"]
    assert [Position(m.message_id.ledger_id, m.message_id.entry_id) for m in again] == sorted(
        Position(m.message_id.ledger_id, m.message_id.entry_id) for m in again
    )
    await holder.abort()
    assert values(await receive(consumer, 5)) == ["m0", "m2", "m3", "m4", "m5"]


async def test_a_hand_over_while_a_transactional_ack_reads_its_header_refuses_the_ack(
    client: Client, cluster: Cluster
) -> None:
    """b acknowledges m0 in a transaction; while the broker reads the transaction's header
    from the store, a joins and takes the segment over. The ack must be refused: it was
    checked before the hand-over but is reserved after it."""
    b = await setup(client, 3, subscription_type="Failover", name="b")
    (m0,) = await receive(b, 1)
    pending = subscription(cluster).pending_acks
    assert isinstance(pending, ReservingPendingAckStore)
    txn = await client.transaction().start()
    headers = pending._headers  # type: ignore[attr-defined]
    with gated(headers, "get", when=lambda wanted: wanted == txn.id) as header_read:
        ack = asyncio.create_task(b.acknowledge(m0, txn=txn))
        await asyncio.wait_for(header_read.entered.wait(), 10)
        a = await client.subscribe(
            TOPIC, SUB, subscription_type="Failover", initial_position="earliest", name="a"
        )
        await wait_until(lambda: not b.active, timeout=5, what="b to stand by")
    with pytest.raises(ServerError) as refused:
        await ack
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT
    await txn.abort()
    assert values(await receive(a, 3)) == ["m0", "m1", "m2"]


async def test_redeliver_unacknowledged_starts_again_at_the_earliest(
    client: Client, cluster: Cluster
) -> None:
    """What an application calls when it could not process what it took (its transaction
    could not start): everything unacknowledged comes again, in order, nothing newer first."""
    consumer = await setup(client, 4)
    taken = await receive(consumer, 2)
    await consumer.acknowledge(taken[0])
    await consumer.redeliver_unacknowledged()
    again = await receive(consumer, 3)
    assert values(again) == ["m1", "m2", "m3"]
    assert again[0].redelivery_count == 1


async def test_an_ack_sent_as_the_connection_breaks_is_sent_again_after_it(
    client: Client, cluster: Cluster
) -> None:
    """The connection is gone under the ack's send: the application sees no connection
    error; the ack goes again on the new connection and is confirmed (a soak finding: the
    send's ClientConnectionResetError killed a processor)."""
    consumer = await setup(client, 2)
    m0, _ = await receive(consumer, 2)
    (stream,) = consumer._streams.values()
    assert stream._ws is not None
    stream._ws._writer.transport.abort()
    await asyncio.wait_for(consumer.acknowledge(m0), 15)
    again = await receive(consumer, 1)  # the reconnect rewound: m1 comes again
    assert values(again) == ["m1"]
    stats = await client.admin.stats(TOPIC)
    assert stats["segments"][0]["stats"]["subscriptions"][SUB]["backlog"] == 1


async def test_a_shared_redelivery_read_that_finds_nobody_ready_keeps_the_message(
    client: Client, cluster: Cluster
) -> None:
    """Shared: m0 is handed back; while the dispatcher reads it again its only consumer
    leaves. m0 must stay due, and go to the next consumer."""
    c1 = await setup(client, 1, subscription_type="Shared", name="c1")
    (m0,) = await receive(c1, 1)
    sub = subscription(cluster)
    with gated(sub.ledger, "read", when=lambda start, **_: start.entry_id == 0) as read:
        await c1.negative_acknowledge(m0)
        await asyncio.wait_for(read.entered.wait(), 10)
        await c1.close()
        await wait_until(lambda: not sub.consumers, timeout=10, what="c1 gone")
    c2 = await client.subscribe(TOPIC, SUB, subscription_type="Shared", name="c2")
    assert values(await receive(c2, 1)) == ["m0"]


async def test_a_transaction_acknowledges_in_order_on_an_ordered_subscription(
    client: Client, cluster: Cluster
) -> None:
    """m0 was received and left unacknowledged (its application dropped it when an earlier
    transaction failed half-way through a batch): a transaction may not acknowledge m1 past
    it; once it aborts, m0 comes first."""
    consumer = await setup(client, 3)
    m0, m1 = await receive(consumer, 2)
    txn = await client.transaction().start()
    with pytest.raises(ServerError) as skipped:
        await consumer.acknowledge(m1, txn=txn)
    assert skipped.value.name is ErrorName.TRANSACTION_CONFLICT and str(m0.message_id)[-3:] in (
        skipped.value.message
    )
    await txn.abort()
    again = await receive(consumer, 3)
    assert values(again) == ["m0", "m1", "m2"]
    async with client.transaction() as ok:  # in order, it is fine
        for message in again:
            await consumer.acknowledge(message, txn=ok)
    await nothing_arrives(consumer)


async def test_a_transaction_may_send_its_acks_without_awaiting_each(
    client: Client, cluster: Cluster
) -> None:
    """A batch's acks in one transaction, each in its own frame and all on their way
    together (held at the pending-ack store, where the header read and op-record write
    happen): each earlier one counts as acknowledged for the in-order rule, so all are taken
    and committed."""
    consumer = await setup(client, 3)
    sub = subscription(cluster)
    got = await receive(consumer, 3)
    txn = await client.transaction().start()
    at_store: list[object] = []
    acks: list[asyncio.Future[None]] = []

    def at_the_store(*args: object, **_: object) -> bool:
        at_store.append(args)
        return True

    with gated(sub.pending_acks, "ack", when=at_the_store):
        for n, message in enumerate(got, 1):  # one at a time: one frame each
            acks.append(asyncio.ensure_future(consumer.acknowledge(message, txn=txn)))

            def held(n: int = n) -> bool:
                return len(at_store) == n

            await wait_until(held, timeout=10, what=f"ack {n} held")
    await asyncio.gather(*acks)
    await txn.commit()
    await wait_until(
        lambda: sub.cursor.mark_delete == Position(*got[-1].message_id[1:]),
        timeout=10,
        what="the commit's acks applied",
    )
    await nothing_arrives(consumer)


async def test_an_ack_on_its_way_in_another_transaction_does_not_count(
    client: Client, cluster: Cluster
) -> None:
    """m0's ack in t1 is on its way: t2 may not acknowledge m1 past it (t1 may abort while
    t2 commits)."""
    consumer = await setup(client, 2)
    sub = subscription(cluster)
    m0, m1 = await receive(consumer, 2)
    t1 = await client.transaction().start()
    t2 = await client.transaction().start()
    with gated(sub.pending_acks, "ack") as store:
        first = asyncio.ensure_future(consumer.acknowledge(m0, txn=t1))
        await asyncio.wait_for(store.entered.wait(), 10)
        with pytest.raises(ServerError) as refused:
            await consumer.acknowledge(m1, txn=t2)
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT
    assert "has not acknowledged" in refused.value.message
    await first
    await t2.abort()
    await t1.commit()
    again = await receive(consumer, 1)
    assert values(again) == ["m1"]


async def test_acknowledging_a_message_of_a_segment_consumed_to_its_end(
    client: Client, cluster: Cluster
) -> None:
    """The application still holds m0 when its segment is sealed and consumed to its end (by
    another Failover member after a hand-over; here by its own plain ack), so the consumer
    closed that stream. Acking m0 again is a no-op, and in a transaction a conflict the
    application can act on (abort), not a crash."""
    consumer = await setup(client, 1)
    (m0,) = await receive(consumer, 1)
    await consumer.acknowledge(m0)
    await client.admin.split(TOPIC, 0)
    await wait_until(
        lambda: SEGMENT.segment in consumer._finished,  # the state under test
        timeout=10,
        what="segment 0 consumed to its end",
    )
    await consumer.acknowledge(m0)
    await consumer.negative_acknowledge(m0)
    txn = await client.transaction().start()
    with pytest.raises(ServerError) as conflict:
        await consumer.acknowledge(m0, txn=txn)
    assert conflict.value.name is ErrorName.TRANSACTION_CONFLICT
    assert "consumed to its end" in conflict.value.message
    with pytest.raises(TransactionFailed):
        await txn.commit()  # the failed ack poisoned it: the commit aborts
    with pytest.raises(ValueError, match="not from a segment this consumer reads"):
        await consumer.acknowledge(m0.message_id._replace(topic="segment://acme/ordered/x/0"))


async def test_a_failed_transaction_rewinds_every_segment_the_consumer_reads(
    client: Client, cluster: Cluster
) -> None:
    """A batch spans segments: the application took a0 (segment 0) and b0 (segment 1) and
    its transaction failed after acknowledging b0 only. a0 comes again too."""
    topic = "topic://acme/ordered/two"
    await client.admin.create_topic(topic, segments=2)
    producer = await client.create_producer(topic)
    keys: dict[str, str] = {}
    for i in range(40):  # find a key for each segment
        keys.setdefault((await producer.send(f"probe{i}".encode(), key=f"k{i}")).topic, f"k{i}")
    assert len(keys) == 2
    consumer = await client.subscribe(topic, SUB, initial_position="earliest")
    async with client.transaction() as clear:  # the probes are done with
        for _ in range(40):
            await consumer.acknowledge(await consumer.receive(timeout_s=10), txn=clear)
    (ka, kb) = keys.values()
    await producer.send(b"a0", key=ka)
    await producer.send(b"b0", key=kb)
    got = {m.value: m for m in await receive(consumer, 2)}
    txn = await client.transaction().start()
    await consumer.acknowledge(got[b"b0"], txn=txn)
    await txn.abort()
    again = await receive(consumer, 2)
    assert sorted(values(again)) == ["a0", "b0"]
    assert all(m.redelivery_count >= 1 for m in again)
