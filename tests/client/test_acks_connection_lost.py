"""An acknowledgment whose broker is gone fails as soon as the stream finds it cannot reach
the broker again, not at its timeout: a real ``segtxn standalone`` process, paused so that
an acknowledgment is written and left unanswered, then killed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from segtxn.client import Client, ClientError, ErrorCategory, Message
from segtxn.client.consumer import Consumer
from tests.processes import ServerProcess
from tests.waiting import client_error_of, wait_until

TOPIC = "persistent://acme/acks/broker-gone"
SUB = "sub"
ACK_TIMEOUT_S = 60.0
"""Far longer than the test may take: an ack that waits for it fails the test."""
PROMPTLY_S = 10.0
GRACE_S = 2.0
"""The client's request_timeout_s here: how long the stream waits for a broker to come back
before it fails what it has in flight."""


async def _consumer_with_messages(client: Client, n: int) -> tuple[Consumer, list[Message]]:
    await client.admin.create_topic(TOPIC)
    await client.admin.create_subscription(TOPIC, SUB, initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    for i in range(n):
        await producer.send(b"m%d" % i)
    consumer = await client.subscribe(TOPIC, SUB)
    assert isinstance(consumer, Consumer)
    return consumer, [await consumer.receive(timeout_s=10) for _ in range(n)]


def _failure(ack: Awaitable[object]) -> Awaitable[ClientError]:
    """The error ``ack`` fails with, which it must do within PROMPTLY_S."""
    return client_error_of(
        ack, within_s=PROMPTLY_S, what="the acknowledgment, on a broker that is gone,"
    )


async def test_an_ack_written_to_a_broker_that_dies_fails_at_once_outcome_unknown(
    server: ServerProcess,
) -> None:
    """The ack was written (the broker may have applied it before it died): it fails with
    ConnectionLost, OUTCOME_UNKNOWN, once the stream finds the broker cannot be reached,
    not after its 60 s. Before, it waited out its timeout while the stream retried."""
    async with Client(server.url, request_timeout_s=GRACE_S) as client:
        consumer, got = await _consumer_with_messages(client, 1)
        stream = consumer._streams[TOPIC]
        server.pause()  # the ack is written and never answered
        ack = asyncio.ensure_future(consumer.acknowledge(got[0], timeout_s=ACK_TIMEOUT_S))
        await wait_until(
            lambda: bool(stream._acks._in_flight) and not stream._writing.locked(),
            what="the ack written",
        )
        server.kill()
        error = await _failure(ack)
        assert type(error).__name__ == "ConnectionLost", repr(error)
        assert error.category is ErrorCategory.OUTCOME_UNKNOWN, repr(error)
        assert "may or may not have been applied" in str(error), str(error)
        assert "connection refused" in str(error), str(error)
        assert stream._acks.pending() == []


async def test_an_ack_made_while_the_broker_cannot_be_reached_fails_retriable(
    server: ServerProcess,
) -> None:
    """An ack made once the broker is gone is never written: it fails RETRIABLE (nothing
    happened) at the stream's next attempt to attach again, not after its 60 s."""
    async with Client(server.url, request_timeout_s=GRACE_S) as client:
        consumer, got = await _consumer_with_messages(client, 1)
        server.kill()
        await wait_until(lambda: bool(consumer.reconnecting()), what="the connection lost")
        ack = asyncio.ensure_future(consumer.acknowledge(got[0], timeout_s=ACK_TIMEOUT_S))
        error = await _failure(ack)
        assert type(error).__name__ == "ConnectionLost", repr(error)
        assert error.category is ErrorCategory.RETRIABLE, repr(error)
        assert error.retriable
        assert "not sent" in str(error), str(error)
