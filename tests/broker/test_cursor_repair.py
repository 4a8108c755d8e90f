"""Repairing a subscription whose cursor record does not read, through the admin API and
the CLI (``POST .../subscription/{sub}/repair``, ``segtxn topics repair-cursor``).

A damaged cursor record made the broker refuse the topic on every load (PersistenceError
naming the record), and only a hand edit of the store (etcdctl) brought it back. The repair
rewrites the record without loading the topic: the topic then loads, and the subscription
is delivered every retained message again (none lost). It refuses a record that reads, a
subscription or topic that does not exist, and a record rewritten while it ran.

A real broker (in-process aiohttp) on the memory store and on etcd, through a fault
injector.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.cli.commands import main
from segtxn.client import Client, MessageId
from segtxn.ledger.cursor import cursor_key
from segtxn.metastore import MetadataStore
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.errors import (
    InvalidArgument,
    NotAllowed,
    PersistenceError,
    PreconditionFailed,
    ServerError,
    SubscriptionNotFound,
    TopicNotFound,
)
from segtxn.protocol.names import TopicName
from segtxn.web import Listener

TOPIC = "persistent://acme/repair/events"
NAME = TopicName.parse(TOPIC)
KEY = cursor_key(TOPIC, "sub")
GARBAGE = b"\xff{damaged"
COUNT = 6


@pytest.fixture
async def broker(store: MetadataStore, tmp_path: Path) -> AsyncIterator[BrokerServer]:
    listener = Listener("127.0.0.1")
    server = BrokerServer(
        BrokerSettings(
            broker_id="b-repair",
            advertise_url=f"http://127.0.0.1:{listener.port}",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
        ),
        store=store,
        listener=listener,
    )
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(broker: BrokerServer) -> AsyncIterator[Client]:
    async with Client(broker.settings.advertise_url) as c:
        yield c


async def _consumed_then_damaged(
    broker: BrokerServer, client: Client, store: MetadataStore, *, unload: bool = True
) -> list[MessageId]:
    """``COUNT`` messages on TOPIC, the first half acknowledged by ``sub``, then its cursor
    record damaged (the topic unloaded first unless ``unload`` is false: its next load
    meets the damage). Returns the messages' ids."""
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    sent = [await producer.send(b"m%d" % i) for i in range(COUNT)]
    await producer.close()
    for _ in range(COUNT // 2):
        await consumer.acknowledge(await consumer.receive(timeout_s=10))
    await consumer.close()
    if unload:
        await broker.service.unload(NAME)
    await store.put(KEY, GARBAGE)
    return sent


async def _refused(broker: BrokerServer) -> dict[str, str]:
    """What the broker's ``/readyz`` says it refuses (topic -> why)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{broker.settings.advertise_url}/readyz") as response,
    ):
        body: dict[str, dict[str, str]] = await response.json()
        return body.get("refused", {})


async def _received(client: Client, n: int) -> list[bytes]:
    consumer = await client.subscribe(TOPIC, "sub")
    try:
        return [(await consumer.receive(timeout_s=10)).value for _ in range(n)]
    finally:
        await consumer.close()


async def test_a_damaged_cursor_is_repaired_and_every_retained_message_comes_again(
    broker: BrokerServer, client: Client, store: MetadataStore
) -> None:
    await _consumed_then_damaged(broker, client, store)
    with pytest.raises(PersistenceError, match=KEY) as refused:
        await client.subscribe(TOPIC, "sub")
    assert "segtxn topics repair-cursor TOPIC SUBSCRIPTION" in str(refused.value)
    assert TOPIC in await _refused(broker)  # /readyz names what it refuses, and why

    repaired = await client.admin.repair_cursor(TOPIC, "sub")
    assert TOPIC not in await _refused(broker)  # repaired: no longer known damaged

    assert repaired["key"] == KEY and repaired["subscription"] == "sub"
    assert repaired["replaced"]["bytes"] == len(GARBAGE)
    assert repaired["replaced"]["reason"].startswith("JSON is malformed")
    assert await _received(client, COUNT) == [b"m%d" % i for i in range(COUNT)]
    with pytest.raises(NotAllowed, match="reads correctly now: nothing to repair"):
        await client.admin.repair_cursor(TOPIC, "sub")


async def test_a_repair_whose_answer_was_lost_is_told_it_may_be_done_by_the_next_one(
    broker: BrokerServer, client: Client, store: MetadataStore, faults: FaultInjector
) -> None:
    """The repair's write lands and the store's answer is lost on the way back: the caller
    cannot tell whether it was done. The next repair is refused, NotAllowed as for any
    record that reads (a caller catches the class), and its message says the record may
    already have been repaired, and to reset the subscription if its position is wrong;
    the subscription is delivered every retained message, as repaired."""
    await _consumed_then_damaged(broker, client, store)
    faults.fail("txn", key_prefix=KEY, after_apply=True)
    with pytest.raises(ServerError) as lost:
        await client.admin.repair_cursor(TOPIC, "sub")
    assert not isinstance(lost.value, NotAllowed), "the first repair saw its own write"
    record = await store.get(KEY)
    assert record is not None and record.value != GARBAGE, "the write did not land"

    with pytest.raises(NotAllowed) as again:
        await client.admin.repair_cursor(TOPIC, "sub")

    assert "may already have been repaired" in str(again.value)
    assert "reset the subscription" in str(again.value)
    assert await _received(client, COUNT) == [b"m%d" % i for i in range(COUNT)]


async def test_a_topic_loaded_before_its_record_was_damaged_is_unloaded_and_repaired(
    broker: BrokerServer, client: Client, store: MetadataStore
) -> None:
    await _consumed_then_damaged(broker, client, store, unload=False)
    assert NAME in broker.service.topics

    await client.admin.repair_cursor(TOPIC, "sub")

    assert await _received(client, COUNT) == [b"m%d" % i for i in range(COUNT)]


async def test_an_undamaged_cursor_an_unknown_subscription_and_topic_are_refused(
    broker: BrokerServer, client: Client, store: MetadataStore
) -> None:
    await client.admin.create_topic(TOPIC)
    await client.admin.create_subscription(TOPIC, "sub", initial_position="earliest")
    before = await store.get(KEY)

    with pytest.raises(NotAllowed, match="reset the subscription"):
        await client.admin.repair_cursor(TOPIC, "sub")
    with pytest.raises(SubscriptionNotFound, match="no subscription 'other'"):
        await client.admin.repair_cursor(TOPIC, "other")
    unknown = "persistent://acme/repair/unknown"
    with pytest.raises(TopicNotFound):
        await client.admin.repair_cursor(unknown, "sub")
    with pytest.raises(NotAllowed, match="segment"):
        await client.admin.repair_cursor("topic://acme/repair/scalable", "sub")

    assert await store.get(KEY) == before, "an undamaged record was rewritten"
    assert unknown not in await client.admin.list_topics("persistent", "acme", "repair")


async def test_a_record_rewritten_while_the_repair_runs_is_not_overwritten(
    broker: BrokerServer, client: Client, store: MetadataStore, faults: FaultInjector
) -> None:
    """The repair's read of the damaged record is held; the record is written again
    meanwhile: the repair answers PreconditionFailed, and the record keeps that write."""
    await _consumed_then_damaged(broker, client, store)
    held = faults.hold("range", key_prefix=KEY)
    repairing = asyncio.create_task(client.admin.repair_cursor(TOPIC, "sub"))
    await held.wait_for(1)
    await store.put(KEY, b"written meanwhile")
    held.release()

    with pytest.raises(PreconditionFailed, match="changed while it was being repaired"):
        await repairing
    record = await store.get(KEY)
    assert record is not None and record.value == b"written meanwhile"


async def test_the_cli_repairs_a_damaged_cursor_and_refuses_an_undamaged_one(
    broker: BrokerServer, client: Client, store: MetadataStore
) -> None:
    await _consumed_then_damaged(broker, client, store)
    url = broker.settings.advertise_url
    command = ["topics", "repair-cursor", TOPIC, "sub", "--url", url]

    done = await asyncio.to_thread(CliRunner().invoke, main, command)

    assert done.exit_code == 0, done.output
    assert f"repaired sub on {TOPIC}: it starts again at " in done.stdout
    assert KEY in done.stdout
    again = await asyncio.to_thread(CliRunner().invoke, main, command)
    assert again.exit_code == 1, again.output
    assert "Error: " in again.stderr and "nothing to repair" in again.stderr, again.stderr
    assert await _received(client, COUNT) == [b"m%d" % i for i in range(COUNT)]


async def test_a_given_position_is_where_the_subscription_starts_again(
    broker: BrokerServer, client: Client, store: MetadataStore
) -> None:
    sent = await _consumed_then_damaged(broker, client, store)
    with pytest.raises(PersistenceError, match=KEY):
        await client.admin.stats(TOPIC)
    with pytest.raises(InvalidArgument, match="beyond the end"):
        await client.admin.repair_cursor(TOPIC, "sub", to=f"{sent[-1].ledger_id + 9}:0")
    with pytest.raises(InvalidArgument, match="LEDGER:ENTRY"):
        await client.admin.repair_cursor(TOPIC, "sub", to="latest")
    record = await store.get(KEY)
    assert record is not None and record.value == GARBAGE, "a refused repair wrote"

    start = sent[4]
    repaired = await client.admin.repair_cursor(
        TOPIC, "sub", to=f"{start.ledger_id}:{start.entry_id}"
    )

    assert repaired["start"] == f"{start.ledger_id}:{start.entry_id}"
    assert await _received(client, 2) == [b"m4", b"m5"]


async def test_a_load_between_the_unload_and_the_repairs_write_is_refused_not_raced(
    broker: BrokerServer, client: Client, store: MetadataStore, faults: FaultInjector
) -> None:
    """The topic was loaded before its record was damaged: the repair unloads it, and a
    lookup loads it again before the repair's write lands. That load meets the damaged
    record and is refused (it writes no cursor record, so the repair's compare-and-set
    still holds); once the write lands the topic loads, every retained message again."""
    await _consumed_then_damaged(broker, client, store, unload=False)
    held = faults.hold("txn", key_prefix=KEY, before=True)
    repairing = asyncio.create_task(client.admin.repair_cursor(TOPIC, "sub"))
    await held.wait_for(1)
    assert NAME not in broker.service.topics, "the repair writes before it unloaded"

    with pytest.raises(PersistenceError, match=KEY):
        await client.subscribe(TOPIC, "sub")
    assert NAME not in broker.service.topics
    held.release()

    repaired = await repairing
    assert repaired["start"].endswith(":0")
    assert await _received(client, COUNT) == [b"m%d" % i for i in range(COUNT)]
