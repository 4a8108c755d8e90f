"""Conformance: secondary indexes are maintained in the same atomic step as their records."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.metastore import Delete, InvalidArgument, InvalidKey, MetadataStore, Put
from tests.metastore.conftest import MakeStore


async def entries(store: MetadataStore, index: str, *args: object) -> list[tuple[object, str]]:
    listing = await store.index_range(index, *args)  # type: ignore[arg-type]
    return [(e.index_key, e.key) for e in listing.entries]


async def test_index_follows_its_record(store: MetadataStore) -> None:
    await store.put("/op/1", b"w1", indexes={"writes-by-segment": "seg-a"})
    await store.put("/op/2", b"w2", indexes={"writes-by-segment": "seg-b"})
    listing = await store.index_range("writes-by-segment", "seg-a")
    assert [(e.index_key, e.key, e.value) for e in listing.entries] == [
        (("seg-a",), "/op/1", b"w1")
    ]
    record = await store.get("/op/1")
    assert record is not None and record.indexes == {"writes-by-segment": ("seg-a",)}
    assert listing.entries[0].version == record.version

    await store.put("/op/1", b"moved", indexes={"writes-by-segment": "seg-b"})
    assert await entries(store, "writes-by-segment", "seg-a") == []
    assert await entries(store, "writes-by-segment", "seg-b") == [
        (("seg-b",), "/op/1"),
        (("seg-b",), "/op/2"),
    ]

    await store.put("/op/1", b"unindexed")  # naming no index removes its entries
    assert await entries(store, "writes-by-segment") == [(("seg-b",), "/op/2")]
    await store.delete("/op/2")
    assert await entries(store, "writes-by-segment") == []


async def test_index_pages_walk_a_range_a_page_at_a_time(store: MetadataStore) -> None:
    """Every entry once, in order, ties in one index key included, each page one request
    of at most ``page`` entries (a range may hold more than one answer can carry)."""
    rows = [("COMMITTED", 5)] * 4 + [("COMMITTED", 7)] * 3 + [("OPEN", 1)]
    for i, key in enumerate(rows):
        await store.put(f"/txn/{i:02d}", b"h", indexes={"txn-by-final-state": key})
    whole = await store.index_range("txn-by-final-state", ("COMMITTED",))
    pages = [
        [(e.index_key, e.key) for e in page]
        async for page in store.index_pages("txn-by-final-state", ("COMMITTED",), page=3)
    ]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [x for p in pages for x in p] == [(e.index_key, e.key) for e in whole.entries]
    with pytest.raises(InvalidArgument):
        async for _ in store.index_pages("txn-by-final-state", page=0):
            pass


async def test_composite_keys_sort_like_tuples(store: MetadataStore) -> None:
    rows = [("ABORTED", 30), ("COMMITTED", 5), ("COMMITTED", 100), ("COMMITTED", 20), ("OPEN", 1)]
    for i, key in enumerate(rows):
        await store.put(f"/txn/{i}", b"h", indexes={"txn-by-final-state": key})
    everything = await store.index_range("txn-by-final-state")
    assert [e.index_key for e in everything.entries] == sorted(rows)
    committed = await store.index_range("txn-by-final-state", ("COMMITTED",))
    assert [e.index_key for e in committed.entries] == [
        ("COMMITTED", 5),
        ("COMMITTED", 20),
        ("COMMITTED", 100),
    ]
    # "finalized at or before 20": a half-open range of composite keys
    old = await store.index_range("txn-by-final-state", ("COMMITTED", 0), ("COMMITTED", 21))
    assert [e.index_key for e in old.entries] == [("COMMITTED", 5), ("COMMITTED", 20)]
    limited = await store.index_range("txn-by-final-state", limit=2)
    assert len(limited.entries) == 2 and limited.more


async def test_prefix_match_is_by_component(store: MetadataStore) -> None:
    await store.put("/a", b"", indexes={"acks": ("seg1", "sub")})
    await store.put("/b", b"", indexes={"acks": ("seg10", "sub")})
    await store.put("/c", b"", indexes={"acks": ("seg1",)})
    assert sorted(k for _, k in await entries(store, "acks", ("seg1",))) == ["/a", "/c"]
    assert await entries(store, "acks", ("seg1", "sub")) == [(("seg1", "sub"), "/a")]


async def test_numeric_index_range(store: MetadataStore) -> None:
    for deadline in [500, 1500, 999, 10**12]:
        await store.put(f"/h/{deadline}", b"", indexes={"txn-by-deadline": deadline})
    due = await store.index_range("txn-by-deadline", 0, 1000)
    assert [e.index_key for e in due.entries] == [(500,), (999,)]


async def test_entries_go_with_commit_and_delete_range(store: MetadataStore) -> None:
    await store.commit(
        [Put(f"/r/{i}", b"x", indexes={"by-i": i, "by-parity": i % 2}) for i in range(30)]
    )
    assert len((await store.index_range("by-i")).entries) == 30
    await store.commit([Delete("/r/0"), Put("/r/1", b"y", indexes={"by-i": 1})])
    assert len((await store.index_range("by-i")).entries) == 29
    assert len((await store.index_range("by-parity")).entries) == 28
    # 29 records with up to 2 entries each need more than one transaction: chunked deletes
    assert await store.delete_range("/r/") == 29
    assert (await store.index_range("by-i")).entries == []
    assert (await store.index_range("by-parity")).entries == []


async def test_large_delete_range_removes_every_entry(store: MetadataStore) -> None:
    for start in range(0, 300, 100):
        await store.commit(
            [Put(f"/big/{i:04d}", b"", indexes={"n": i}) for i in range(start, start + 60)]
        )
    assert await store.delete_range("/big/") == 180
    assert (await store.index_range("n")).entries == []


async def test_index_never_out_of_step_with_its_record(make_store: MakeStore) -> None:
    """A reader never sees a record's old and new entry together, or neither."""
    writer, reader = make_store(), make_store()
    await writer.put("/moving", b"0", indexes={"by-n": 0})
    stop = asyncio.Event()
    observations = 0

    async def write() -> None:
        for n in range(1, 150):
            await writer.put("/moving", str(n).encode(), indexes={"by-n": n})
        stop.set()

    async def read() -> None:
        nonlocal observations
        while not stop.is_set():
            listing = await reader.index_range("by-n")
            assert len(listing.entries) == 1, listing.entries
            entry = listing.entries[0]
            assert entry.value == str(entry.index_key[0]).encode()
            observations += 1

    await asyncio.gather(write(), read())
    assert observations > 0


