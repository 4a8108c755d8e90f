"""A transaction ended (``commit()``, ``abort()``, leaving ``async with``) while a send in
it is still joining it: opening it (NEW_TXN in flight, or a pre-started one being fetched)
or registering its topic (a v4 ADD_PARTITION in flight). The end waits for the join, so
the coordinator's transaction is ended too, and the send's outcome is the end's. Real
broker and coordinator on loopback (memory store); the join is held on purpose with a
gate (:func:`tests.txn.test_ordered_redelivery.gated`). An abort that stops waiting for the
start: tests/client/test_transaction_states.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

from segtxn.client import (
    Client,
    Consumer,
    Producer,
    ScalableProducer,
    Transaction,
    TransactionEnded,
)
from segtxn.client.coordinators import Coordinators
from segtxn.client.prestart import Opened
from segtxn.protocol.txn import TxnState
from tests.client.held_answers import hold_answers
from tests.client.test_timeouts import Outcome, timed
from tests.cluster import Cluster
from tests.txn.test_ordered_redelivery import gated, nothing_arrives

pytestmark = pytest.mark.parametrize("cluster", ["memory"], indirect=True)


async def setup(client: Client, topic: str) -> tuple[Producer | ScalableProducer, Consumer]:
    if topic.startswith("topic://"):
        await client.admin.create_topic(topic, segments=1)
    else:
        await client.admin.create_topic(topic)
    reader = await client.subscribe(topic, "check", initial_position="earliest")
    return await client.create_producer(topic), reader


async def running(call: Awaitable[object]) -> asyncio.Task[Outcome]:
    """``call`` as a task, returned once it has run to its first wait (or its end): what
    it does before it waits is done when this returns."""
    started = asyncio.Event()

    async def run() -> Outcome:
        started.set()  # (the call runs on in this same step, up to its first wait)
        return await timed(call)

    task = asyncio.create_task(run())
    await asyncio.wait_for(started.wait(), 10)
    return task


async def ended_during_start(
    client: Client, topic: str, end: str
) -> tuple[Transaction, Outcome, Outcome, Consumer]:
    """A send starts a new transaction; ``end`` (``"commit"`` / ``"abort"``) is called
    while its NEW_TXN (or the pre-started transaction it takes) is held; then the start
    goes on. Returns the transaction, the send's and the end's outcomes, and a consumer of
    the topic."""
    producer, reader = await setup(client, topic)
    txn = client.transaction()
    with gated(Coordinators, "open") as start:
        send = await running(producer.send(b"out", txn=txn))
        await asyncio.wait_for(start.entered.wait(), 10)
        ending = await running(getattr(txn, end)())
    return txn, await send, await ending, reader


@pytest.mark.parametrize("prestart", [False, True], ids=["new-txn", "prestarted"])
async def test_a_commit_while_a_send_starts_the_transaction_commits_what_was_opened(
    cluster: Cluster, prestart: bool
) -> None:
    """commit() of a transaction a send is opening waits for the opening, then commits
    it with the send in it. It took the transaction for empty (NEW: "nothing reached a
    coordinator"), said COMMITTED at once, and the start then failed the send
    ("COMMITTED cannot become OPEN"): the coordinator's transaction stayed OPEN until its
    timeout, and the commit reported success for a send that failed."""
    topic = f"topic://acme/lifecycle/commit-{'prestart' if prestart else 'new'}"
    async with Client(cluster.url, prestart_transactions=prestart) as client:
        txn, sent, committed, reader = await ended_during_start(client, topic, "commit")
        assert await txn.status() == "COMMITTED", (
            f"the coordinator's transaction is {await txn.status()} after commit() returned "
            f"{committed.error!r} (the send: {sent.error!r})"
        )
        assert committed.error is None and sent.error is None, (committed, sent)
        assert txn.state == "COMMITTED"
        assert (await reader.receive(timeout_s=10)).value == b"out"


async def test_an_abort_while_a_send_starts_the_transaction_aborts_what_was_opened(
    cluster: Cluster,
) -> None:
    """abort() of a transaction a send is opening waits for the opening, then aborts it
    at its coordinator. It said ABORTED at once and left the coordinator's transaction
    OPEN until its timeout."""
    topic = "topic://acme/lifecycle/abort"
    async with Client(cluster.url) as client:
        txn, _, aborted, reader = await ended_during_start(client, topic, "abort")
        assert aborted.error is None, aborted
        assert await txn.status() == "ABORTED"
        assert txn.state == "ABORTED"
        await nothing_arrives(reader)


async def test_leaving_the_block_while_a_send_starts_the_transaction_commits_it(
    cluster: Cluster,
) -> None:
    """Leaving ``async with client.transaction()`` while a send in it opens it commits the
    transaction with the send. The block took the transaction for ended ("not OPEN") and
    left it: nothing committed, the coordinator's transaction OPEN until its timeout."""
    topic = "topic://acme/lifecycle/block"
    async with Client(cluster.url) as client:
        producer, reader = await setup(client, topic)
        txn = client.transaction()
        sends: list[asyncio.Task[Outcome]] = []
        leaving = asyncio.Event()

        async def block() -> None:
            async with txn:
                sends.append(await running(producer.send(b"out", txn=txn)))
                await asyncio.wait_for(start.entered.wait(), 10)
                leaving.set()  # (its __aexit__ runs on in this step, up to its first wait)

        with gated(Coordinators, "open") as start:
            left = asyncio.create_task(timed(block()))
            await asyncio.wait_for(leaving.wait(), 10)
        assert (await left).error is None
        assert (await sends[0]).error is None
        assert await txn.status() == "COMMITTED"
        assert (await reader.receive(timeout_s=10)).value == b"out"


async def test_a_v4_commit_while_a_send_registers_its_topic_commits_the_send(
    cluster: Cluster,
) -> None:
    """commit() of a v4 transaction while a send in it registers its topic
    (ADD_PARTITION in flight) waits for the registration and then for the send: the send
    is in what commits. The commit went ahead without it (the send was not counted until
    registered)."""
    topic = "persistent://acme/lifecycle/v4"
    async with Client(cluster.url) as client:
        producer, reader = await setup(client, topic)
        txn = await client.transaction().start("v4")

        def registering(coordinators: Coordinators, method: str, path: str, *_: Any) -> bool:
            return path.endswith("/partitions")

        with gated(Coordinators, "call", when=lambda *a, **_: registering(*a)) as registration:
            send = await running(producer.send(b"out", txn=txn))
            await asyncio.wait_for(registration.entered.wait(), 10)
            committing = await running(txn.commit())
        committed, sent = await committing, await send
        assert committed.error is None and sent.error is None, (committed, sent)
        assert await txn.status() == "COMMITTED"
        assert (await reader.receive(timeout_s=10)).value == b"out"


async def test_a_close_while_a_send_starts_a_transaction_aborts_what_was_opened(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Client.close()`` aborts the transactions left open. One whose NEW_TXN the
    coordinator had answered, the answer not yet taken in, was neither OPEN nor ended
    for the client: close() left it, it became OPEN after the close, and its coordinator
    kept it OPEN until its timeout (holding every reader of what the send wrote)."""
    topic = "topic://acme/lifecycle/close"
    answered, go_on = asyncio.Event(), asyncio.Event()
    opened: list[Opened] = []
    open_ = Coordinators._open

    async def answer_held(self: Coordinators, *args: Any, **kwargs: Any) -> Opened:
        opened.append(await open_(self, *args, **kwargs))  # the coordinator opened it
        answered.set()
        await go_on.wait()
        return opened[-1]

    monkeypatch.setattr(Coordinators, "_open", answer_held)
    client = Client(cluster.url)
    await client.__aenter__()
    producer, _ = await setup(client, topic)
    send = await running(producer.send(b"out", txn=client.transaction()))
    await asyncio.wait_for(answered.wait(), 10)
    closing = await running(client.close())
    go_on.set()
    assert (await closing).error is None
    await send  # (its outcome: either; the transaction's is what counts)
    header = await cluster.coordinator.coordinator.status(opened[0].txn)
    assert header.state is TxnState.ABORTED, f"{opened[0].txn} is {header.state} after close()"


async def test_an_ack_whose_registration_outlasts_an_abort_is_not_sent(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A v4 ack registers its subscription (ADD_SUBSCRIPTION); the coordinator has
    answered, the answer not yet taken in, when ``abort()`` stops waiting for it (after
    half its limit) and aborts. The ack then fails at once with TransactionEnded, nothing
    sent; it went to the broker, which refused it, the message staying unacknowledged."""
    topic = "persistent://acme/lifecycle/ack"
    async with Client(cluster.url) as client:
        producer, reader = await setup(client, topic)
        await producer.send(b"in")
        message = await reader.receive(timeout_s=10)
        txn = await client.transaction().start("v4")
        held = hold_answers(monkeypatch, "/subscriptions")
        try:
            ack = await running(reader.acknowledge(message, txn=txn))
            await asyncio.wait_for(held.answered.wait(), 10)
            await txn.abort(timeout_s=0.6)  # waits 0.3 s for the ack, then aborts
        finally:
            held.go_on.set()
        acked = await ack
        assert isinstance(acked.error, TransactionEnded), acked
        await reader.acknowledge(message)  # (plainly: it was not acknowledged in txn)
