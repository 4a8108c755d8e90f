"""The broker-wide publish buffer (segtxn/broker/publish_budget.py): sends read from every
producer connection hold their payload's bytes until answered; past the limit the broker
stops reading producers' sockets, first come first served, and every send still goes
through, in send order, once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.publish_budget import PublishBudget
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.protocol import frames
from segtxn.protocol.frames import ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName
from tests.broker.conftest import StartBroker
from tests.ledger.held import hold_writes
from tests.metrics_scrape import check_conventions, scrape
from tests.waiting import wait_until
from tests.wsframes import next_frame

HELD = "persistent://acme/budget/held"
OTHER = "persistent://acme/budget/other"
MESSAGE = 1000
"""Payload bytes of every send here: the broker's largest message, too."""
LIMIT = 3 * MESSAGE
"""The publish buffer of the brokers here: three messages."""


@asynccontextmanager
async def raw_producer(
    broker: BrokerServer, topic: str, name: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    path = topic.replace("://", "/")
    url = f"{broker.settings.advertise_url}/ws/v2/producer/{path}?name={name}"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        yield ws


def send(seq: int) -> Send:
    return Send(seq=seq, payload=b"%04d" % seq + b"." * (MESSAGE - 4))


async def receipts(ws: aiohttp.ClientWebSocketResponse, count: int) -> list[Receipt]:
    """The next ``count`` answers, each a receipt of a send stored once, by seq."""
    got: dict[int, Receipt] = {}
    for _ in range(count):
        frame = await next_frame(ws)
        assert isinstance(frame, Receipt) and not frame.duplicate, frame
        assert frame.seq not in got, frame
        got[frame.seq] = frame
    return [got[seq] for seq in sorted(got)]


async def stored(client: Client, topic: str, count: int) -> list[bytes]:
    reader = await client.create_reader(topic, start="earliest")
    values = [(await reader.receive(10)).value for _ in range(count)]
    await reader.close()
    return values


async def buffer(broker: BrokerServer) -> tuple[float | None, float | None]:
    """The publish buffer's gauges: bytes held, connections waiting for room."""
    found = await scrape(broker.settings.advertise_url)
    return (
        found.value("segtxn_broker_publish_buffer_bytes"),
        found.value("segtxn_broker_publish_buffer_waiting_connections"),
    )


async def small_broker(start_broker: StartBroker) -> BrokerServer:
    broker = await start_broker(max_message_bytes=MESSAGE, max_publish_buffer_bytes=LIMIT)
    async with Client(broker.settings.advertise_url) as client:
        for topic in (HELD, OTHER):
            await client.admin.create_topic(topic)
    return broker


async def test_a_full_buffer_holds_another_topics_producer_until_room_comes_back(
    start_broker: StartBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "segtxn.broker.publish_budget")
    broker = await small_broker(start_broker)
    async with (
        raw_producer(broker, HELD, "a") as a,
        raw_producer(broker, OTHER, "b") as b,
        Client(broker.settings.advertise_url) as client,
    ):
        held = broker.service.topics[TopicName.parse(HELD)]
        other = broker.service.topics[TopicName.parse(OTHER)]
        gate = hold_writes(held.ledger)
        try:
            for seq in range(3):  # the whole buffer, in flight on a held ledger
                await a.send_bytes(frames.encode(send(seq)))
            for seq in range(3):
                await b.send_bytes(frames.encode(send(seq)))

            async def b_waits() -> bool:
                return await buffer(broker) == (LIMIT, 1)

            await wait_until(b_waits, what="b's connection waiting for room")
            # nothing of b's taken in (no turn, nothing stored): no receipt can have gone
            assert other.dedup.state("b").last_taken < 0
            assert other.counters.messages_in == 0
        finally:
            gate.set()
        assert [r.seq for r in await receipts(a, 3)] == [0, 1, 2]
        got = await receipts(b, 3)
        assert [r.seq for r in got] == [0, 1, 2]
        assert [r.message_id for r in got] == sorted(r.message_id for r in got)
        assert await stored(client, HELD, 3) == [send(i).payload for i in range(3)]
        assert await stored(client, OTHER, 3) == [send(i).payload for i in range(3)]
        found = await scrape(broker.settings.advertise_url)
        check_conventions(found)
        assert found.value("segtxn_broker_publish_buffer_bytes") == 0
        assert found.value("segtxn_broker_publish_buffer_limit_bytes") == LIMIT
        assert found.value("segtxn_broker_publish_buffer_waits_total") == 1
    (line,) = [r for r in caplog.records if r.name == "segtxn.broker.publish_budget"]
    assert line.levelno == logging.INFO
    assert line.getMessage().startswith(f"publish buffer full: {LIMIT} of {LIMIT} bytes")


async def test_a_batch_larger_than_the_buffer_goes_through_in_send_order(
    start_broker: StartBroker,
) -> None:
    """Its sends already taken in are started before it waits for room: they give it back."""
    broker = await small_broker(start_broker)
    async with raw_producer(broker, OTHER, "p") as ws:
        await ws.send_bytes(frames.encode(SendBatch(sends=[send(i) for i in range(10)])))
        got = await receipts(ws, 10)
    assert [r.seq for r in got] == list(range(10))
    assert [r.message_id for r in got] == sorted(r.message_id for r in got)
    async with Client(broker.settings.advertise_url) as client:
        assert await stored(client, OTHER, 10) == [send(i).payload for i in range(10)]
    assert await buffer(broker) == (0, 0)


async def test_a_producer_gone_with_sends_in_flight_and_waiting_gives_their_bytes_back(
    start_broker: StartBroker,
) -> None:
    """It hangs up while its connection waits for room: what it sent is stored (nothing is
    dropped at a hang-up) and every byte comes back."""
    broker = await start_broker(max_message_bytes=MESSAGE, max_publish_buffer_bytes=LIMIT)
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(HELD)
        async with raw_producer(broker, HELD, "a") as a:
            held = broker.service.topics[TopicName.parse(HELD)]
            gate = hold_writes(held.ledger)
            try:
                for seq in range(5):  # three in flight, one waiting for room, one unread
                    await a.send_bytes(frames.encode(send(seq)))

                async def a_waits() -> bool:
                    return await buffer(broker) == (LIMIT, 1)

                await wait_until(a_waits, what="a's connection waiting for room")
                # its close frame goes out; the broker reads it once it reads again
                closing = asyncio.create_task(a.close())
                await wait_until(lambda: a.closed, what="a's close sent")
                assert await buffer(broker) == (LIMIT, 1)
            finally:
                gate.set()
            await closing

        async def given_back() -> bool:
            return await buffer(broker) == (0, 0)

        await wait_until(given_back, what="the bytes of a's sends given back")
        assert await stored(client, HELD, 5) == [send(i).payload for i in range(5)]
        assert not held.dedup.state("a").busy


def test_a_buffer_smaller_than_the_largest_message_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="max_publish_buffer_bytes"):
        BrokerSettings(
            broker_id="b",
            advertise_url="http://127.0.0.1:1",
            max_message_bytes=MESSAGE,
            max_publish_buffer_bytes=MESSAGE - 1,
        )
    assert BrokerSettings("b", "http://h:1").max_publish_buffer_bytes == 256 * 1024 * 1024


