"""Conformance: many point watches on one multiplexed stream (``watch_many``), each
delivering every change of its key once, in order, across dropped streams, with a
compaction ending only the watch it hits."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from segtxn.metastore import EventKind, InvalidArgument, MetadataStore, WatchEvent
from segtxn.metastore.faults import FaultInjector
from segtxn.metastore.points import PointWatches
from tests.metastore.conftest import MakeStore
from tests.waiting import wait_until


class Heard:
    """What a PointWatches told its owner."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, bytes | None]] = []
        self.compacted: list[str] = []
        self.kinds: list[EventKind] = []

    def event(self, event: WatchEvent) -> None:
        self.kinds.append(event.kind)
        value = event.record.value if event.record is not None else None
        self.events.append((event.key, event.revision, value))

    def keys(self) -> list[str]:
        return [key for key, _, _ in self.events]


@pytest.fixture
async def heard() -> Heard:
    return Heard()


@pytest.fixture
async def points(make_store: MakeStore, heard: Heard) -> AsyncIterator[PointWatches]:
    watcher = make_store()
    watches = watcher.point_watches(heard.event, heard.compacted.append)
    await watches.start()
    try:
        yield watches
    finally:
        await watches.close()


def injector(points: PointWatches) -> FaultInjector:
    engine = points._engine
    assert isinstance(engine, FaultInjector)
    return engine


async def test_many_keys_on_one_stream(
    store: MetadataStore, points: PointWatches, heard: Heard
) -> None:
    start = await store.revision() + 1
    for key in ("/p/a", "/p/b", "/p/c"):
        points.add(key, start)
    assert len(points) == 3
    await store.put("/p/a", b"1")
    await store.put("/p/zzz", b"not watched")
    await store.put("/p/c", b"2")
    await store.delete("/p/a")
    await store.put("/p/b", b"3")
    await wait_until(lambda: len(heard.events) == 4, what="four events")
    # Each watch in revision order; watches that catch up from history interleave freely.
    in_order = sorted(heard.events, key=lambda e: e[1])
    assert [(key, value) for key, _, value in in_order] == [
        ("/p/a", b"1"),
        ("/p/c", b"2"),
        ("/p/a", None),
        ("/p/b", b"3"),
    ]
    assert [value for key, _, value in heard.events if key == "/p/a"] == [b"1", None]
    assert injector(points).open_watches == 1  # one stream carries all three


async def test_a_watch_from_a_read_misses_nothing(
    store: MetadataStore, points: PointWatches, heard: Heard
) -> None:
    await store.put("/p/k", b"old")
    record, revision = await store.get_at("/p/k")
    assert record is not None and record.value == b"old"
    await store.put("/p/k", b"after the read")  # before the watch exists
    points.add("/p/k", revision + 1)
    await wait_until(lambda: len(heard.events) == 1, what="the change after the read")
    assert heard.events[0][2] == b"after the read"
    points.add("/p/k", 1)  # already watched: kept as it is (no replay from 1)
    await store.put("/p/k", b"next")
    await wait_until(lambda: len(heard.events) == 2, what="the next change")
    assert [value for _, _, value in heard.events] == [b"after the read", b"next"]


async def test_cancel_stops_one_watch(
    store: MetadataStore, points: PointWatches, heard: Heard
) -> None:
    start = await store.revision() + 1
    points.add("/p/x", start)
    points.add("/p/y", start)
    await store.put("/p/x", b"1")
    await wait_until(lambda: len(heard.events) == 1, what="x's first change")
    points.cancel("/p/x")
    points.cancel("/p/never-watched")  # left alone
    assert len(points) == 1
    await store.put("/p/x", b"2")
    await store.put("/p/y", b"3")
    await wait_until(lambda: len(heard.events) == 2, what="y's change")
    assert heard.keys() == ["/p/x", "/p/y"]  # never x's second change


async def test_dropped_streams_resume_every_watch(
    store: MetadataStore, points: PointWatches, heard: Heard
) -> None:
    faults = injector(points)
    start = await store.revision() + 1
    keys = [f"/p/d{i}" for i in range(5)]
    for key in keys:
        points.add(key, start)
    drops = 0
    for i in range(100):
        await store.put(keys[i % 5], str(i).encode())
        if i % 20 == 10:
            drops += faults.drop_watches()
            await wait_until(lambda: faults.open_watches == 1, what="the stream back")
    await wait_until(lambda: len(heard.events) == 100, what="every change", timeout=20)
    assert drops == 5
    for n, key in enumerate(keys):  # each key's changes once, in order
        assert [v for k, _, v in heard.events if k == key] == [
            str(i).encode() for i in range(n, 100, 5)
        ]


async def test_a_failed_create_breaks_the_stream_and_it_resumes(
    store: MetadataStore, points: PointWatches, heard: Heard
) -> None:
    faults = injector(points)
    start = await store.revision() + 1
    points.add("/p/first", start)
    await store.put("/p/first", b"1")
    await wait_until(lambda: len(heard.events) == 1, what="the first change")
    injected = faults.injected
    faults.fail("watch", key_prefix="/p/second")  # once
    points.add("/p/second", start)
    await store.put("/p/second", b"2")
    await store.put("/p/first", b"3")
    await wait_until(lambda: len(heard.events) == 3, what="both changes")
    assert faults.injected > injected
    assert sorted(heard.keys()) == ["/p/first", "/p/first", "/p/second"]


async def test_compaction_ends_only_the_watch_it_hits(
    store: MetadataStore, points: PointWatches, heard: Heard
) -> None:
    first = await store.put("/p/old", b"0")
    for i in range(3):
        await store.put("/p/old", str(i).encode())
    await store.compact(await store.revision())
    points.add("/p/old", first.version)  # history that is gone
    points.add("/p/live", await store.revision() + 1)
    await wait_until(lambda: heard.compacted == ["/p/old"], what="the compaction")
    assert len(points) == 1
    await store.put("/p/live", b"on")
    await wait_until(lambda: heard.keys() == ["/p/live"], what="the other watch goes on")


async def test_bad_start_revision_is_refused(points: PointWatches) -> None:
    with pytest.raises(InvalidArgument):
        points.add("/p/k", 0)


async def test_deletes_are_events(store: MetadataStore, points: PointWatches, heard: Heard) -> None:
    await store.put("/p/del", b"x")
    points.add("/p/del", await store.revision() + 1)
    await store.delete("/p/del")
    await wait_until(lambda: len(heard.events) == 1, what="the delete")
    assert heard.kinds == [EventKind.DELETE]


async def test_hundreds_of_watches_share_one_stream(
    store: MetadataStore, points: PointWatches, heard: Heard
) -> None:
    start = await store.revision() + 1
    keys = [f"/p/many/{i:03d}" for i in range(300)]
    for key in keys:
        points.add(key, start)
    for key in keys[::2]:
        await store.put(key, b"x")
    for key in keys[1::2]:  # cancelled before anything happened to them
        points.cancel(key)
    for key in keys:
        await store.put(key, b"y")
    await wait_until(lambda: len(heard.events) == 300, what="every watched change")
    assert sorted(heard.keys()) == sorted(keys[::2] * 2)
    assert len(points) == 150 and injector(points).open_watches == 1
