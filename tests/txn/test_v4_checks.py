"""v4 transaction ids are checked (issue 15, item 6): a send or ack naming a transaction its
coordinator does not know as open, with that topic or subscription in it, is refused, and
a v4 transaction nobody ends is ended by the broker after its timeout and grace, so no
client can stall a ``persistent://`` topic. On both stores, with real servers."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import V4TxnSettings
from segtxn.broker.txn.markers import CONTAINS_TXN, MarkerTransactionBuffer
from segtxn.client import Client, ServerError
from segtxn.client.timeouts import Deadline
from segtxn.coordinator.app import V4
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import Ack, ConsumerReady, Error, Flow, ProducerReady, Send
from segtxn.protocol.frames import Message as MessageFrame
from tests.cluster import Cluster
from tests.waiting import wait_until
from tests.wsframes import next_frame

T1 = "persistent://acme/v4/t1"
T2 = "persistent://acme/v4/t2"
PATH = "persistent/acme/v4/t1"
FAST = V4TxnSettings(check_timeout_s=2.0, grace_s=0.5, max_timeout_s=1.0, sweep_s=0.1)
"""Short grace and sweep, so abandoned transactions end within a test's patience."""


@asynccontextmanager
async def raw(url: str, path: str) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A WebSocket spoken by hand, as any program may: the client library is not needed
    to name a transaction id."""
    async with aiohttp.ClientSession() as session, session.ws_connect(url + path) as ws:
        yield ws


async def refused_send(url: str, txn: tuple[int, int], seq: int) -> Error:
    async with raw(url, f"/ws/v2/producer/{PATH}?name=hostile") as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        await ws.send_bytes(frames.encode(Send(seq=seq, payload=b"stall?", txn=txn)))
        answer = await next_frame(ws)
        assert isinstance(answer, Error) and answer.seq == seq, answer
        return answer


def buffer(cluster: Cluster, topic: str) -> MarkerTransactionBuffer:
    loaded = [t for n, t in cluster.broker.service.topics.items() if str(n) == topic]
    assert loaded and isinstance(loaded[0].buffer, MarkerTransactionBuffer)
    return loaded[0].buffer


async def restart_broker(cluster: Cluster, v4: V4TxnSettings = FAST) -> None:
    """The broker again on the same store and files, with ``v4`` checks."""
    settings = dataclasses.replace(cluster.broker.settings, v4_txns=v4)
    await cluster.broker.stop()
    cluster.broker = BrokerServer(settings, store=cluster.store)
    await cluster.broker.start()


async def test_sends_naming_transactions_no_coordinator_has_open_are_refused(
    cluster: Cluster, client: Client
) -> None:
    for topic in (T1, T2):
        await client.admin.create_topic(topic)
    consumer = await client.subscribe(T1, "s", initial_position="earliest")
    producer = await client.create_producer(T1)
    await producer.send(b"before")
    on_t2 = await client.create_producer(T2)
    elsewhere = client.transaction()  # open, but registered on T2 only
    await on_t2.send(b"t2", txn=elsewhere)
    ended = client.transaction()  # committed, on T2 only
    await on_t2.send(b"t2", txn=ended)
    await ended.commit()
    committed = client.transaction()  # committed here: the topic remembers it ended
    await producer.send(b"committed", txn=committed)
    await committed.commit()

    answers = {
        "never issued": await refused_send(cluster.url, (0, 999_999), 0),
        "no such coordinator id": await refused_send(cluster.url, (7, 1), 1),
        "not added to it": await refused_send(cluster.url, elsewhere.wire_id, 2),
        "ended": await refused_send(cluster.url, ended.wire_id, 3),
        "ended here": await refused_send(cluster.url, committed.wire_id, 4),
    }
    assert {case: ErrorName(a.error) for case, a in answers.items()} == {
        "never issued": ErrorName.TRANSACTION_NOT_FOUND,
        "no such coordinator id": ErrorName.TRANSACTION_NOT_FOUND,
        "not added to it": ErrorName.INVALID_TXN_STATUS,
        "ended": ErrorName.INVALID_TXN_STATUS,
        "ended here": ErrorName.TRANSACTION_CONFLICT,  # as before: no coordinator call
    }, answers
    assert "ADD_PARTITION_TO_TXN" in answers["not added to it"].message

    await producer.send(b"after")  # the topic keeps flowing: nothing holds the horizon
    assert [(await consumer.receive(timeout_s=10)).value for _ in range(3)] == [
        b"before",
        b"committed",
        b"after",
    ]
    assert buffer(cluster, T1).ongoing == set()
    await elsewhere.abort()


async def test_pip373_property_stays_false_after_a_refused_send(
    cluster: Cluster, client: Client
) -> None:
    await client.admin.create_topic(T1)
    await (await client.create_producer(T1)).send(b"plain")
    error = await refused_send(cluster.url, (0, 4242), 0)
    assert ErrorName(error.error) is ErrorName.TRANSACTION_NOT_FOUND
    assert (await client.admin.properties(T1))[CONTAINS_TXN] == "false"


async def test_acks_naming_transactions_no_coordinator_has_open_are_refused(
    cluster: Cluster, client: Client
) -> None:
    await client.admin.create_topic(T1)
    producer = await client.create_producer(T1)
    for value in (b"m0", b"m1"):
        await producer.send(value)
    query = "type=Shared&initial=earliest&name=hostile"
    async with raw(cluster.url, f"/ws/v2/consumer/{PATH}/s?{query}") as ws:
        assert isinstance(await next_frame(ws), ConsumerReady)
        await ws.send_bytes(frames.encode(Flow(permits=10)))
        first = await next_frame(ws)
        assert isinstance(first, MessageFrame)
        for request_id, txn in ((1, (0, 999_999)), (2, (5, 3))):
            ack = Ack(message_ids=[first.message_id], request_id=request_id, txn=txn)
            await ws.send_bytes(frames.encode(ack))
            while not isinstance(answer := await next_frame(ws), Error):
                assert isinstance(answer, MessageFrame)  # m1 may come first
            assert answer.request_id == request_id
            assert ErrorName(answer.error) is ErrorName.TRANSACTION_NOT_FOUND, answer
    # the message is not held by any transaction: the subscription goes on
    consumer = await client.subscribe(T1, "s", subscription_type="Shared")
    values: set[bytes] = set()
    while values != {b"m0", b"m1"}:
        message = await consumer.receive(timeout_s=10)
        values.add(message.value)
        await consumer.acknowledge(message)
    await wait_until(
        lambda: _backlog(client), timeout=10, what="the subscription's backlog drained"
    )


async def _backlog(client: Client) -> bool:
    stats = await client.admin.stats(T1)
    return bool(stats["subscriptions"]["s"]["backlog"] == 0)


async def test_an_ack_in_a_transaction_not_added_to_the_subscription_is_refused(
    client: Client,
) -> None:
    await client.admin.create_topic(T1)
    producer = await client.create_producer(T1)
    await producer.send(b"m0")
    consumer = await client.subscribe(T1, "s", initial_position="earliest")
    message = await consumer.receive(timeout_s=10)
    txn = client.transaction()
    await txn.add_subscription(T1, "other")  # registered elsewhere
    stream = consumer._stream(message.message_id)
    assert stream is not None
    with pytest.raises(ServerError) as refused:  # the raw ack, without registering "s"
        await stream.ack(
            [message.message_id], cumulative=False, txn=txn.wire_id, deadline=Deadline(10)
        )
    assert refused.value.name is ErrorName.INVALID_TXN_STATUS
    assert "ADD_SUBSCRIPTION_TO_TXN" in refused.value.message
    await consumer.acknowledge(message, txn=txn)  # registered by the client: accepted
    await txn.commit()


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted"])
async def test_a_transaction_whose_coordinator_vanished_is_aborted_by_the_broker(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, restart: bool
) -> None:
    """Its coordinator is gone (no process holds its id) before it ends: after its timeout
    and the grace the broker aborts it itself — the abort marker on the topic, its acks
    released — and readers go past it. Restarted: the broker finds it at recovery, cannot
    learn its deadline, and assumes ``max_timeout_s``."""
    caplog.set_level(logging.WARNING, logger="segtxn.broker.txn.v4checks")
    await restart_broker(cluster)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(T1)
        producer = await client.create_producer(T1)
        await producer.send(b"input")
        shared = await client.subscribe(
            T1, "work", subscription_type="Shared", initial_position="earliest"
        )
        reader = await client.create_reader(T1)
        assert (await reader.receive(timeout_s=10)).value == b"input"
        txn = client.transaction(timeout_s=1.0)
        await producer.send(b"in-txn", txn=txn)
        taken = await shared.receive(timeout_s=10)
        await shared.acknowledge(taken, txn=txn)
        await producer.send(b"after")
        with pytest.raises(TimeoutError):  # held behind the open transaction
            await reader.receive(timeout_s=0.3)
        await cluster.coordinator.app[V4].stop()  # no process holds its id any more
        if restart:
            await restart_broker(cluster)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert (await reader.receive(timeout_s=15)).value == b"after"  # past the aborted one
        assert loop.time() - started < 15
        # its ack was released, its entry is skipped (Shared: in whatever order)
        got = {m.value: m for m in [await shared.receive(timeout_s=15) for _ in range(2)]}
        assert set(got) == {b"input", b"after"}
        assert restart or got[b"input"].redelivery_count == 1  # (a restart counts anew)
        assert buffer(cluster, T1).ongoing == set()
        checks = cluster.broker.service.v4_checks
        await wait_until(lambda: not checks.tracked, what="nothing left to end")
        # the client still holds txn open, and its abort at close cannot reach the vanished
        # coordinator: bound that attempt, or it is retried for the whole operation timeout
        await client.close(timeout_s=1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for where in (T1, f"{T1} subscription 'work'"):
        assert any(f"txn {txn.id}: aborted on {where} by this broker" in w for w in warnings)


async def test_the_sweep_applies_a_decision_its_coordinator_could_not_deliver(
    cluster: Cluster,
) -> None:
    """The coordinator decided COMMIT but the fan-out never reached the broker: after the
    timeout and grace the broker asks, and commits (never an abort against a decision)."""
    await restart_broker(cluster)
    v4: CoordinatorV4 = cluster.coordinator.app[V4]
    async with Client(cluster.url) as client:
        await client.admin.create_topic(T1)
        producer = await client.create_producer(T1)
        consumer = await client.subscribe(T1, "s", initial_position="earliest")
        txn = client.transaction(timeout_s=1.0)
        await producer.send(b"decided", txn=txn)
        participants = v4.participants
        assert participants is not None  # the coordinator has started
        fan_out = participants.call

        async def unreachable(*_: object) -> None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, "broker unreachable")

        participants.call = unreachable  # type: ignore[method-assign, assignment]  # a stand-in
        try:
            with pytest.raises(TimeoutError):  # END answers ServiceNotReady until the limit
                await txn.commit(timeout_s=0.5)
            assert await txn.status() == "COMMITTING"
            assert (await consumer.receive(timeout_s=15)).value == b"decided"
        finally:
            participants.call = fan_out  # type: ignore[method-assign]  # the real one back
        assert buffer(cluster, T1).ongoing == set()
