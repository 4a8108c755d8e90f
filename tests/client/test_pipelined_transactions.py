"""Pipelined transactions (``client.transaction(after=previous)``, segtxn/client/transaction.py):
a consume-transform-produce loop works on its next batch while the last one commits. What
a chain of them wrote counts in their order or not at all: one commits only once the one it
follows has committed, and is aborted when that one is not; it starts once that one's sends
and acks are done, so that on an ordered subscription its acks never meet theirs on the way
(TransactionConflict)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from segtxn.client import (
    Client,
    Consumer,
    ErrorCategory,
    PrecedingNotCommitted,
    ScalableProducer,
    Timeout,
    Transaction,
    TransactionFailed,
)
from segtxn.client.messages import Message
from tests.cluster import Cluster

INPUT = "topic://acme/pipe/in"
OUTPUT = "topic://acme/pipe/out"
RECEIVE_S = 10.0


async def topics(client: Client) -> tuple[ScalableProducer, Consumer, ScalableProducer]:
    """The input (two segments) with its feeder, the loop's consumer of it (Exclusive: an
    ordered subscription), and the producer of the output (one segment: a marker sent
    after everything else is read after everything visible, see :func:`visible`)."""
    await client.admin.create_topic(INPUT, segments=2)
    await client.admin.create_topic(OUTPUT, segments=1)
    feeder = await client.create_producer(INPUT)
    consumer = await client.subscribe(
        INPUT, "loop", initial_position="earliest", subscription_type="Exclusive"
    )
    out = await client.create_producer(OUTPUT)
    assert isinstance(feeder, ScalableProducer) and isinstance(out, ScalableProducer)
    return feeder, consumer, out


async def visible(client: Client) -> list[Message]:
    """Every output message a reader of the output can see now: read up to a plain marker
    sent after everything else, on the output's one segment (what is not visible before it
    never will be: an open transaction's entries hold back what follows them)."""
    marker = await client.create_producer(OUTPUT)
    await marker.send(b"marker", key="marker")
    reader = await client.subscribe(
        OUTPUT, f"check-{id(marker)}", initial_position="earliest", subscription_type="Exclusive"
    )
    seen: list[Message] = []
    while True:
        message = await reader.receive(RECEIVE_S)
        await reader.acknowledge(message)
        if message.value == b"marker":
            return seen
        seen.append(message)


async def work(
    client: Client,
    consumer: Consumer,
    out: ScalableProducer,
    size: int,
    after: Transaction | None,
) -> Transaction:
    """One batch: receive ``size`` inputs, send one output each and acknowledge them, in a
    transaction that follows ``after``; not committed."""
    inputs = [await consumer.receive(RECEIVE_S) for _ in range(size)]
    txn = await client.transaction(after=after).start()
    for message in inputs:
        await out.send_async(b"out-" + message.value, key=message.key, txn=txn)
        await consumer.acknowledge_async(message, txn=txn)
    return txn


