"""Transactional acknowledgements at their edges (v5 op records and v4 pending-ack logs): each
test makes one interleaving happen on purpose and checks a guarantee of docs/transactions.md
(an aborted transaction's acks are released; two transactions never both hold one message;
nothing is held for good by a transaction that ended; a committed one's acks survive a
restart). Each failed before its fix, found by a review."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.dispatch import Subscription
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore
from segtxn.broker.txn.pending_ack_records import MetadataPendingAckStore
from segtxn.client import Client, ErrorName, Message, ServerError, TransactionFailed
from segtxn.client.consumer import Consumer
from segtxn.coordinator.app import V4
from segtxn.ledger import LedgerSettings, Position
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnAction
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/review/in"
SEGMENT = TopicName.parse("segment://acme/review/in/0")
SUB = "s"
V4_TOPIC = "persistent://acme/review/v4"


async def setup(client: Client, n: int, **options: Any) -> Consumer:
    """One segment holding m0..m(n-1), and an Exclusive consumer of it from the earliest."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(n):
        await producer.send(f"m{i}".encode(), key="k")
    await producer.close()
    return await client.subscribe(TOPIC, SUB, initial_position="earliest", **options)


def subscription(cluster: Cluster, name: TopicName = SEGMENT) -> Subscription:
    return cluster.broker.service.topics[name].subscriptions[SUB]


def position(message: Message) -> Position:
    return Position(message.message_id.ledger_id, message.message_id.entry_id)


async def receive(consumer: Consumer, n: int, timeout_s: float = 5) -> list[str]:
    out: list[str] = []
    try:
        for _ in range(n):
            out.append((await consumer.receive(timeout_s=timeout_s)).value.decode())
    except TimeoutError:
        raise AssertionError(f"only {out} delivered again within {timeout_s} s") from None
    return out


