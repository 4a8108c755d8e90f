"""A lookup session (``/ws/v2/lookup/topic/...``) lives through store errors.

After a compaction cut its watch off, the session reads the topic again and watches anew;
a store error in that read, or in the watch's opening, ended the session (the boundary then
closed it with 1013): every client following the topic reconnected at once, and, the store
being away, found none of the brokers able to answer its handshake. The session now tries
again, with a pause, while the store fails, and pushes what changed meanwhile once it
answers. A real broker on the memory store, wrapped in the fault injector."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from segtxn.broker import lookup
from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client, PersistenceError
from segtxn.client.layout import TopicLayout
from segtxn.client.timeouts import Deadline
from segtxn.metastore import (
    MetadataStore,
    MetadataStoreError,
    StoreAccessDenied,
    StoreUnavailable,
    open_store,
)
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import topic_key
from segtxn.web import Listener
from tests.waiting import wait_until

TOPIC = "topic://acme/lookup/events"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


@pytest.fixture
async def client(store: MetadataStore, tmp_path: Path) -> AsyncIterator[Client]:
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    settings = BrokerSettings(
        broker_id="b1",
        advertise_url=f"http://127.0.0.1:{listener.port}",
        ledger_url=f"file://{tmp_path / 'ledgers'}",
    )
    broker = BrokerServer(settings, store=store, listener=listener)
    await broker.start()
    try:
        async with Client(settings.advertise_url) as c:
            yield c
    finally:
        await broker.stop()


def faults_of(store: MetadataStore) -> FaultInjector:
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    return engine


async def active_segments(ws: aiohttp.ClientWebSocketResponse, count: int) -> dict[str, Any]:
    """The first DAG pushed with ``count`` active segments; every frame until then is one."""
    while True:
        pushed = await ws.receive(timeout=10)
        assert pushed.type is aiohttp.WSMsgType.TEXT, pushed  # not a close: it lives on
        dag: dict[str, Any] = json.loads(pushed.data)
        if sum(s["state"] == "ACTIVE" for s in dag["segments"]) == count:
            return dag


@pytest.mark.parametrize("error", [StoreUnavailable, StoreAccessDenied])
async def test_a_store_error_in_the_read_after_a_compaction_does_not_end_the_session(
    client: Client,
    store: MetadataStore,
    error: type[MetadataStoreError],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session's watch is cut off while the topic is split and the history compacted;
    its read of the topic after that fails once: it reads again and pushes the split."""
    await client.admin.create_topic(TOPIC, segments=1)
    topic = TopicName.parse(TOPIC)
    ws = await client.connector.websocket(client.connector.service_url, "lookup", topic, "", {})
    async with ws:
        await active_segments(ws, 1)
        failed = asyncio.Event()
        read = lookup._read

        async def fails_once(store: MetadataStore, key: str) -> Any:
            if not failed.is_set():
                failed.set()
                raise error("injected")
            return await read(store, key)

        monkeypatch.setattr(lookup, "_read", fails_once)
        faults = faults_of(store)
        faults.fail("watch", key_prefix=topic_key(topic), times=None)
        assert faults.drop_watches() >= 1  # the session's, and the broker's own
        await client.admin.split(TOPIC, 0)
        await store.compact(await store.revision())
        faults.clear()
        await active_segments(ws, 2)
        assert failed.is_set()


# ---------------------------------------------------------------------------------------
# A topic's record that does not decode (written by hand, by another version, damaged):
# the session ended with 1011 and an incident id (a traceback logged each time), and the
# client reconnected to meet it again, in a loop. It is stored data that is damaged, not a
# bug: the session says so by name in an error frame, keeps the session (and the client its
# last DAG), pushes the DAG again once the record reads, and the broker logs it at ERROR
# once, naming the key, without a traceback.

DAMAGED = b'{"type": "scalable", "epoch": "not a number"}'


LAYOUT_LOG = "segtxn.client.layout"


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_damaged_topic_record_is_named_to_the_session_which_goes_on(
    client: Client, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    topic = TopicName.parse(TOPIC)
    key = topic_key(topic)
    good = await store.get(key)
    assert good is not None
    ws = await client.connector.websocket(client.connector.service_url, "lookup", topic, "", {})
    async with ws:
        await active_segments(ws, 1)
        with caplog.at_level(logging.DEBUG):
            await store.put(key, DAMAGED)
            said = await ws.receive(timeout=10)
            assert said.type is aiohttp.WSMsgType.TEXT, said  # not a close: it lives on
            error = json.loads(said.data)
            assert error["error"] == "PersistenceError", error
            assert key in error["message"] and "incident" not in error["message"], error

            # a second session meets it too (and a one-shot lookup): the same name, no new ERROR
            again = await client.connector.websocket(
                client.connector.service_url, "lookup", topic, "", {}
            )
            async with again:
                assert json.loads((await again.receive(timeout=10)).data)["error"] == (
                    "PersistenceError"
                )
            with pytest.raises(PersistenceError) as caught:
                await client.connector.lookup(topic)
            assert key in str(caught.value) and "incident" not in str(caught.value)

            await store.put(key, good.value)  # repaired: the session pushes the DAG again
            assert (await active_segments(ws, 1))["topic"] == TOPIC
        errors = _errors(caplog)
        assert [key in r.getMessage() for r in errors] == [True], [r.getMessage() for r in errors]
        assert all(r.exc_info is None for r in caplog.records), "a traceback was logged"


async def test_a_client_following_a_topic_whose_record_is_damaged_keeps_its_layout(
    client: Client, store: MetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The client's layout keeps the DAG it holds through the error frame, on the same
    session (its follower neither dies nor reconnects), and takes the repaired record's."""
    await client.admin.create_topic(TOPIC, segments=1)
    topic = TopicName.parse(TOPIC)
    key = topic_key(topic)
    good = await store.get(key)
    assert good is not None
    layout = TopicLayout(client.connector, topic)
    await layout.start(Deadline(10))
    try:
        epoch, segments = layout.epoch, dict(layout.segments)
        with caplog.at_level(logging.DEBUG):
            await store.put(key, DAMAGED)
            await wait_until(
                lambda: any(key in r.getMessage() for r in caplog.records if r.name == LAYOUT_LOG),
                what="the client told of the damaged record",
            )
            assert layout.epoch == epoch and layout.segments == segments
            await store.put(key, good.value)
            await client.admin.split(TOPIC, 0)
            await wait_until(lambda: layout.epoch > epoch, what="the split's DAG followed")
        assert layout._task is not None and not layout._task.done()
        reconnects = [r for r in caplog.records if "reconnecting" in r.getMessage()]
        assert not reconnects, [r.getMessage() for r in reconnects]
    finally:
        await layout.close()