async def test_a_pipelined_loop_commits_every_batch_once_in_order(client: Client) -> None:
    """Each batch's commit runs while the next batch is worked on. On an ordered
    subscription every batch commits (no TransactionConflict from acks meeting on the
    way), and the outputs are every input's once, in each key's order."""
    feeder, consumer, out = await topics(client)
    count, size, keys = 60, 6, 5
    for i in range(count):
        await feeder.send(f"{i:03d}".encode(), key=f"k{i % keys}")
    previous: Transaction | None = None
    committing: asyncio.Task[None] | None = None
    for _ in range(count // size):
        txn = await work(client, consumer, out, size, previous)
        commit = asyncio.create_task(txn.commit())
        if committing is not None:
            await committing  # the previous one's: committed before this one can be
        committing, previous = commit, txn
    assert committing is not None
    await committing
    outputs = await visible(client)
    by_key: dict[str | None, list[bytes]] = defaultdict(list)
    for message in outputs:
        by_key[message.key].append(message.value)
    expected = {
        f"k{k}": [f"out-{i:03d}".encode() for i in range(k, count, keys)] for k in range(keys)
    }
    assert dict(by_key) == expected


async def test_one_that_follows_an_aborted_transaction_is_aborted_too(client: Client) -> None:
    """The first is aborted after the second has done its sends and acks: the second's
    commit raises TransactionFailed from PrecedingNotCommitted, nothing either wrote is
    visible, and both batches' inputs come again, in order."""
    feeder, consumer, out = await topics(client)
    for i in range(4):
        await feeder.send(f"{i:03d}".encode(), key="k")
    first = await work(client, consumer, out, 2, None)
    second = await work(client, consumer, out, 2, first)
    await first.abort()
    with pytest.raises(TransactionFailed) as failed:
        await second.commit()
    cause = failed.value.__cause__
    assert isinstance(cause, PrecedingNotCommitted)
    assert f"follows transaction {first.id}, which was aborted" in str(cause)
    assert failed.value.category is ErrorCategory.ABORTABLE
    assert second.state == "ABORTED"
    assert await visible(client) == []
    again = [(await consumer.receive(RECEIVE_S)).value for _ in range(4)]
    assert again == [b"000", b"001", b"002", b"003"]


async def test_one_commits_only_once_the_one_it_follows_has(client: Client) -> None:
    """The second's commit is called first: it asks nobody to commit it while the first is
    open, and commits once the first has; the outputs are the first's, then the second's."""
    feeder, consumer, out = await topics(client)
    for i in range(4):
        await feeder.send(f"{i:03d}".encode(), key="k")
    first = await work(client, consumer, out, 2, None)
    second = await work(client, consumer, out, 2, first)
    committing = asyncio.create_task(second.commit())
    done, _ = await asyncio.wait({committing}, timeout=1.0)
    assert not done and second.state == "OPEN"  # nothing was asked to commit it
    await first.commit()
    await committing
    assert (first.state, second.state) == ("COMMITTED", "COMMITTED")
    assert [m.value for m in await visible(client)] == [
        b"out-000",
        b"out-001",
        b"out-002",
        b"out-003",
    ]


async def test_one_whose_predecessor_never_ends_is_aborted_at_its_commit_limit(
    client: Client,
) -> None:
    """The first is left open: the second's commit waits for it for half its own limit,
    then aborts the second in the other half (committed, it could count before the
    first)."""
    feeder, consumer, out = await topics(client)
    for i in range(2):
        await feeder.send(f"{i:03d}".encode(), key="k")
    first = await work(client, consumer, out, 1, None)
    second = await work(client, consumer, out, 1, first)
    with pytest.raises(TransactionFailed) as failed:
        await second.commit(timeout_s=4.0)
    assert isinstance(failed.value.__cause__, PrecedingNotCommitted)
    assert "which had not ended within" in str(failed.value.__cause__)
    assert (first.state, second.state) == ("OPEN", "ABORTED")
    await first.commit()  # its own outcome is its own
    assert [m.value for m in await visible(client)] == [b"out-000"]


async def test_one_starts_once_the_sends_and_acks_of_the_one_it_follows_are_done(
    cluster: Cluster, client: Client
) -> None:
    """The first's acknowledgment is held on its way (its op record's store write parked):
    the second does not start until it is done; with a limit shorter than that, its start
    fails with a RETRIABLE Timeout and nothing was done."""
    feeder, consumer, _ = await topics(client)
    await feeder.send(b"000", key="k")
    message = await consumer.receive(RECEIVE_S)
    first = await client.transaction().start()
    held = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1)
    acked = await consumer.acknowledge_async(message, txn=first)
    await held.wait_for(1)
    second = client.transaction(after=first)
    with pytest.raises(Timeout) as late:
        await second.start(timeout_s=0.5)
    assert late.value.category is ErrorCategory.RETRIABLE
    assert "still has 1 operations in flight" in str(late.value)
    starting = asyncio.create_task(second.start())
    done, _ = await asyncio.wait({starting}, timeout=0.5)
    assert not done
    held.release(0)
    await acked
    await starting
    assert second.state == "OPEN"
    await first.commit()
    await second.commit()


async def test_after_must_be_a_transaction(client: Client) -> None:
    with pytest.raises(TypeError, match="after must be a Transaction or None, not str"):
        client.transaction(after="txn-1")  # type: ignore[arg-type]
