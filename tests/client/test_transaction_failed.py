"""``TransactionFailed``'s category says what to do next: ABORTABLE (the transaction was
aborted: start a new one) unless its cause is one a new transaction would meet again
(found trying the client as a new user: it was always FATAL, "retrying will not help",
also when another transaction merely held a message for a moment, while the same
situation met by ``commit()`` directly, InvalidTxnStatus, said ABORTABLE)."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.client import (
    Client,
    ErrorCategory,
    OperationCancelled,
    TransactionConflict,
    TransactionFailed,
)

TOPIC = "topic://acme/failed/in"


async def test_a_conflict_makes_it_abortable(client: Client) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    await producer.send(b"m", key="k")
    message = await consumer.receive(timeout_s=10)
    holder, late = client.transaction(), client.transaction()
    await consumer.acknowledge(message, txn=holder)
    with pytest.raises(TransactionConflict):
        await consumer.acknowledge(message, txn=late)
    with pytest.raises(TransactionFailed) as failed:
        await late.commit()
    assert isinstance(failed.value.__cause__, TransactionConflict)
    assert failed.value.category is ErrorCategory.ABORTABLE
    assert not failed.value.retriable
    await holder.commit()


async def test_a_cancelled_operation_makes_it_abortable(client: Client) -> None:
    """Unknown while the transaction was open; once it is aborted, it is known."""
    txn = await client.transaction().start()
    operation: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    txn.operations.track(operation)
    operation.cancel()
    with pytest.raises(TransactionFailed) as failed:
        await txn.commit()
    assert isinstance(failed.value.__cause__, OperationCancelled)
    assert failed.value.category is ErrorCategory.ABORTABLE


async def test_a_programming_error_keeps_it_fatal(client: Client) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = client.transaction()
    await producer.send(b"fine", key="k", txn=txn)
    with pytest.raises(TypeError):
        await producer.send("not bytes", key="k", txn=txn)  # type: ignore[arg-type]
    with pytest.raises(TransactionFailed) as failed:
        await txn.commit()
    assert isinstance(failed.value.__cause__, TypeError)
    assert failed.value.category is ErrorCategory.FATAL


async def test_a_send_refused_before_the_transaction_started_fails_its_commit(
    client: Client,
) -> None:
    """Nothing reached a server (the first send was refused in the client), yet the
    application was told that send failed: committing the rest without it must not look
    like success."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = client.transaction()
    with pytest.raises(TypeError):
        await producer.send("not bytes", key="k", txn=txn)  # type: ignore[arg-type]
    with pytest.raises(TransactionFailed) as failed:
        await txn.commit()
    assert isinstance(failed.value.__cause__, TypeError)
    assert txn.state.value == "ABORTED"
