"""A producer's sequence ids at their edges: a lower seq sent while a higher one of the same
producer is still being written. Each test failed before its fix (a review).

Real brokers on loopback (in-process aiohttp servers over file ledgers) and raw WebSocket
producers; a slow disk is :class:`tests.broker.test_publishing_edges.SlowDisk` (a file
entry log whose batch holding a marked payload waits in its writing thread for the test).
"""

from __future__ import annotations

import asyncio

import pytest

from segtxn.client import Client
from segtxn.ledger import LedgerError, ManagedLedger, Position
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import Error, Receipt, Send
from segtxn.protocol.names import TopicName
from tests.broker.conftest import StartBroker
from tests.broker.test_publishing_edges import (
    SLOW,
    TOPIC,
    SlowDisk,
    raw_producer,
    read_all,
    slow_disk,  # noqa: F401  (the fixture)
    stored_count,
)
from tests.waiting import wait_until
from tests.wsframes import next_frame

# ---------------------------------------------------------------------------------------
# 1. De-duplication compared a send's seq with the highest *stored* seq only. A lower seq
#    sent while a higher one of the same producer was still being written (a misbehaving
#    producer, or the resend of a send whose refusal was lost with its connection) was
#    taken in as new and stored after the higher one: an inversion, where docs/protocol.md
#    promises "a refused send leaves a gap, never an inversion" (and had the higher one
#    been stored already, the same send was a duplicate: the answer hung on timing).


async def test_a_lower_seq_sent_while_a_higher_one_is_written_is_not_stored_after_it(
    start_broker: StartBroker,
    slow_disk: SlowDisk,  # noqa: F811 (the fixture)
) -> None:
    broker = await start_broker()
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "skipper") as (ws, ready):
            assert ready.last_sequence_id == -1
            await ws.send_bytes(frames.encode(Send(seq=5, payload=b"five " + SLOW)))
            await slow_disk.wait_entered()  # 5 is being written
            topic = broker.service.topics[TopicName.parse(TOPIC)]
            assert 5 in topic.dedup.state("skipper").in_flight

            answered: dict[int | None, list[frames.Frame]] = {}

            async def collect(count: int) -> None:
                for _ in range(count):
                    frame = await next_frame(ws)
                    answered.setdefault(getattr(frame, "seq", None), []).append(frame)

            collecting = asyncio.ensure_future(collect(3))
            await ws.send_bytes(frames.encode(Send(seq=3, payload=b"three")))
            await ws.send_bytes(frames.encode(Send(seq=5, payload=b"five " + SLOW)))  # a resend
            state = topic.dedup.state("skipper")
            await wait_until(  # 3 answered, or taken in to be written after 5
                lambda: 3 in answered or 3 in state.in_flight, what="3 taken in or answered"
            )
            await wait_until(lambda: topic.counters.duplicates > 0, what="the resend taken in")
            slow_disk.release()
            await asyncio.wait_for(collecting, 10)

        values = await read_all(client, stored_count(broker))
        assert values == [b"five " + SLOW], f"stored, in order: {values}"
        (three,) = answered[3]
        assert isinstance(three, Error) and three.error == ErrorName.SERVICE_NOT_READY, three
        original, resent = answered[5]
        assert isinstance(original, Receipt) and not original.duplicate, original
        assert isinstance(resent, Receipt) and resent.duplicate, resent
        assert resent.message_id == original.message_id


class _Refused(LedgerError):
    retriable = True  # as too few replicas answering: the ledger goes on


async def test_a_lower_seq_after_a_failed_higher_one_is_stored(
    start_broker: StartBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a higher seq still being written (or stored) keeps a lower one out: once a
    higher one taken in has failed, nothing above the lower one is in the ledger, and it is
    stored in order (a fix refusing every seq below the highest ever taken in refused it)."""
    original = ManagedLedger.enqueue

    async def enqueue(ledger: ManagedLedger, payload: bytes) -> asyncio.Future[Position]:
        if b"<refused>" in payload:
            raise _Refused("injected: too few replicas answered")
        return await original(ledger, payload)

    monkeypatch.setattr(ManagedLedger, "enqueue", enqueue)
    broker = await start_broker()
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(TOPIC)
        async with raw_producer(broker, "skipper") as (ws, _):
            await ws.send_bytes(frames.encode(Send(seq=0, payload=b"zero")))
            assert isinstance(await next_frame(ws), Receipt)
            state = broker.service.topics[TopicName.parse(TOPIC)].dedup.state("skipper")
            await ws.send_bytes(frames.encode(Send(seq=5, payload=b"five <refused>")))
            failed = await next_frame(ws)
            assert isinstance(failed, Error) and failed.seq == 5, failed
            assert state.taken == 5 and not state.in_flight
            await ws.send_bytes(frames.encode(Send(seq=3, payload=b"three")))
            three = await next_frame(ws)
            assert isinstance(three, Receipt) and three.seq == 3 and not three.duplicate, three
        assert await read_all(client, stored_count(broker)) == [b"zero", b"three"]
