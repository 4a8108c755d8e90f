"""Sends whose broker is gone fail once the producer has not been able to reach any broker
for the client's ``request_timeout_s``, not at their send timeout: a real ``segtxn
standalone`` process, paused so that a send is written and left unanswered, then killed.

A send written may have been stored (OUTCOME_UNKNOWN, and its error says that sending it
again may store it twice); one never written was not (RETRIABLE: sending it again is safe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from segtxn.client import Client, ClientError, ErrorCategory
from segtxn.client.producer import Producer
from tests.processes import ServerProcess
from tests.waiting import client_error_of, wait_until

pytestmark = pytest.mark.timeout(120)
TOPIC = "persistent://acme/sends/broker-gone"
SEND_TIMEOUT_S = 60.0
"""Far longer than the test may take: a send that waits for it fails the test."""
REQUEST_TIMEOUT_S = 1.0
"""How long the producer waits for a broker to come back before it fails its sends."""
PROMPTLY_S = 10.0


async def _producer(client: Client) -> Producer:
    await client.admin.create_topic(TOPIC)
    producer = await client.create_producer(TOPIC, send_timeout_s=SEND_TIMEOUT_S)
    assert isinstance(producer, Producer)
    await producer.send(b"before")
    return producer


def _failure(send: Awaitable[object]) -> Awaitable[ClientError]:
    """The error ``send`` fails with, which it must do within PROMPTLY_S."""
    return client_error_of(send, within_s=PROMPTLY_S, what="the send, on a broker that is gone,")


async def test_a_send_written_to_a_broker_that_dies_fails_outcome_unknown(
    server: ServerProcess,
) -> None:
    """Before, it waited out its 60 s send timeout while the producer retried."""
    async with Client(server.url, request_timeout_s=REQUEST_TIMEOUT_S) as client:
        producer = await _producer(client)
        server.pause()  # the send is written and never answered
        sending = asyncio.ensure_future(producer.send(b"unanswered"))
        await wait_until(
            lambda: producer.pending == 1 and producer._in_flight.unsent == 0,
            what="the send written",
        )
        server.kill()
        error = await _failure(sending)
        assert type(error).__name__ == "ConnectionLost", repr(error)
        assert error.category is ErrorCategory.OUTCOME_UNKNOWN, repr(error)
        assert "may or may not have been stored" in str(error), str(error)
        assert "may store it twice" in str(error), str(error)
        assert "connection refused" in str(error), str(error)
        assert producer.pending == 0


async def test_a_send_made_while_no_broker_can_be_reached_fails_retriable(
    server: ServerProcess,
) -> None:
    """A send made once the broker is gone is never written: it fails RETRIABLE, saying
    that sending it again is safe."""
    async with Client(server.url, request_timeout_s=REQUEST_TIMEOUT_S) as client:
        producer = await _producer(client)
        server.kill()
        await wait_until(lambda: not producer._connected.is_set(), what="the connection lost")
        error = await _failure(asyncio.ensure_future(producer.send(b"never written")))
        assert type(error).__name__ == "ConnectionLost", repr(error)
        assert error.category is ErrorCategory.RETRIABLE, repr(error)
        assert "was not sent" in str(error) and "sending it again is safe" in str(error)
