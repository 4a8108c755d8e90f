"""A closed producer, consumer or reader says so: every call on it raises ClientClosed at
once, and stores or waits for nothing (found trying the client as a new user: a closed
scalable producer still stored what it was given)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from segtxn.client import Client, ClientClosed, Message, ScalableProducer
from segtxn.client.producer import Producer
from segtxn.client.timeouts import Deadline
from tests.client.held_answers import hold_answers
from tests.client.test_txn_window_edges import Window
from tests.waiting import wait_until

PERSISTENT = "persistent://acme/closed/events"
SCALABLE = "topic://acme/closed/keyed"
T = TypeVar("T")


def stored(stats: dict[str, Any]) -> int:
    """Messages the broker stored on a topic: its own count, or its segments'."""
    if "segments" in stats:
        return sum(int(s["stats"]["msgInCounter"]) for s in stats["segments"])
    return int(stats["msgInCounter"])


@pytest.mark.parametrize("topic", [PERSISTENT, SCALABLE])
async def test_a_closed_producer_sends_nothing(client: Client, topic: str) -> None:
    # two segments: only one has a producer when it closes (a send routed to the other
    # used to open one and store the message)
    await client.admin.create_topic(topic, **({"segments": 2} if topic == SCALABLE else {}))
    producer = await client.create_producer(topic)
    await producer.send(b"before", key="k")
    await producer.close()
    for _ in range(2):  # unkeyed: round-robin, one to each segment
        with pytest.raises(ClientClosed, match=f"producer {producer.name} is closed"):
            await producer.send_async(b"after")
    with pytest.raises(ClientClosed):
        await producer.send(b"after", key="k")
    await producer.close()  # again: nothing to do
    assert stored(await client.admin.stats(topic)) == 1


