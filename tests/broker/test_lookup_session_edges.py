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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from segtxn.broker import lookup
from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.metastore import (
    MetadataStore,
    MetadataStoreError,
    StoreAccessDenied,
    StoreUnavailable,
    open_store,
)
from segtxn.metastore.etcd_server import free_port
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import topic_key

TOPIC = "topic://acme/lookup/events"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


@pytest.fixture
async def client(store: MetadataStore, tmp_path: Path) -> AsyncIterator[Client]:
    port = free_port()
    settings = BrokerSettings(
        broker_id="b1",
        advertise_url=f"http://127.0.0.1:{port}",
        ledger_url=f"file://{tmp_path / 'ledgers'}",
    )
    broker = BrokerServer(settings, "127.0.0.1", port, store=store)
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
