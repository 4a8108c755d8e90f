"""An acknowledgment in flight while its topic is unloaded (a review's suspicion): the
subscription's cursor is closed under it, and its ``LedgerClosed`` reached the consumer's
socket as ``UnknownError`` (a fatal error, with an incident logged at ERROR as a bug)
instead of the retriable ``ServiceNotReady`` that tells the caller to acknowledge again.
An unload hangs up on the topic's clients first, so the consumer sends the ack again on its
new link (to the topic loaded again), where it is applied; the first one's refusal must
still be retriable, not an incident.

Real components: a broker (aiohttp, file ledgers, the in-memory store) and the client; the
ack is paused on an event inside the broker while the topic is unloaded.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.dispatch import Subscription
from segtxn.client import Client
from segtxn.ledger import Position
from segtxn.protocol.errors import ErrorCategory, ErrorName, ServerError
from segtxn.protocol.names import TopicName
from tests.broker.test_subscriptions import assert_nothing_more
from tests.waiting import wait_until

TOPIC = "persistent://acme/acks/orders"


async def test_an_ack_in_flight_while_its_topic_unloads_is_retriable_not_unknown(
    broker: BrokerServer,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    await producer.send(b"m0")
    message = await consumer.receive(timeout_s=10)

    entered, resume = asyncio.Event(), asyncio.Event()
    ack = Subscription.ack

    refusals: list[BaseException] = []

    async def paused(
        self: Subscription, link: object, ids: list[Position], *, cumulative: bool
    ) -> None:
        entered.set()
        await resume.wait()
        try:
            await ack(self, link, ids, cumulative=cumulative)  # type: ignore[arg-type]
        except BaseException as e:
            refusals.append(e)
            raise

    monkeypatch.setattr(Subscription, "ack", paused)
    acking = asyncio.create_task(consumer.acknowledge(message, timeout_s=10))
    try:
        await asyncio.wait_for(entered.wait(), 10)
        await broker.service.unload(TopicName.parse(TOPIC))  # hung up on; its cursor closes
    finally:
        resume.set()
    with caplog.at_level(logging.ERROR):
        await acking  # sent again on the consumer's new link, to the topic loaded again
        await wait_until(lambda: bool(refusals), what="the first ack's refusal")
    (refused,) = refusals
    assert isinstance(refused, ServerError), refused
    assert refused.name is ErrorName.SERVICE_NOT_READY
    assert refused.category is ErrorCategory.RETRIABLE
    assert not [r for r in caplog.records if "incident" in r.getMessage()]
    await assert_nothing_more(consumer)  # the ack sent again was applied: no redelivery
    await producer.close()
    await consumer.close()
