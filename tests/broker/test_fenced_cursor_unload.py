"""A subscription's cursor save refused because another owner took the topic's ledger
unloads the topic, as an append refused by the same fence does; one refused for the store's
trouble does not.

A cursor's save is conditional on the ledger's metadata record at the version its owner
last wrote (segtxn/ledger/cursor.py): another owner's open moves it, and every save after
that is fenced. An append that met the fence stopped the ledger and unloaded the topic
(its clients hung up on: they look it up again and reach the owner), but a fenced cursor
save did nothing of the kind: the broker kept serving a topic it no longer owned, each
later save failed again, and its consumers' acks failed there for ever (as ``UnknownError``,
an incident logged as a bug) instead of being sent to the owner.

A save that cannot tell whose change it met (``OwnerUnknown``: the store failed the read
that would tell) proves no take-over: that topic stays, and a later save goes on.

Real components: a broker (aiohttp, file ledgers, the in-memory store with injected
faults) and the client; "another owner" changes the ledger's metadata record in the store
as an open by another broker would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from segtxn.broker import handoff
from segtxn.broker.app import BrokerServer
from segtxn.broker.dispatch import Subscription
from segtxn.broker.settings import BrokerSettings
from segtxn.broker.topic import Topic
from segtxn.client import Client, Consumer, Message
from segtxn.ledger import Position
from segtxn.ledger.cursor import ManagedCursor
from segtxn.ledger.fencing import OwnerChanged, OwnerUnknown
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.errors import ErrorCategory, ErrorName, ServerError
from segtxn.protocol.names import TopicName
from segtxn.web import Listener
from tests.broker.test_dedup_owner_unknown import owned_change_in_doubt
from tests.waiting import wait_until

TOPIC = "persistent://acme/acks/fenced"
NAME = TopicName.parse(TOPIC)


@pytest.fixture
async def memory_store() -> AsyncIterator[MetadataStore]:
    opened = open_store("memory://", wrap=FaultInjector)
    yield opened
    await opened.close()


@contextlib.asynccontextmanager
async def serving(
    store: MetadataStore, tmp_path: Path, broker_id: str = "b-fenced-cursor", **settings: Any
) -> AsyncIterator[tuple[BrokerServer, Client]]:
    """A broker on ``store`` (with ``settings`` beside the defaults) and a client of it."""
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    broker = BrokerServer(
        BrokerSettings(
            broker_id=broker_id,
            advertise_url=f"http://127.0.0.1:{listener.port}",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
            **settings,
        ),
        store=store,
        listener=listener,
    )
    await broker.start()
    try:
        async with Client(broker.settings.advertise_url) as client:
            yield broker, client
    finally:
        await broker.stop()


async def delivered(client: Client, n: int) -> tuple[Consumer, list[Message]]:
    """A consumer of ``TOPIC`` that received ``n`` messages, none acknowledged."""
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    for i in range(n):
        await producer.send(b"m%d" % i)
    await producer.close()
    return consumer, [await consumer.receive(timeout_s=10) for _ in range(n)]


async def take_over(store: MetadataStore) -> None:
    """Another owner's change of the topic's ledger's metadata record (an open of it by
    another broker moves it): every write conditional on it is fenced from now on."""
    key = metadata_key(TOPIC)
    record = await store.get(key)
    assert record is not None
    await store.put(key, record.value, expected_version=record.version)


def record_refusals(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """What the broker's subscriptions answered the acks they refused."""
    refusals: list[BaseException] = []
    ack = Subscription.ack

    async def recorded(
        self: Subscription, link: object, ids: list[Position], *, cumulative: bool
    ) -> None:
        try:
            await ack(self, link, ids, cumulative=cumulative)  # type: ignore[arg-type]
        except BaseException as e:
            refusals.append(e)
            raise

    monkeypatch.setattr(Subscription, "ack", recorded)
    return refusals


def record_let_go(monkeypatch: pytest.MonkeyPatch) -> list[Topic]:
    """The topic instances the broker let go of (hung up on their clients, closed)."""
    let_go: list[Topic] = []
    original = handoff.let_go

    async def recorded(topic: Topic) -> None:
        let_go.append(topic)
        await original(topic)

    monkeypatch.setattr(handoff, "let_go", recorded)
    return let_go


