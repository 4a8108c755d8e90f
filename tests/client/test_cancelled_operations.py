"""A transaction's operation cancelled by its caller: whether the broker applied it is
unknown, so the transaction must not commit as if it had not happened (or had): its commit
aborts and raises TransactionFailed, whose cause is OperationCancelled
(segtxn/client/transaction.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from segtxn.broker.dispatch import Subscription
from segtxn.client import Client, ClientClosed, Message, OperationCancelled, TransactionFailed
from segtxn.client.consumer import Consumer
from segtxn.protocol.errors import ErrorCategory
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/cancelled/in"
SEGMENT = TopicName.parse("segment://acme/cancelled/in/0")
SUB = "cancelled"


async def setup(client: Client, n: int) -> tuple[Consumer, list[Message]]:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(n):
        await producer.send(f"m{i}".encode())
    await producer.close()
    consumer = await client.subscribe(TOPIC, SUB, initial_position="earliest")
    return consumer, [await consumer.receive(timeout_s=10) for _ in range(n)]


def subscription(cluster: Cluster) -> Subscription:
    return cluster.broker.service.topics[SEGMENT].subscriptions[SUB]


async def test_a_transactional_ack_cancelled_on_its_way_dooms_the_transaction(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ack reached the broker and is held there while its caller is cancelled; then the
    broker records it. A commit now would commit an ack the application believes it
    cancelled: it aborts instead, raising TransactionFailed from OperationCancelled
    (OUTCOME_UNKNOWN), and the abort brings the message back."""
    consumer, got = await setup(client, 2)
    sub = subscription(cluster)
    reached, go_on = asyncio.Event(), asyncio.Event()
    original = sub.pending_acks.ack

    async def held(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        await go_on.wait()
        return await original(*args, **kwargs)

    monkeypatch.setattr(sub.pending_acks, "ack", held)
    txn = await client.transaction().start()
    ack = asyncio.create_task(consumer.acknowledge(got[0], txn=txn))
    await reached.wait()  # on the broker, not yet recorded
    ack.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ack
    go_on.set()
    wire = TxnId(*txn.wire_id)
    await wait_until(
        lambda: wire in sub.pending_acks.transactions(), what="the broker recorded the ack"
    )
    with pytest.raises(TransactionFailed) as failed:
        await txn.commit()
    cause = failed.value.__cause__
    assert isinstance(cause, OperationCancelled), cause
    assert cause.category is ErrorCategory.OUTCOME_UNKNOWN
    assert txn.state == "ABORTED"
    again = [await consumer.receive(timeout_s=10) for _ in range(2)]
    assert [m.value for m in again] == [b"m0", b"m1"]  # the abort rewound, in order


async def test_a_client_left_by_a_cancel_does_not_wait_to_flush(cluster: Cluster) -> None:
    """Ctrl-C (a cancel) inside ``async with Client(...)``: the exit fails the sends in
    flight at once with ClientClosed instead of flushing them for up to the operation
    timeout (before, an interrupted command stayed for it: 15-30 s)."""
    async with Client(cluster.url) as admin:
        await admin.admin.create_topic(TOPIC, segments=1)
    step = cluster.faults.hold("txn", key_prefix=T.OPS, times=None, before=True)
    sent: list[asyncio.Future[Any]] = []
    ready = asyncio.Event()

    async def application() -> None:
        async with Client(cluster.url, operation_timeout_s=30) as client:
            producer = await client.create_producer(TOPIC)
            txn = await client.transaction().start()
            sent.append(await producer.send_async(b"held", txn=txn))  # its record is held
            ready.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(application())
    try:
        await asyncio.wait_for(ready.wait(), 10)
        await step.wait_for(1)
        task.cancel()
        async with asyncio.timeout(5):  # not the 30 s operation timeout
            await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        with pytest.raises(ClientClosed):
            await sent[0]
    finally:
        cluster.faults.clear()
        step.release()