async def test_a_segment_producer_connected_after_close_is_closed_too(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send's segment producer still connecting when the scalable producer closes: close()
    did not see it, so it stayed connected (a leaked connection and task)."""
    await client.admin.create_topic(SCALABLE, segments=2)
    producer = await client.create_producer(SCALABLE)
    assert isinstance(producer, ScalableProducer)
    connecting, go_on = asyncio.Event(), asyncio.Event()
    started: list[Producer] = []
    start = Producer.start

    async def held_start(self: Producer, deadline: Deadline) -> None:
        started.append(self)
        connecting.set()
        await go_on.wait()
        await start(self, deadline)

    monkeypatch.setattr(Producer, "start", held_start)
    send = asyncio.create_task(producer.send(b"x", key="k"))
    async with asyncio.timeout(10):
        await connecting.wait()
    await producer.close(timeout_s=0)
    go_on.set()
    with pytest.raises(ClientClosed):
        async with asyncio.timeout(10):
            await send
    assert len(started) == 1

    async def connected() -> int:
        stats = await client.admin.stats(SCALABLE)
        return sum(int(s["stats"]["producers"]) for s in stats["segments"])

    await wait_until(lambda: _none(connected()), what="no producer left connected")
    assert stored(await client.admin.stats(SCALABLE)) == 0


async def _none(count: Coroutine[Any, Any, int]) -> bool:
    return await count == 0


async def receiving(receive: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Task[T]:
    """A receive waiting for a message, in a task of its own."""
    task = asyncio.create_task(receive())
    await asyncio.sleep(0)  # sleep-ok: one loop step, in which it starts waiting
    assert not task.done()
    return task


async def closed_at_once(*waiting: asyncio.Task[Message]) -> None:
    """Each receive that was waiting raises ClientClosed at once (it used to wait forever)."""
    async with asyncio.timeout(5):
        for task in waiting:
            with pytest.raises(ClientClosed, match="is closed"):
                await task


@pytest.mark.parametrize("topic", [PERSISTENT, SCALABLE])
async def test_closing_a_consumer_ends_its_waiting_receives(client: Client, topic: str) -> None:
    await client.admin.create_topic(topic)
    consumer = await client.subscribe(topic, "s")
    one = await receiving(consumer.receive)
    two = await receiving(lambda: consumer.receive(timeout_s=60))

    async def iterate() -> Message | None:
        async for message in consumer:
            return message
        return None  # the loop ended

    loop = await receiving(iterate)
    await consumer.close()
    await closed_at_once(one, two)
    async with asyncio.timeout(5):
        assert await loop is None
    with pytest.raises(ClientClosed, match=f"consumer {consumer.name} is closed"):
        await consumer.receive(timeout_s=0)


@pytest.mark.parametrize("topic", [PERSISTENT, f"{SCALABLE}-segments"])
async def test_closing_a_reader_ends_its_waiting_receives(client: Client, topic: str) -> None:
    if topic.startswith("topic://"):
        await client.admin.create_topic(topic, segments=2)
        topic = topic.replace("topic://", "segment://") + "/1"
    else:
        await client.admin.create_topic(topic)
    reader = await client.create_reader(topic)
    one = await receiving(reader.receive)
    two = await receiving(lambda: reader.receive(timeout_s=60))
    await reader.close()
    await closed_at_once(one, two)


async def test_a_closed_reader_hands_out_nothing_it_had_queued(client: Client) -> None:
    await client.admin.create_topic(PERSISTENT)
    producer = await client.create_producer(PERSISTENT)
    for value in (b"a", b"b"):
        await producer.send(value)
    reader = await client.create_reader(PERSISTENT)
    assert (await reader.receive(timeout_s=10)).value == b"a"
    await reader.close()
    await reader.close()  # again: nothing to do
    for limit in (None, 0, 1):  # it used to wait out the limit, then raise Timeout
        with pytest.raises(ClientClosed, match=f"reader of {PERSISTENT} is closed"):
            await reader.receive(timeout_s=limit)


@pytest.mark.parametrize("topic", [PERSISTENT, SCALABLE])
async def test_a_closed_consumer_acknowledges_nothing(client: Client, topic: str) -> None:
    await client.admin.create_topic(topic)
    producer = await client.create_producer(topic)
    await producer.send(b"m", key="k")
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    message = await consumer.receive(timeout_s=10)
    await consumer.close()
    calls: list[Callable[[], Coroutine[Any, Any, None]]] = [
        lambda: consumer.acknowledge(message),
        lambda: consumer.acknowledge_cumulative(message.message_id),
        lambda: consumer.negative_acknowledge(message),
        consumer.redeliver_unacknowledged,
    ]
    for call in calls:  # an ack used to wait out the operation timeout, then raise Timeout
        async with asyncio.timeout(5):
            with pytest.raises(ClientClosed, match=f"consumer {consumer.name} is closed"):
                await call()
    # it was not acknowledged: the subscription's next consumer gets it
    again = await client.subscribe(topic, "s")
    assert (await again.receive(timeout_s=10)).value == b"m"


async def test_what_outlives_its_client_says_the_client_is_closed(client: Client) -> None:
    """A transaction or an admin handle kept past ``Client.close()`` raised aiohttp's bare
    ``RuntimeError: Session is closed``; it raises ClientClosed, a ClientError the
    application already catches, at once and having sent nothing."""
    opened = await client.transaction().start()  # aborted by the close
    unused = client.transaction()
    admin = client.admin
    await client.close()
    calls: list[Callable[[], Coroutine[Any, Any, object]]] = [
        opened.status,
        opened.commit,
        unused.start,
        lambda: client.transaction().start(),
        lambda: admin.create_topic(SCALABLE),
    ]
    for call in calls:
        async with asyncio.timeout(5):
            with pytest.raises(ClientClosed, match=r"client (was )?closed"):
                await call()


async def test_a_send_waiting_for_room_when_its_producer_closes_fails_at_once(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``max_pending=1``, its slot held at the broker; a second send waits for room. The
    producer's close fails the first with ClientClosed, which gives the slot to the second:
    it must fail at once with ClientClosed, nothing sent. It was queued on the closed
    producer, where nothing writes any more, and failed only at its send timeout, with a
    Timeout saying it may have been stored."""
    window = Window(monkeypatch)
    topic = "persistent://acme/closed/window"
    await client.admin.create_topic(topic)
    producer = await client.create_producer(topic, max_pending=1, batching=False, send_timeout_s=3)
    try:
        first = await producer.send_async(b"first")
        await asyncio.wait_for(window.reached.wait(), 10)
        second = asyncio.create_task(producer.send(b"second"))
        await asyncio.wait_for(window.full.wait(), 10)  # the second waits for room
        await producer.close(timeout_s=0.1)
        with pytest.raises(ClientClosed):
            await first
        with pytest.raises(ClientClosed, match=f"producer {producer.name} is closed"):
            await asyncio.wait_for(second, 2)  # (its send timeout is 3 s)
        assert window.published == [b"first"]
    finally:
        window.go_on.set()


async def test_an_ack_registering_when_its_consumer_closes_fails_at_once(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A v4 ack registers its subscription (ADD_SUBSCRIPTION), the answer held; the
    consumer closes meanwhile. Once registered, the ack must fail at once with
    ClientClosed, nothing sent. It was queued on the closed stream, where nothing writes
    any more, and failed only at its limit, with a Timeout saying it may have been
    applied."""
    topic = "persistent://acme/closed/registering"
    await client.admin.create_topic(topic)
    producer = await client.create_producer(topic)
    await producer.send(b"m")
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    message = await consumer.receive(timeout_s=10)
    txn = await client.transaction().start("v4")
    held = hold_answers(monkeypatch, "/subscriptions")
    try:
        ack = asyncio.create_task(consumer.acknowledge(message, txn=txn, timeout_s=3))
        await asyncio.wait_for(held.answered.wait(), 10)
        await consumer.close()
    finally:
        held.go_on.set()
    with pytest.raises(ClientClosed, match=f"consumer {consumer.name} is closed"):
        await asyncio.wait_for(ack, 2)  # (its limit is 3 s)
