"""A transaction ended (``commit()``) while a send in it waits for room in its producer's
window (``max_pending`` messages in flight: segtxn/client/inflight.py). The application
called ``send`` before ``commit``, so the send is in what commits: the commit waits for
it. A v4 send (``persistent://``) was counted by its transaction only once it had room, so
the commit went ahead without it. v5 (``topic://``) already counted it; its test keeps
it so. An ``abort()`` that stops waiting for such a send (or for one queued while its
producer reconnects) ends the transaction without it: the send then fails with
TransactionEnded and never reaches the broker.

Real broker and coordinator on loopback (memory store). The window is held full on
purpose: ``max_pending=1``, and the broker holds the send in it (outside the transaction)
until the test lets it go (its publishing waits on an event). The neighbouring joins (a
send opening the transaction, or registering its topic):
tests/client/test_txn_lifecycle_edges.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from segtxn.broker.publishing import Publishing
from segtxn.client import (
    Client,
    ErrorCategory,
    Producer,
    ScalableProducer,
    Timeout,
    TransactionEnded,
    TransactionFailed,
)
from segtxn.client.inflight import InFlight
from segtxn.client.timeouts import Deadline
from segtxn.protocol.frames import Send
from tests.client.test_txn_lifecycle_edges import running
from tests.txn.test_ordered_redelivery import nothing_arrives

pytestmark = pytest.mark.parametrize("cluster", ["memory"], indirect=True)

TOPICS = {"v4": "persistent://acme/window/{}", "v5": "topic://acme/window/{}"}


class Window:
    """The broker holds every send until :attr:`go_on` is set; :attr:`reached` is set when
    one reaches its publishing, :attr:`full` when a send finds the producer's window full
    and starts waiting for room; :attr:`published` is the payloads that reached the broker."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached, self.go_on, self.full = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.published: list[bytes] = []
        publish, room = Publishing.publish, InFlight.room

        async def holding(publishing: Publishing, producer: str, send: Send, *args: Any) -> Any:
            self.published.append(send.payload)
            self.reached.set()
            await self.go_on.wait()
            return await publish(publishing, producer, send, *args)

        async def waiting(in_flight: InFlight, deadline: Deadline, producer: str) -> None:
            if len(in_flight) >= in_flight.max_pending:
                self.full.set()
            await room(in_flight, deadline, producer)

        monkeypatch.setattr(Publishing, "publish", holding)
        monkeypatch.setattr(InFlight, "room", waiting)


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch) -> Iterator[Window]:
    held = Window(monkeypatch)
    try:
        yield held
    finally:
        held.go_on.set()  # (a failed test does not leave the broker's sends held)


async def producer_for(client: Client, protocol: str, name: str) -> Producer | ScalableProducer:
    topic = TOPICS[protocol].format(name)
    if protocol == "v5":
        await client.admin.create_topic(topic, segments=1)  # one segment: one window
    else:
        await client.admin.create_topic(topic)
    return await client.create_producer(topic, max_pending=1, batching=False)


async def window_full(window: Window, producer: Producer | ScalableProducer) -> asyncio.Future[Any]:
    """A send outside any transaction takes the window's one slot, held at the broker."""
    outside = await producer.send_async(b"outside")
    await asyncio.wait_for(window.reached.wait(), 10)
    return outside


@pytest.mark.parametrize("protocol", ["v4", "v5"])
async def test_a_commit_waits_for_a_send_waiting_for_room_in_its_window(
    client: Client, window: Window, protocol: str
) -> None:
    """``send(txn=txn)`` then ``commit()``, the send waiting for room: the commit waits
    for it, and commits it. A v4 commit went ahead at once (the send was not counted
    until it had room): COMMITTED without the message the application sent in it, which
    then failed on its own."""
    producer = await producer_for(client, protocol, "commit")
    reader = await client.subscribe(str(producer.topic), "check", initial_position="earliest")
    txn = await client.transaction().start(protocol)
    outside = await window_full(window, producer)
    send = await running(producer.send(b"in", txn=txn))
    await asyncio.wait_for(window.full.wait(), 10)  # the send waits for room
    committing = await running(txn.commit())
    done, _ = await asyncio.wait({committing}, timeout=0.3)  # bounded absence check
    assert not done, f"commit() returned {committing.result()} before its send had room"
    window.go_on.set()  # the outside send is stored: the slot is the transaction's send's
    committed, sent = await committing, await send
    assert committed.error is None and sent.error is None, (committed, sent)
    await outside
    assert await txn.status() == "COMMITTED"
    values = {(await reader.receive(timeout_s=10)).value for _ in range(2)}
    assert values == {b"outside", b"in"}


