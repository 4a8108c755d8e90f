"""Conformance: versioned records, compare-and-set, atomic steps, listing, and bad input."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.metastore import (
    MUST_NOT_EXIST,
    AlreadyExists,
    BadVersion,
    Check,
    Delete,
    InvalidArgument,
    InvalidKey,
    MetadataStore,
    NotFound,
    Put,
    TooLarge,
    TooManyOperations,
)
from tests.metastore.conftest import MakeStore


async def test_put_get_versions(store: MetadataStore) -> None:
    assert await store.get("/a") is None
    first = await store.put("/a", b"1")
    assert (first.key, first.value) == ("/a", b"1")
    assert first.version == first.created_version > 0
    second = await store.put("/a", b"2")
    assert second.version > first.version
    assert second.created_version == first.created_version
    got = await store.get("/a")
    assert got is not None and (got.value, got.version) == (b"2", second.version)


async def test_cas_errors_name_the_failure(store: MetadataStore) -> None:
    created = await store.put("/k", b"v", expected_version=MUST_NOT_EXIST)
    with pytest.raises(AlreadyExists) as exists:
        await store.put("/k", b"again", expected_version=MUST_NOT_EXIST)
    assert exists.value.actual == created.version
    with pytest.raises(BadVersion) as bad:
        await store.put("/k", b"x", expected_version=created.version + 1000)
    assert (bad.value.expected, bad.value.actual) == (created.version + 1000, created.version)
    with pytest.raises(NotFound):
        await store.put("/missing", b"x", expected_version=5)
    with pytest.raises(NotFound):
        await store.delete("/missing")
    with pytest.raises(BadVersion):
        await store.delete("/k", expected_version=created.version + 1000)
    updated = await store.put("/k", b"w", expected_version=created.version)
    await store.delete("/k", expected_version=updated.version)
    assert await store.get("/k") is None


async def test_versions_are_never_reused(store: MetadataStore) -> None:
    """ABA: a record deleted and created again does not match the old version."""
    old = await store.put("/aba", b"1")
    await store.delete("/aba")
    new = await store.put("/aba", b"2")
    assert new.version != old.version
    with pytest.raises(BadVersion):
        await store.put("/aba", b"3", expected_version=old.version)


@pytest.mark.parametrize("writers", [64])
async def test_cas_race_has_exactly_one_winner(make_store: MakeStore, writers: int) -> None:
    clients = [make_store() for _ in range(4)]
    base = await clients[0].put("/race", b"start")

    async def attempt(i: int) -> bool:
        try:
            await clients[i % 4].put("/race", f"w{i}".encode(), expected_version=base.version)
            return True
        except BadVersion:
            return False

    wins = await asyncio.gather(*(attempt(i) for i in range(writers)))
    assert sum(wins) == 1
    winner = wins.index(True)
    final = await clients[1].get("/race")
    assert final is not None and final.value == f"w{winner}".encode()

    async def create(i: int) -> bool:
        try:
            await clients[i % 4].put("/created", b"x", expected_version=MUST_NOT_EXIST)
            return True
        except AlreadyExists:
            return False

    assert sum(await asyncio.gather(*(create(i) for i in range(writers)))) == 1


async def test_cas_increments_are_linearizable(make_store: MakeStore) -> None:
    clients = [make_store() for _ in range(4)]
    await clients[0].put("/counter", b"0")

    async def increment(store: MetadataStore, times: int) -> None:
        for _ in range(times):
            while True:
                current = await store.get("/counter")
                assert current is not None
                try:
                    await store.put(
                        "/counter",
                        str(int(current.value) + 1).encode(),
                        expected_version=current.version,
                    )
                    break
                except BadVersion:
                    continue

    await asyncio.gather(*(increment(clients[i % 4], 10) for i in range(16)))
    final = await clients[2].get("/counter")
    assert final is not None and final.value == b"160"


async def test_commit_is_all_or_nothing(store: MetadataStore) -> None:
    header = await store.put("/txn/1", b"OPEN")
    await store.put("/other", b"x")
    with pytest.raises(BadVersion) as failed:
        await store.commit(
            [
                Put("/txn-op/1/", b"op", sequential=True),
                Put("/new", b"n"),
                Delete("/other"),
                Check("/txn/1", header.version + 1),
            ]
        )
    assert failed.value.key == "/txn/1"
    assert (await store.list_prefix("/txn-op/")).records == []
    assert await store.get("/new") is None and await store.get("/other") is not None

    results = await store.commit(
        [
            Put("/txn-op/1/", b"op", sequential=True),
            Delete("/other"),
            Check("/txn/1", header.version),
        ]
    )
    assert results[1] is None and results[2] is None
    op = results[0]
    assert op is not None and op.key == "/txn-op/1/" + "1".zfill(20)
    assert await store.get("/other") is None
    changed = await store.get("/txn/1")
    assert changed is not None and changed.version == header.version  # a Check writes nothing


async def test_check_for_absence(store: MetadataStore) -> None:
    await store.commit([Check("/lock", MUST_NOT_EXIST), Put("/a", b"1")])
    await store.put("/lock", b"held")
    with pytest.raises(AlreadyExists):
        await store.commit([Check("/lock", MUST_NOT_EXIST), Put("/b", b"1")])
    assert await store.get("/b") is None


async def test_list_prefix_range_limit_and_pagination(store: MetadataStore) -> None:
    keys = [f"/list/{i:03d}" for i in range(25)] + ["/lis", "/list0", "/listx/1"]
    for key in keys:
        await store.put(key, key.encode())
    listing = await store.list_prefix("/list/")
    assert [r.key for r in listing.records] == sorted(k for k in keys if k.startswith("/list/"))
    assert not listing.more and listing.revision >= max(r.version for r in listing.records)

    collected, after = [], "/list/"
    while True:
        page = await store.list_range(after, "/list0", limit=10)
        collected += [r.key for r in page.records]
        if not page.more:
            break
        after = page.records[-1].key + "\x01"
    assert collected == [f"/list/{i:03d}" for i in range(25)]

    window = await store.list_range("/list/005", "/list/010")
    assert [r.key for r in window.records] == [f"/list/{i:03d}" for i in range(5, 10)]


async def test_delete_range(store: MetadataStore) -> None:
    for i in range(10):
        await store.put(f"/dr/{i}", b"x")
    await store.put("/dr0", b"outside")
    assert await store.delete_range("/dr/") == 10
    assert (await store.list_prefix("/dr/")).records == []
    assert await store.get("/dr0") is not None
    assert await store.delete_range("/dr/") == 0


@pytest.mark.parametrize(
    "bad_key",
    ["", "no-slash", "/nul\x00byte", "/" + "x" * 2000],
)
async def test_bad_keys_are_refused_clearly(store: MetadataStore, bad_key: str) -> None:
    with pytest.raises(InvalidKey):
        await store.put(bad_key, b"x")
    with pytest.raises(InvalidKey):
        await store.get(bad_key)
    await store.put("/still-works", b"x")


async def test_wrong_types_are_refused(store: MetadataStore) -> None:
    with pytest.raises(InvalidKey):
        await store.get(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await store.put("/k", "not bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await store.put("/k", b"x", expected_version=-1)
    with pytest.raises(InvalidArgument):
        await store.commit([Put("/k", b"1"), Delete("/k")])
    with pytest.raises(InvalidKey):
        await store.list_range("/b", "/a")


async def test_oversized_value_is_refused_and_nothing_is_lost(store: MetadataStore) -> None:
    limit = store.settings.max_value_bytes
    await store.put("/big", b"ok")
    with pytest.raises(TooLarge, match=str(limit)):
        await store.put("/big", b"x" * (limit + 1))
    exact = await store.put("/big", b"y" * limit)
    got = await store.get("/big")
    assert got is not None and len(got.value) == limit and got.version == exact.version
    # three copies (record + two index entries) of 700 KiB exceed etcd's 1.5 MiB request
    with pytest.raises(TooLarge):
        await store.put("/big2", b"z" * 700_000, indexes={"a": 1, "b": 2})


async def test_too_many_operations_in_one_step(store: MetadataStore) -> None:
    await store.commit([Put(f"/many/{i:03d}", b"x") for i in range(128)])
    with pytest.raises(TooManyOperations, match="128"):
        await store.commit([Put(f"/more/{i:03d}", b"x") for i in range(129)])
    # index entries count too: 43 records with 2 indexes each = 129 physical writes
    with pytest.raises(TooManyOperations):
        await store.commit(
            [Put(f"/idx/{i:03d}", b"x", indexes={"p": i, "q": i}) for i in range(43)]
        )
    assert (await store.list_prefix("/more/")).records == []
    assert len((await store.list_prefix("/many/")).records) == 128
