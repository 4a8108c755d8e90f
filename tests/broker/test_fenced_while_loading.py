"""A fence proven while a topic was loading (its ledger's writer halted before the broker
listened for it) unloads the topic once it is loaded, as one proven later does.

The broker listened for its ledger's write failures only once ``Topic.load`` and the
checks after it returned; a halt before that (a pending-ack records' background cursor
save, a save meeting ``CursorOverwritten``) was told to no one, and the topic was served
with a stopped writer: its sends and acks were refused as ServiceNotReady for ever.

Real components: a broker (aiohttp, file ledgers, the in-memory store) and the client; the
halt is what ``changed_by_its_owner`` calls when a save proves another owner.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from segtxn.broker.topic import Topic
from segtxn.ledger.fencing import OwnerChanged
from segtxn.metastore import MetadataStore
from tests.broker.test_fenced_cursor_unload import (
    NAME,
    TOPIC,
    memory_store,  # noqa: F401 (a fixture)
    record_let_go,
    serving,
)
from tests.waiting import wait_until


async def test_a_fence_proven_while_loading_unloads_the_topic_and_a_later_send_reloads_it(
    memory_store: MetadataStore,  # noqa: F811 (the fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: list[Topic] = []
    load = Topic.load.__func__  # type: ignore[attr-defined]

    async def fenced_while_loading(cls: type[Topic], *args: Any, **kwargs: Any) -> Topic:
        topic: Topic = await load(cls, *args, **kwargs)
        loaded.append(topic)
        if len(loaded) == 1:  # (a fresh load is not)
            topic.ledger.fenced(OwnerChanged("proved while loading (a background save)"))
        return topic

    monkeypatch.setattr(Topic, "load", classmethod(fenced_while_loading))
    let_go = record_let_go(monkeypatch)
    async with serving(memory_store, tmp_path) as (broker, client):
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC, name="p")
        await wait_until(lambda: bool(loaded), what="the topic loaded")
        first = loaded[0]
        await wait_until(
            lambda: broker.service.topics.get(NAME) is not first and not broker.service.dropping,
            what="the topic fenced while loading unloaded",
        )
        assert let_go == [first]
        async with asyncio.timeout(10):
            await producer.send(b"after")  # reaches a fresh load
        assert len(loaded) == 2
        assert broker.service.topics[NAME] is loaded[1]
        await producer.close()
