"""Plain sends that arrive together in a ``send_batch`` are published together (one task,
Publishing.publish_plain): each still gets its own answer, de-duplication and refusals work
per send, and the producer's order is the storage order, also when the batch is larger than
the window of sends in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.ledger import LedgerSettings
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import Error, ProducerReady, Receipt, Send, SendBatch
from segtxn.protocol.names import TopicName
from tests.broker.conftest import StartBroker
from tests.waiting import wait_until
from tests.wsframes import next_frame

TOPIC = "persistent://acme/together/events"
PATH = "persistent/acme/together/events"


@asynccontextmanager
async def raw_producer(
    broker: BrokerServer, name: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    url = f"{broker.settings.advertise_url}/ws/v2/producer/{PATH}?name={name}"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert isinstance(await next_frame(ws), ProducerReady)
        yield ws


async def answers(ws: aiohttp.ClientWebSocketResponse, count: int) -> dict[int, frames.Frame]:
    """The next ``count`` answers, by seq (each send is answered once)."""
    got: dict[int, frames.Frame] = {}
    for _ in range(count):
        frame = await next_frame(ws)
        assert isinstance(frame, Receipt | Error), frame
        assert frame.seq is not None and frame.seq not in got, frame
        got[frame.seq] = frame
    return got


def batch(*sends: Send) -> bytes:
    return frames.encode(SendBatch(sends=list(sends)))


async def stored_in_order(client: Client, count: int) -> list[bytes]:
    reader = await client.create_reader(TOPIC, start="earliest")
    values = [(await reader.receive(10)).value for _ in range(count)]
    await reader.close()
    return values


async def test_a_batch_larger_than_the_window_is_stored_in_send_order(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(max_pending_sends=7)
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "p") as ws:
            await ws.send_bytes(batch(*(Send(seq=i, payload=b"%d" % i) for i in range(100))))
            got = await answers(ws, 100)
        receipts = [got[i] for i in range(100)]
        assert all(isinstance(r, Receipt) and not r.duplicate for r in receipts)
        ids = [r.message_id for r in receipts if isinstance(r, Receipt)]
        assert ids == sorted(ids) and len(set(ids)) == 100
        assert await stored_in_order(client, 100) == [b"%d" % i for i in range(100)]


async def test_each_send_of_a_batch_is_answered_on_its_own(start_broker: StartBroker) -> None:
    broker = await start_broker()
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "p") as ws:
            await ws.send_bytes(batch(Send(seq=0, payload=b"a"), Send(seq=1, payload=b"b")))
            first = await answers(ws, 2)
            too_large = b"x" * (broker.settings.max_message_bytes + 1)
            await ws.send_bytes(
                batch(
                    Send(seq=1, payload=b"b"),  # stored before: the original's id
                    Send(seq=2, payload=too_large),  # refused alone
                    Send(seq=3, payload=b"c"),
                    Send(seq=3, payload=b"c"),  # the same send twice in one batch
                    Send(seq=4, payload=b"d"),
                )
            )
            replies = [await next_frame(ws) for _ in range(5)]  # receipts in any order
    by_seq: dict[int, list[frames.Frame]] = {}
    for reply in replies:
        assert isinstance(reply, Receipt | Error), reply
        assert reply.seq is not None, reply  # every send here is answered by its seq
        by_seq.setdefault(reply.seq, []).append(reply)
    assert sorted(by_seq) == [1, 2, 3, 4]
    (dup,), (refused,), copies, (last,) = by_seq[1], by_seq[2], by_seq[3], by_seq[4]
    assert isinstance(dup, Receipt) and dup.duplicate
    original = first[1]
    assert isinstance(original, Receipt)
    assert dup.message_id == original.message_id
    assert isinstance(refused, Error) and refused.error == ErrorName.MESSAGE_TOO_LARGE
    assert all(isinstance(c, Receipt) for c in copies) and len(copies) == 2
    receipts = [c for c in copies if isinstance(c, Receipt)]  # all of them
    assert sorted(c.duplicate for c in receipts) == [False, True]
    assert len({c.message_id for c in receipts}) == 1
    assert isinstance(last, Receipt) and not last.duplicate
    async with Client(broker.settings.advertise_url) as client:
        assert await stored_in_order(client, 4) == [b"a", b"b", b"c", b"d"]


async def test_a_batch_to_a_sealed_topic_is_refused_and_holds_nothing_up(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker()
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "p") as ws:
            await ws.send_bytes(batch(Send(seq=0, payload=b"a"), Send(seq=1, payload=b"b")))
            assert all(isinstance(a, Receipt) for a in (await answers(ws, 2)).values())
            topic = broker.service.topics[TopicName.parse(TOPIC)]
            await topic.ledger.terminate()
            await ws.send_bytes(batch(*(Send(seq=i, payload=b"z") for i in range(2, 6))))
            refused = await answers(ws, 4)
            assert {a.error for a in refused.values() if isinstance(a, Error)} == {
                ErrorName.TOPIC_TERMINATED
            }
            assert len(refused) == 4
            assert topic.dedup.state("p").order.idle  # every turn given back
            assert not topic.dedup.state("p").in_flight


async def test_a_publisher_cancelled_while_waiting_for_its_turn_leaves_no_send_in_flight(
    start_broker: StartBroker,
) -> None:
    """A send waiting for an earlier turn when its task is cancelled (a broker stopping)
    is given up: a resend of it is not left waiting on it, and is stored once."""
    broker = await start_broker()
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "p"):
            pass  # loads the topic
        topic = broker.service.topics[TopicName.parse(TOPIC)]
        earlier = topic.turn("p")  # an earlier send that has not queued yet
        waiting = [(Send(seq=i, payload=b"%d" % i), topic.turn("p")) for i in range(3)]
        task = asyncio.create_task(topic.publish_plain("p", waiting))
        state = topic.dedup.state("p")
        await wait_until(lambda: 0 in state.in_flight)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        assert not state.in_flight
        earlier.release()
        await wait_until(lambda: state.order.idle)  # every turn given back (passed on in turn)
        (outcome,) = await topic.publish_plain("p", [(Send(seq=0, payload=b"0"), topic.turn("p"))])
        assert isinstance(outcome, tuple) and not outcome[1]  # stored, once
        assert await stored_in_order(client, 1) == [b"0"]


async def test_a_send_queued_before_its_publisher_is_cancelled_is_recorded_once(
    start_broker: StartBroker,
) -> None:
    """Once queued, a plain send's de-duplication record follows its write, not the task
    that queued it: a resend after the publisher was cancelled is a duplicate."""
    broker = await start_broker()
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "p"):
            pass
        topic = broker.service.topics[TopicName.parse(TOPIC)]
        state = topic.dedup.state("p")
        sends = [(Send(seq=i, payload=b"%d" % i), topic.turn("p")) for i in range(50)]
        task = asyncio.create_task(topic.publish_plain("p", sends))
        await wait_until(lambda: state.order.idle)  # all 50 queued on the ledger
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await wait_until(lambda: not state.in_flight)  # the writes ended
        again = await topic.publish_plain(
            "p", [(Send(seq=i, payload=b"%d" % i), topic.turn("p")) for i in range(50)]
        )
        assert all(isinstance(o, tuple) and o[1] for o in again)  # every one a duplicate
        assert await stored_in_order(client, 50) == [b"%d" % i for i in range(50)]


async def test_a_batch_that_waits_for_room_in_the_ledger_is_stored_in_send_order(
    start_broker: StartBroker,
) -> None:
    """Sends of a batch are queued on the ledger at once while it has room, and wait for
    room (in turn) when it has none: the order holds across both."""
    broker = await start_broker(ledger=LedgerSettings(max_pending_bytes=2_000))
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "p") as ws:
            sends = [Send(seq=i, payload=b"%03d" % i + b"." * 300) for i in range(60)]
            await ws.send_bytes(batch(*sends[:30]))
            await ws.send_bytes(batch(*sends[30:]))
            got = await answers(ws, 60)
        receipts = [got[i] for i in range(60)]
        assert all(isinstance(r, Receipt) and not r.duplicate for r in receipts), receipts
        ids = [r.message_id for r in receipts if isinstance(r, Receipt)]
        assert ids == sorted(ids) and len(set(ids)) == 60
        assert await stored_in_order(client, 60) == [s.payload for s in sends]
