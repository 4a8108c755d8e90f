"""Conformance: watches deliver every change once, in order, across reconnects."""

from __future__ import annotations

import asyncio
import logging

import pytest

from segtxn.metastore import (
    Compacted,
    Delete,
    EventKind,
    MetadataStore,
    Put,
)
from segtxn.metastore.faults import FaultInjector
from tests.metastore.conftest import MakeStore
from tests.waiting import take, wait_until


async def test_watch_key_sees_puts_and_deletes_in_order(store: MetadataStore) -> None:
    async with store.watch("/w") as events:
        a = await store.put("/w", b"1")
        await store.put("/other", b"ignored")
        b = await store.put("/w", b"2")
        await store.delete("/w")
        got = await take(events, 3)
    assert [(e.kind, e.record.value if e.record else None) for e in got] == [
        (EventKind.PUT, b"1"),
        (EventKind.PUT, b"2"),
        (EventKind.DELETE, None),
    ]
    assert [e.revision for e in got[:2]] == [a.version, b.version]
    assert got[2].revision > b.version


async def test_watch_prefix_and_range_bounds(store: MetadataStore) -> None:
    async with store.watch_prefix("/p/") as prefix, store.watch_range("/r/b", "/r/d") as ranged:
        for key in ["/p/1", "/p", "/q/1", "/p/2", "/r/a", "/r/b", "/r/c", "/r/d"]:
            await store.put(key, b"x")
        assert [e.key for e in await take(prefix, 2)] == ["/p/1", "/p/2"]
        assert [e.key for e in await take(ranged, 2)] == ["/r/b", "/r/c"]


async def test_watch_from_revision_replays_history(store: MetadataStore) -> None:
    first = await store.put("/h/1", b"a")
    await store.put("/h/2", b"b")
    await store.delete("/h/1")
    async with store.watch_prefix("/h/", from_revision=first.version) as events:
        got = await take(events, 3)
        await store.put("/h/3", b"c")
        (live,) = await take(events, 1)
    assert [(e.kind, e.key) for e in got] == [
        (EventKind.PUT, "/h/1"),
        (EventKind.PUT, "/h/2"),
        (EventKind.DELETE, "/h/1"),
    ]
    assert live.key == "/h/3"


async def test_list_then_watch_misses_nothing(store: MetadataStore) -> None:
    await store.put("/lw/1", b"a")
    listing = await store.list_prefix("/lw/")
    await store.put("/lw/2", b"b")  # between the listing and the watch
    async with store.watch_prefix("/lw/", from_revision=listing.revision + 1) as events:
        (event,) = await take(events, 1)
    assert event.key == "/lw/2"


async def test_one_atomic_step_shares_one_revision(store: MetadataStore) -> None:
    await store.put("/s/old", b"x")
    async with store.watch_prefix("/s/") as events:
        await store.commit([Put("/s/a", b"1"), Put("/s/b", b"2"), Delete("/s/old")])
        got = await take(events, 3)
    assert len({e.revision for e in got}) == 1
    assert [e.key for e in got] == ["/s/a", "/s/b", "/s/old"]


async def test_watch_index(store: MetadataStore) -> None:
    async with store.watch_index("writes-by-segment", "seg-1") as events:
        await store.put("/op/1", b"a", indexes={"writes-by-segment": "seg-1"})
        await store.put("/op/2", b"b", indexes={"writes-by-segment": "seg-2"})
        await store.put("/op/1", b"c", indexes={"writes-by-segment": "seg-2"})
        got = await take(events, 2)
    assert [(e.kind, e.index_key, e.key) for e in got] == [
        (EventKind.PUT, ("seg-1",), "/op/1"),
        (EventKind.DELETE, ("seg-1",), "/op/1"),
    ]
    assert got[0].entry is not None and got[0].entry.value == b"a"


async def test_watch_survives_dropped_connections(
    make_store: MakeStore,
) -> None:
    """Forced reconnects in the middle of a stream: nothing missed, nothing twice."""
    watcher, writer = make_store(), make_store()
    injector = watcher.engine
    assert isinstance(injector, FaultInjector)
    received: list[str] = []
    async with watcher.watch_prefix("/drop/") as events:

        async def consume() -> None:
            async for event in events:
                received.append(event.key)
                if len(received) == 200:
                    return

        consumer = asyncio.create_task(consume())
        drops = 0
        for i in range(200):
            await writer.put(f"/drop/{i:03d}", b"x")
            if i % 20 == 10:
                drops += injector.drop_watches()
                # the next writes land while the watch is down; wait for it to come back
                await wait_until(lambda: injector.open_watches == 1, what="watch resumed")
        await asyncio.wait_for(consumer, 20)
    assert drops == 10
    assert received == [f"/drop/{i:03d}" for i in range(200)]


async def test_an_outage_is_logged_once_and_its_end_too(
    make_store: MakeStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A watch whose store stays away for several attempts says so once (WARNING), the
    attempts at DEBUG, and once more when events flow again (INFO): a ten-second etcd
    outage printed a WARNING per attempt of every watch, and nothing when it ended."""
    watcher, writer = make_store(), make_store()
    injector = watcher.engine
    assert isinstance(injector, FaultInjector)
    caplog.set_level(logging.DEBUG, logger="segtxn.metastore.watch")
    async with watcher.watch_prefix("/out/") as events:
        await writer.put("/out/0", b"x")
        assert [e.key for e in await take(events, 1)] == ["/out/0"]
        injector.fail("watch", times=5)  # the next five reopenings fail
        injector.drop_watches()
        await writer.put("/out/1", b"x")
        assert [e.key for e in await take(events, 1)] == ["/out/1"]
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name.endswith(".watch")]
    warnings = [m for level, m in said if level == logging.WARNING]
    debug = [m for level, m in said if level == logging.DEBUG and "still broken" in m]
    resumed = [m for level, m in said if level == logging.INFO]
    assert len(warnings) == 1 and "broke" in warnings[0], said
    assert len(debug) == 5, said  # each failed reopening, quietly
    assert len(resumed) == 1 and "resumed" in resumed[0], said


async def test_compacted_history_is_reported(store: MetadataStore) -> None:
    first = await store.put("/c/1", b"a")
    for i in range(5):
        await store.put("/c/1", str(i).encode())
    await store.compact(await store.revision())
    with pytest.raises(Compacted) as compacted:
        async with store.watch("/c/1", from_revision=first.version) as events:
            await take(events, 1)
    assert compacted.value.compacted_revision > first.version


async def test_watch_reports_values_and_indexes(store: MetadataStore) -> None:
    async with store.watch("/v") as events:
        await store.put("/v", b"payload", indexes={"i": ("a", 1)})
        (event,) = await take(events, 1)
    assert event.record is not None
    assert event.record.value == b"payload" and event.record.indexes == {"i": ("a", 1)}
