"""``Consumer.acknowledge_async``: a batch's acks queued without awaiting each, one frame
on the wire, and the commit waits for them (or aborts on their failure)."""

from __future__ import annotations

import dataclasses

import pytest

from segtxn.client import Client, ErrorName, ServerError, TransactionFailed
from segtxn.client.errors import ClientClosed
from tests.client.test_gathered_acks import forged, position, record_calls, setup, subscription
from tests.cluster import Cluster
from tests.waiting import wait_until


async def test_a_batch_queued_in_a_loop_is_one_request_and_the_commit_waits_for_it(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer, got = await setup(client, 5)
    sub = subscription(cluster)
    calls = record_calls(monkeypatch, sub.pending_acks, "ack")
    txn = await client.transaction().start()
    acks = [await consumer.acknowledge_async(m, txn=txn) for m in got]
    assert not any(a.done() for a in acks)  # queued: nothing was awaited
    await txn.commit()
    assert all(a.done() and a.exception() is None for a in acks)  # the commit waited
    assert calls == [[position(m) for m in got]]
    assert await txn.status() == "COMMITTED"
    await wait_until(
        lambda: sub.cursor.mark_delete == position(got[-1]), timeout=10, what="acks applied"
    )


async def test_a_refused_queued_ack_makes_the_commit_abort(client: Client) -> None:
    """Nobody awaited the refused ack: the commit finds it, aborts, raises TransactionFailed
    from the refusal, and the messages come again."""
    consumer, got = await setup(client, 3)
    txn = await client.transaction().start()
    bad = dataclasses.replace(got[1], message_id=forged(got[1]))
    for message in [got[0], bad, got[2]]:
        await consumer.acknowledge_async(message, txn=txn)
    with pytest.raises(TransactionFailed) as failed:
        await txn.commit()
    assert isinstance(failed.value.__cause__, ServerError)
    assert failed.value.__cause__.name is ErrorName.INVALID_ARGUMENT
    assert await txn.status() == "ABORTED"
    again = [await consumer.receive(timeout_s=10) for _ in range(3)]
    assert sorted(m.value for m in again) == [b"m0", b"m1", b"m2"]


async def test_plain_queued_acks_answer_each_caller(client: Client, cluster: Cluster) -> None:
    consumer, got = await setup(client, 3)
    sub = subscription(cluster)
    good = [await consumer.acknowledge_async(m) for m in got]
    refused = await consumer.acknowledge_async(forged(got[0]))
    for ack in good:
        await ack  # raises if refused
    with pytest.raises(ServerError) as error:
        await refused
    assert error.value.name is ErrorName.INVALID_ARGUMENT
    assert sub.cursor.mark_delete == position(got[-1])


async def test_a_closed_consumer_refuses_at_the_call(client: Client) -> None:
    consumer, got = await setup(client, 1)
    await consumer.close()
    with pytest.raises(ClientClosed):
        await consumer.acknowledge_async(got[0])