async def test_the_buffer_is_first_come_first_served_and_a_cancelled_waiter_takes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "segtxn.broker.publish_budget")
    budget = PublishBudget(10)
    assert budget.try_take(8)
    big = asyncio.create_task(budget.take(5))  # waits for 5 of 10
    small = asyncio.create_task(budget.take(1))  # would fit, but comes after
    gone = asyncio.create_task(budget.take(4))
    await wait_until(lambda: budget.waiting == 3)
    assert not budget.try_take(1)  # no overtaking a waiter either
    assert len(caplog.records) == 1  # three waits, one line (at most one a minute)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert budget.waiting == 2 and budget.in_use == 8
    budget.give_back(3)  # room for the first, not for the one behind it
    await big
    assert not small.done() and budget.in_use == 10 and budget.waiting == 1
    budget.give_back(5)
    await small
    assert budget.in_use == 6 and budget.waiting == 0
    budget.give_back(6)
    assert budget.in_use == 0


async def test_a_waiter_cancelled_as_it_is_handed_room_gives_it_back() -> None:
    budget = PublishBudget(10)
    assert budget.try_take(10)
    first = asyncio.create_task(budget.take(10))
    second = asyncio.create_task(budget.take(10))
    await wait_until(lambda: budget.waiting == 2)
    budget.give_back(10)  # handed to the first, which is cancelled before it runs
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await second  # it had the room the first gave back
    assert budget.in_use == 10 and budget.waiting == 0
    with pytest.raises(ValueError, match="at most the limit"):
        await budget.take(11)
    assert budget.cost(50) == 10 and budget.cost(3) == 3
