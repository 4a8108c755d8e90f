"""A producer's send cancelled by its caller while the message is still on its way: the
message goes on (it may be stored), so it keeps its place in the producer's window
(``max_pending``, segtxn/client/producer.py). It failed before its fix (a review).

A real in-process cluster; the broker holds the send (its publishing waits on an event) so
that the message is in flight for as long as the test needs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from segtxn.broker.publishing import Publishing
from segtxn.client import Client
from segtxn.client.errors import Timeout
from segtxn.client.producer import Producer
from tests.waiting import wait_until

TOPIC = "persistent://acme/cancelled/sends"


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """The broker holds each send until the test lets it go: ``(reached, go_on)``, set when
    a send reaches its publishing, and to let the sends be stored."""
    reached, go_on = asyncio.Event(), asyncio.Event()
    original = Publishing.publish

    async def holding(self: Publishing, *args: Any) -> Any:
        reached.set()
        await go_on.wait()
        return await original(self, *args)

    monkeypatch.setattr(Publishing, "publish", holding)
    return reached, go_on


async def test_a_cancelled_send_keeps_its_place_in_the_window(
    client: Client, held: tuple[asyncio.Event, asyncio.Event]
) -> None:
    """``send`` waits on its message's future, so cancelling the caller cancelled that
    future, and its done callback gave the window slot back while the message was still
    pending (sent again after a reconnect, stored or not): a producer with
    ``max_pending=1`` let a second message in while the first was in flight."""
    reached, go_on = held
    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(TOPIC, max_pending=1, batching=False)
    assert isinstance(producer, Producer)
    try:
        sending = asyncio.create_task(producer.send(b"first"))
        await reached.wait()  # at the broker, not stored yet
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        assert producer.pending == 1  # still on its way

        # the window is full: a second message finds no room while the first is pending
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(producer.send_async(b"second"), 0.5)
        assert producer.pending == 1, "a second message went out past max_pending=1"

        go_on.set()  # the first is stored; its receipt gives the slot back
        await wait_until(lambda: producer.pending == 0, what="the first message's receipt")
        await asyncio.wait_for(producer.send(b"second"), 10)
    finally:
        go_on.set()
        await producer.close()
    reader = await client.create_reader(TOPIC, start="earliest")
    try:
        values = [(await reader.receive(10)).value for _ in range(2)]
    finally:
        await reader.close()
    assert values == [b"first", b"second"]


async def test_a_cancelled_send_gives_its_place_back_at_its_send_timeout(
    client: Client, held: tuple[asyncio.Event, asyncio.Event]
) -> None:
    """The other half: a cancelled send whose broker never answers does not hold its slot
    for good. Its send timeout ends it, as any send's (the expiry skipped a send whose
    future was done, so its slot would have stayed taken until the producer closed)."""
    reached, go_on = held
    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(
        TOPIC, max_pending=1, batching=False, send_timeout_s=0.5
    )
    assert isinstance(producer, Producer)
    try:
        sending = asyncio.create_task(producer.send(b"first"))
        await reached.wait()
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        await wait_until(lambda: producer.pending == 0, what="the send timeout of the first")
        second = await asyncio.wait_for(producer.send_async(b"second"), 10)  # room at once
        assert producer.pending == 1 and not second.done()
    finally:
        go_on.set()
        await producer.close()


async def test_flush_waits_for_a_cancelled_send_still_on_its_way(
    client: Client, held: tuple[asyncio.Event, asyncio.Event]
) -> None:
    """``flush`` waits until every message sent so far is stored or failed: one whose
    ``send`` was cancelled too, since it goes on and may be stored (flush waited on the
    messages' futures, and a cancelled one is done: it returned at once)."""
    reached, go_on = held
    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(TOPIC, batching=False)
    assert isinstance(producer, Producer)
    try:
        sending = asyncio.create_task(producer.send(b"first"))
        await reached.wait()
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        with pytest.raises(Timeout, match="1 messages still in flight"):
            await producer.flush(0.3)
        go_on.set()
        await producer.flush(10)
        assert producer.pending == 0
    finally:
        go_on.set()
        await producer.close()
