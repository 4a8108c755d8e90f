"""A consumer's redelivery requests (``nack`` with a request id, ``redeliver``): while one
is unanswered the stream drops what arrives (it was sent before the rewind asked for), so
every outcome of a request must end that state: its ``rewind``, a refusal, a lost
connection, and a caller that gives up before the request was written
(segtxn/client/stream.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from segtxn.broker.dispatch import Subscription
from segtxn.client import Client, Message, MessageId
from segtxn.client.consumer import Consumer
from segtxn.client.errors import Timeout
from segtxn.client.stream import MessageStream
from segtxn.metastore import StoreUnavailable
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster

TOPIC = "topic://acme/requests/in"
SEGMENT = TopicName.parse("segment://acme/requests/in/0")
SUB = "requests"


async def setup(client: Client, n: int, **options: Any) -> tuple[Consumer, list[Message]]:
    """A segment holding m0..m(n-1), an ordered consumer of it, and its first message."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(n):
        await producer.send(f"m{i}".encode())
    await producer.close()
    consumer = await client.subscribe(TOPIC, SUB, initial_position="earliest", **options)
    return consumer, [await consumer.receive(timeout_s=10)]


def stream_of(consumer: Consumer) -> MessageStream:
    return consumer._streams[str(SEGMENT)]


def subscription(cluster: Cluster) -> Subscription:
    return cluster.broker.service.topics[SEGMENT].subscriptions[SUB]


async def values(consumer: Consumer, n: int) -> list[str]:
    """The next ``n`` messages' values (each within a bounded wait)."""
    return [(await consumer.receive(timeout_s=10)).value.decode() for _ in range(n)]


@contextmanager
def refusing_once(monkeypatch: pytest.MonkeyPatch, target: object, name: str) -> Iterator[None]:
    """The broker's ``target.name(...)`` fails once as if the store were away (answered
    with an Error frame naming the request: ServiceNotReady), then works again."""
    original = getattr(target, name)
    calls = 0

    def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise StoreUnavailable("etcd is away (injected)")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)
    yield
    assert calls >= 1, f"{name} was never called"


async def test_a_refused_nack_does_not_leave_the_stream_dropping_everything(
    client: Client, cluster: Cluster
) -> None:
    """A nack of an id the segment never held is refused (InvalidArgument, naming the
    request). The stream had dropped its queue for the rewind it asked for; it must neither
    go on dropping every message that comes (no rewind ever answers) nor lose the ones it
    dropped: it attaches again, which starts from a rewind, so m0.. come back in order."""
    consumer, (m0,) = await setup(client, 4)
    forged = MessageId(m0.message_id.topic, m0.message_id.ledger_id, 10**9)
    await consumer.negative_acknowledge(forged)
    assert await values(consumer, 4) == ["m0", "m1", "m2", "m3"]
    assert not stream_of(consumer)._awaiting
    assert stream_of(consumer).reconnects == 1


async def test_a_failed_redeliver_does_not_leave_the_stream_dropping_everything(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker fails to take a Redeliver (the store is away): its Error frame ends
    the wait for the rewind, and the stream attaches again to get one."""
    consumer, _ = await setup(client, 4)
    with refusing_once(monkeypatch, subscription(cluster), "redeliver"):
        await consumer.redeliver_unacknowledged()
        assert await values(consumer, 4) == ["m0", "m1", "m2", "m3"]
    assert not stream_of(consumer)._awaiting


async def test_a_nack_whose_caller_gave_up_before_it_was_written_is_still_sent(
    client: Client, cluster: Cluster
) -> None:
    """The caller's limit passes while the nack waits to be written (another write holds
    the socket). The stream had already dropped its queue and started waiting for the
    rewind: the request is sent anyway (the stream owns it), so the rewind comes and
    the messages with it, in order."""
    consumer, (m0,) = await setup(client, 4)
    stream = stream_of(consumer)
    async with stream._writing:  # a write in progress: the nack cannot be written yet
        with pytest.raises(Timeout):
            await consumer.negative_acknowledge(m0, timeout_s=0.2)
    assert await values(consumer, 4) == ["m0", "m1", "m2", "m3"]
    assert not stream._awaiting