@contextmanager
def held_after(target: object, name: str) -> Iterator[tuple[asyncio.Event, asyncio.Event]]:
    """``target.name(...)`` runs, then its caller is held (before it goes on) until the
    second event is set; the first is set when a call is held."""
    entered, opened = asyncio.Event(), asyncio.Event()
    original: Callable[..., Awaitable[Any]] = getattr(target, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        entered.set()
        await opened.wait()
        return result

    setattr(target, name, wrapper)
    try:
        yield entered, opened
    finally:
        opened.set()
        setattr(target, name, original)


# ---------------------------------------------------------------------- v5 (op records)


async def test_a_cumulative_ack_over_another_open_transactions_cumulative_ack_conflicts(
    client: Client, cluster: Cluster
) -> None:
    """Transaction A holds a cumulative ack up to m1; transaction B then acks cumulatively
    up to m3, which covers m0, m1 too: B conflicts (PIP-31: one transaction's cumulative ack
    at a time), and A's abort brings m0, m1 back. B was accepted before: its hold covered
    them, B committed, and they were never delivered again, though A's outputs for them
    were aborted."""
    consumer = await setup(client, 4)
    got = [await consumer.receive(timeout_s=10) for _ in range(4)]
    a = await client.transaction().start()
    await consumer.acknowledge_cumulative(got[1], txn=a)
    b = await client.transaction().start()
    with pytest.raises(ServerError) as refused:
        await consumer.acknowledge_cumulative(got[3], txn=b)
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT
    await a.abort()
    with pytest.raises(TransactionFailed):
        await b.commit()
    # m0 and m1 were acknowledged only by A, which aborted: they must come again
    assert (await receive(consumer, 2)) == ["m0", "m1"]


async def test_a_cumulative_ack_that_fails_after_its_abort_was_applied_holds_nothing(
    client: Client, cluster: Cluster
) -> None:
    """A transaction holds a cumulative ack up to m1; its next cumulative ack (up to m3) is
    reserved and its acks record is on its way to the store when the transaction is
    aborted. The abort is materialized (everything released, a rewind), then the record's
    step fails its header check and the ack undoes its reservation. That undo put back the
    hold up to m1 for the aborted transaction, which nothing released again: m0, m1 were
    pending for good (plain acks ignored, other transactions in conflict with it)."""
    consumer = await setup(client, 4)
    got = [await consumer.receive(timeout_s=10) for _ in range(4)]
    sub = subscription(cluster)
    txn = await client.transaction().start()
    await consumer.acknowledge_cumulative(got[1], txn=txn)
    record = cluster.faults.hold("txn", key_prefix=T.ops_prefix(txn.id), times=1, before=True)
    second = asyncio.create_task(consumer.acknowledge_cumulative(got[3], txn=txn))
    await record.wait_for(1)  # reserved, its record's step parked before the store
    await cluster.coordinator.coordinator.end_txn(txn.id, TxnAction.ABORT)
    await wait_until(
        lambda: not sub.pending_acks.transactions(), timeout=10, what="the abort materialized"
    )
    record.release()
    with pytest.raises(ServerError):
        await second  # its step failed: the transaction had ended
    assert not sub.pending_acks.transactions(), (
        f"the aborted {txn.id} holds acks again: "
        f"m0 held by {sub.pending_acks.holder(position(got[0]))}"
    )


async def restart_broker(cluster: Cluster, **changes: Any) -> None:
    """The broker again on the same store and files (settings changed as given)."""
    settings = dataclasses.replace(cluster.broker.settings, **changes)
    await cluster.broker.stop()
    cluster.broker = BrokerServer(settings, store=cluster.store)
    await cluster.broker.start()


async def arriving(consumer: Consumer) -> list[str]:
    """Every message that arrives until none has for 1 s (a bounded absence check)."""
    out: list[str] = []
    while True:
        try:
            out.append((await consumer.receive(timeout_s=1.0)).value.decode())
        except TimeoutError:
            return out


async def test_a_committed_transactions_acks_are_not_delivered_again_after_a_restart(
    cluster: Cluster,
) -> None:
    """Design note 15: "nothing acknowledged in a committed transaction is delivered
    again". A cursor stores only its first ``max_persisted_ranges`` ranges (10,000 by
    default; 1 here to keep the test small), so a commit's acks record stays until a save
    holds its acks. It was deleted after any save: acks past the ranges were in no save and
    no record, and after a restart their messages came again (duplicates downstream)."""
    await restart_broker(cluster, ledger=LedgerSettings(max_persisted_ranges=1))
    async with Client(cluster.url) as client:
        consumer = await setup(client, 5, subscription_type="Shared")
        got = {
            m.value.decode(): m for m in [await consumer.receive(timeout_s=10) for _ in range(5)]
        }
        async with client.transaction() as txn:
            await consumer.acknowledge(got["m1"], txn=txn)
            await consumer.acknowledge(got["m3"], txn=txn)

        acks = subscription(cluster).pending_acks
        assert isinstance(acks, MetadataPendingAckStore)
        await wait_until(
            lambda: acks._saver is None and any(k for k, _ in acks._after_save),
            what="the cursor saved after the commit, the record kept for a later save",
        )
        kept = (await cluster.store.list_prefix(T.ops_prefix(txn.id))).records
        assert kept, "the acks record was deleted though the cursor's save left out m3"
        await consumer.close()
    await restart_broker(cluster)
    async with Client(cluster.url) as client:
        again = await client.subscribe(
            TOPIC, SUB, initial_position="earliest", subscription_type="Shared"
        )
        redelivered = await arriving(again)
    assert sorted(redelivered) == ["m0", "m2", "m4"], (
        f"{sorted(redelivered)} delivered after the restart; m1 and m3 were acknowledged "
        f"in the committed {txn.id}"
    )


async def test_a_committed_v4_transactions_acks_survive_a_compaction_and_a_restart(
    cluster: Cluster,
) -> None:
    """The same for a v4 transaction: its pending-ack log's compaction keeps a committed
    transaction's acks that no cursor save holds (logged again, committed), so a restart
    applies them again. It kept the open transactions' only, and after a restart the
    committed-acked messages past the saved ranges came again."""
    await restart_broker(cluster, ledger=LedgerSettings(max_persisted_ranges=1))
    name = TopicName.parse(V4_TOPIC)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(V4_TOPIC)
        producer = await client.create_producer(V4_TOPIC)
        for i in range(5):
            await producer.send(f"m{i}".encode())
        consumer = await client.subscribe(
            V4_TOPIC, SUB, initial_position="earliest", subscription_type="Shared"
        )
        got = {
            m.value.decode(): m for m in [await consumer.receive(timeout_s=10) for _ in range(5)]
        }
        async with client.transaction() as txn:
            await consumer.acknowledge(got["m1"], txn=txn)
            await consumer.acknowledge(got["m3"], txn=txn)
        acks = subscription(cluster, name).pending_acks
        assert isinstance(acks, MLPendingAckStore)
        await wait_until(lambda: not acks.transactions(), what="the commit applied")
        await acks.compact()  # the committed transaction's log entries are cut
        await consumer.close()
    await restart_broker(cluster)
    async with Client(cluster.url) as client:
        again = await client.subscribe(
            V4_TOPIC, SUB, initial_position="earliest", subscription_type="Shared"
        )
        redelivered = await arriving(again)
    assert sorted(redelivered) == ["m0", "m2", "m4"], (
        f"{sorted(redelivered)} delivered after the restart; m1 and m3 were acknowledged "
        "in a committed transaction"
    )


async def test_a_plain_cumulative_ack_does_not_take_a_message_an_open_transaction_holds(
    client: Client, cluster: Cluster
) -> None:
    """A transaction holds m0, m1 (individual acks, in order); the consumer then acks m3
    cumulatively, outside the transaction. As a plain ack of a held message, it is ignored
    (docs/transactions.md). It moved the cursor past m0, m1: the transaction's abort no
    longer brought them back, although their processing in it was discarded."""
    consumer = await setup(client, 4)
    got = [await consumer.receive(timeout_s=10) for _ in range(4)]
    txn = await client.transaction().start()
    await consumer.acknowledge(got[0], txn=txn)
    await consumer.acknowledge(got[1], txn=txn)
    await consumer.acknowledge_cumulative(got[3])
    await txn.abort()
    assert (await receive(consumer, 2)) == ["m0", "m1"]


# ---------------------------------------------------------------------- v4 (a log)


async def test_a_v4_ack_admitted_as_its_transaction_aborts_is_not_held_for_good(
    client: Client, cluster: Cluster
) -> None:
    """The first ack of a v4 transaction on a subscription asks its coordinator, which
    answers OPEN; before that answer is used, the transaction is aborted and its
    END_TXN_ON_SUBSCRIPTION reaches the broker (nothing held yet: it only remembers the
    outcome). The ack then reserves the message for a transaction that ended: nothing will
    ever release it (a repeated END returns early; a restart replays the ack after the
    ABORT), so it was never delivered again and no other transaction could acknowledge it.
    The ack is now refused."""
    await client.admin.create_topic(V4_TOPIC)
    producer = await client.create_producer(V4_TOPIC)
    await producer.send(b"m0")
    consumer = await client.subscribe(
        V4_TOPIC, SUB, initial_position="earliest", subscription_type="Shared"
    )
    m0 = await consumer.receive(timeout_s=10)
    name = TopicName.parse(V4_TOPIC)
    sub = subscription(cluster, name)
    checks = sub.pending_acks._checks  # type: ignore[attr-defined]
    txn = client.transaction()
    with held_after(checks, "admit_ack") as (entered, opened):
        ack = asyncio.create_task(consumer.acknowledge(m0, txn=txn))
        await asyncio.wait_for(entered.wait(), 10)  # the coordinator said OPEN
        await cluster.coordinator.app[V4].end_txn(txn.id, TxnAction.ABORT)
        opened.set()
        await asyncio.gather(ack, return_exceptions=True)
    assert sub.pending_acks.holder(position(m0)) is None, (
        f"m0 is held by {txn.id}, which was aborted before the ack was reserved"
    )
    other = client.transaction()  # and m0 can be acknowledged in another transaction
    await consumer.acknowledge(m0, txn=other)  # (now: "held by <the aborted one>, still open")
    await other.commit()
