"""A topic's close (segtxn/broker/topic.py) lets go of its ledger whatever a part before it
raised: a subscription whose pending-ack log failed to close (its clean-close write fenced,
seen in CI under load at a broker's stop) had left the ledger open, its writer task running,
and the topic could not be loaded again in the process ("... is held by another writer")."""

from __future__ import annotations

from typing import NoReturn

import pytest

from segtxn.broker.dispatch import Subscription
from segtxn.client import Client
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster

TOPIC = "persistent://acme/close/edges"


async def test_a_subscription_failing_to_close_still_lets_the_ledger_go(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = cluster.broker.service
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        await producer.send(b"m0")
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        await consumer.close()
        topic = service.topics[TopicName.parse(TOPIC)]

        real_close = Subscription.close

        async def fenced(self: Subscription) -> NoReturn:
            await real_close(self)  # its dispatcher stopped; then its pending-ack log fails
            raise RuntimeError("injected: its pending-ack log's close was fenced")

        monkeypatch.setattr(Subscription, "close", fenced)
        with pytest.raises(RuntimeError, match="injected"):
            await topic.close()
        monkeypatch.undo()
        assert topic.ledger.is_closing, "the ledger was left open"
        service.topics.pop(TopicName.parse(TOPIC))
        reader = await client.subscribe(TOPIC, "t", initial_position="earliest")
        assert (await reader.receive(timeout_s=10)).value == b"m0"  # loaded again