@pytest.mark.parametrize("protocol", ["v4", "v5"])
async def test_a_commit_that_gives_up_on_a_send_waiting_for_room_does_not_commit(
    client: Client, window: Window, protocol: str
) -> None:
    """The commit's limit passes while its send still waits for room: it did not commit
    (Timeout, ABORTABLE), and the transaction, poisoned, aborts when committed again,
    whatever the send does next; nothing it sent is read."""
    producer = await producer_for(client, protocol, "late")
    reader = await client.subscribe(str(producer.topic), "check", initial_position="earliest")
    txn = await client.transaction().start(protocol)
    outside = await window_full(window, producer)
    send = await running(producer.send(b"in", txn=txn))
    await asyncio.wait_for(window.full.wait(), 10)
    with pytest.raises(Timeout, match="not committed") as late:
        await txn.commit(timeout_s=0.3)
    assert late.value.category is ErrorCategory.ABORTABLE
    assert txn.state == "OPEN"
    window.go_on.set()
    await send
    await outside
    with pytest.raises(TransactionFailed, match="aborted: an operation in it failed"):
        await txn.commit()
    assert await txn.status() == "ABORTED"
    assert (await reader.receive(timeout_s=10)).value == b"outside"
    await nothing_arrives(reader)


@pytest.mark.parametrize("protocol", ["v4", "v5"])
async def test_a_send_that_gets_room_after_its_transaction_was_aborted_is_not_sent(
    client: Client, window: Window, protocol: str
) -> None:
    """``abort()`` stops waiting for a send still waiting for room (after half its limit)
    and aborts; the send then gets room. It fails at once with TransactionEnded
    (ABORTABLE) and never reaches the broker. It went to the broker, which refused it
    (InvalidTxnStatus): a needless round trip, and an error that did not say the
    transaction had ended on this side."""
    producer = await producer_for(client, protocol, "aborted")
    txn = await client.transaction().start(protocol)
    outside = await window_full(window, producer)
    send = await running(producer.send(b"in", txn=txn))
    await asyncio.wait_for(window.full.wait(), 10)
    await txn.abort(timeout_s=0.6)  # waits 0.3 s for the send, then aborts without it
    assert txn.state == "ABORTED"
    window.go_on.set()  # the outside send is stored: its slot is the aborted send's
    await outside
    sent = await send
    assert isinstance(sent.error, TransactionEnded), sent
    assert sent.error.category is ErrorCategory.ABORTABLE
    assert window.published == [b"outside"]
    await asyncio.wait_for(producer.send(b"after"), 10)  # its slot was given back


@pytest.mark.parametrize("protocol", ["v4", "v5"])
async def test_a_send_queued_while_its_producer_reconnects_is_not_sent_after_an_abort(
    client: Client, window: Window, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """A send in a transaction is queued while its producer's connection is down (it
    reconnects: held here); ``abort()`` stops waiting for it (after half its limit) and
    aborts. Once the producer is connected again, the send fails with TransactionEnded
    and is not written: it was never sent, and the broker would only refuse it (it was
    written on the new connection and refused there)."""
    producer = await producer_for(client, protocol, "reconnecting")
    window.go_on.set()  # (the broker does not hold sends here)
    await producer.send(b"before")  # connected (a scalable producer: its segment's)
    segment = producer if isinstance(producer, Producer) else producer._producers[0]
    reconnecting, connected = asyncio.Event(), asyncio.Event()
    connect = Producer._connect

    async def held(self: Producer) -> Any:
        reconnecting.set()
        await connected.wait()
        return await connect(self)

    monkeypatch.setattr(Producer, "_connect", held)
    ws = segment._ws
    assert ws is not None
    await ws.close()  # the connection is lost: the producer reconnects (held)
    await asyncio.wait_for(reconnecting.wait(), 10)
    txn = await client.transaction().start(protocol)
    send = await producer.send_async(b"in", txn=txn)  # queued, not written
    await txn.abort(timeout_s=0.6)  # waits 0.3 s for the send, then aborts without it
    connected.set()
    with pytest.raises(TransactionEnded):
        await asyncio.wait_for(send, 10)
    assert window.published == [b"before"]
    await asyncio.wait_for(producer.send(b"after"), 10)