async def test_racing_unconditional_writers_leave_one_entry(make_store: MakeStore) -> None:
    """Writers with stale knowledge of the record still remove the entries they replace."""
    clients = [make_store() for _ in range(4)]
    await clients[0].put("/hot", b"a", indexes={"by-v": "a"})
    await clients[1].get("/hot")  # client 1 now caches index "a"
    await clients[2].put("/hot", b"b", indexes={"by-v": "b"})  # behind client 1's back
    await clients[1].put("/hot", b"c", indexes={"by-v": "c"})
    assert await entries(clients[3], "by-v") == [(("c",), "/hot")]

    await asyncio.gather(
        *(
            clients[i % 4].put("/hot", f"v{i}".encode(), indexes={"by-v": f"v{i}"})
            for i in range(32)
        )
    )
    final = await clients[3].get("/hot")
    assert final is not None
    assert await entries(clients[3], "by-v") == [((final.value.decode(),), "/hot")]


@pytest.mark.parametrize(
    ("name", "key"),
    [("Bad/Name", "x"), ("ok", -1), ("ok", "nul\x00"), ("ok", 1.5), ("", "x"), ("ok", True)],
)
async def test_bad_index_names_and_keys(store: MetadataStore, name: str, key: object) -> None:
    with pytest.raises(InvalidKey):
        await store.put("/x", b"", indexes={name: key})  # type: ignore[dict-item]
    assert await store.get("/x") is None