def record_fenced_saves(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each save's answer to "was the ledger's record moved by its own owner?"."""
    answers: list[bool] = []
    original = ManagedCursor._changed_by_its_owner

    async def recorded(self: ManagedCursor, owner_version: int) -> bool:
        answer = await original(self, owner_version)
        answers.append(answer)
        return answer

    monkeypatch.setattr(ManagedCursor, "_changed_by_its_owner", recorded)
    return answers


def assert_retriable(refusals: list[BaseException]) -> None:
    for refused in refusals:
        assert isinstance(refused, ServerError), repr(refused)
        assert refused.name is ErrorName.SERVICE_NOT_READY, refused
        assert refused.category is ErrorCategory.RETRIABLE, refused


async def test_an_ack_fenced_by_another_owner_unloads_the_topic_once_and_sends_its_consumer_on(
    memory_store: MetadataStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(memory_store, tmp_path) as (broker, client):
        consumer, messages = await delivered(client, 3)
        topic = broker.service.topics[NAME]
        (stream,) = consumer._streams.values()
        refusals = record_refusals(monkeypatch)
        let_go = record_let_go(monkeypatch)
        answers = record_fenced_saves(monkeypatch)
        await take_over(memory_store)
        with caplog.at_level(logging.WARNING):
            acked = await asyncio.gather(
                *(consumer.acknowledge(m, timeout_s=10) for m in messages),
                return_exceptions=True,
            )
            # the broker lets go of the topic it no longer owns, and hangs up on its
            # consumer, which looks it up again and attaches where it is served now
            await wait_until(
                lambda: broker.service.topics.get(NAME) is not topic,
                what="the fenced topic unloaded",
            )
            await wait_until(lambda: stream.reconnects >= 1, what="the consumer sent on")
            await wait_until(lambda: not broker.service.dropping, what="the unload done")
        # its close saved the cursor once more, and was fenced again (as every later
        # save of it is): the topic was still let go of once
        assert [t for t in let_go if t is topic] == [topic], let_go
        assert answers.count(False) >= 2, answers  # fenced more than once
        # the acks that met the fence were refused as retriable (acknowledge again), as
        # an append that met it is: the save's OwnerChanged, which the socket answers
        # ServiceNotReady (the rule of every edge: segtxn.failures.known); the client
        # sent them again, or raised that
        fenced = [r for r in refusals if isinstance(r, OwnerChanged)]
        assert fenced, refusals
        assert "another owner opened the ledger" in str(fenced[0]), fenced
        assert_retriable([r for r in refusals if not isinstance(r, OwnerChanged)])
        for outcome in acked:
            if outcome is not None:
                assert_retriable([outcome])
        said = [r.getMessage() for r in caplog.records]
        assert not [s for s in said if "incident" in s], said
        assert [s for s in said if TOPIC in s and "unloading it" in s], said
        # served again (here: its home did not move), the consumer acknowledges there
        for message in messages:
            await consumer.acknowledge(message, timeout_s=10)
        await consumer.close()


async def test_an_ack_whose_save_cannot_tell_the_owner_does_not_unload_the_topic(
    memory_store: MetadataStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger's own change of its record landed unseen, and the store fails the read
    that would tell it from another owner's: the save is refused (``OwnerUnknown``, the
    ack retriable), the topic stays loaded with its consumer attached, and the next save
    goes on once the store answers."""
    faults = memory_store.engine
    assert isinstance(faults, FaultInjector)
    async with serving(memory_store, tmp_path) as (broker, client):
        consumer, messages = await delivered(client, 2)
        topic = broker.service.topics[NAME]
        (stream,) = consumer._streams.values()
        refusals = record_refusals(monkeypatch)
        let_go = record_let_go(monkeypatch)
        try:
            await owned_change_in_doubt(topic.ledger, faults, reads=None)
            with pytest.raises(ServerError) as refused:
                await consumer.acknowledge(messages[0], timeout_s=10)
        finally:
            faults.clear()
        assert_retriable([refused.value])  # (the store's trouble, said at the edge)
        (cause,) = refusals
        assert isinstance(cause, OwnerUnknown), repr(cause)
        assert broker.service.topics.get(NAME) is topic
        assert not broker.service.dropping and not let_go, let_go
        assert stream.reconnects == 0
        for message in messages:  # the store answers again: the saves go on, here
            await consumer.acknowledge(message, timeout_s=10)
        assert broker.service.topics.get(NAME) is topic
        assert topic.ledger.cursors["s"].persisted_mark_delete == Position(
            messages[-1].message_id.ledger_id, messages[-1].message_id.entry_id
        )
        assert stream.reconnects == 0
        await consumer.close()


async def test_a_reset_fenced_by_another_owner_is_retriable_and_unloads_the_topic(
    memory_store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An admin's reset of a subscription whose save meets the fence: the topic is
    unloaded, and the reset is refused as retriable (``ServiceNotReady``: asked again, it
    reaches the topic where it is served now, here loaded again), not as a bug
    (``UnknownError``, an incident)."""
    async with serving(memory_store, tmp_path) as (broker, client):
        consumer, _ = await delivered(client, 2)
        await consumer.close()  # (a reset needs the subscription idle)
        topic = broker.service.topics[NAME]
        await take_over(memory_store)
        with caplog.at_level(logging.WARNING), pytest.raises(ServerError) as refused:
            await client.admin.reset_subscription(TOPIC, "s", "latest")
        assert_retriable([refused.value])
        assert broker.service.topics.get(NAME) is not topic
        await wait_until(lambda: not broker.service.dropping, what="the unload done")
        await client.admin.reset_subscription(TOPIC, "s", "latest")
        said = [r.getMessage() for r in caplog.records]
        assert not [s for s in said if "incident" in s], said
        again = await client.subscribe(TOPIC, "s")
        with pytest.raises(TimeoutError):  # reset to latest where it is served now
            await again.receive(timeout_s=0.3)  # bounded absence check
        await again.close()
