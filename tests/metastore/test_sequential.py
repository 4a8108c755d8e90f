"""Conformance: store-assigned sequential keys are unique and strictly increasing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from segtxn.metastore import MetadataStore, Put
from segtxn.metastore.engine import TxnResult
from tests.metastore.conftest import MakeStore


async def test_sequential_keys_under_64_concurrent_writers(make_store: MakeStore) -> None:
    clients = [make_store() for _ in range(4)]
    per_writer: dict[int, list[str]] = {i: [] for i in range(64)}

    async def writer(i: int) -> None:
        for _ in range(5):
            record = await clients[i % 4].put("/txn-op/T1/", f"{i}".encode(), sequential=True)
            per_writer[i].append(record.key)

    await asyncio.gather(*(writer(i) for i in range(64)))
    every = [k for keys in per_writer.values() for k in keys]
    assert len(set(every)) == len(every) == 320
    for keys in per_writer.values():  # each writer saw its keys strictly increase
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
    numbers = sorted(int(k.rsplit("/", 1)[1]) for k in every)
    assert numbers == list(range(1, 321))
    listing = await clients[0].list_prefix("/txn-op/T1/")
    assert [r.key for r in listing.records] == sorted(every)


async def test_sequential_order_follows_completion(store: MetadataStore) -> None:
    first = await store.put("/seq/", b"a", sequential=True)
    second = await store.put("/seq/", b"b", sequential=True)
    batch = await store.commit(
        [Put("/seq/", b"c", sequential=True), Put("/seq/", b"d", sequential=True)]
    )
    keys = [first.key, second.key] + [r.key for r in batch if r is not None]
    assert keys == sorted(keys) and len(set(keys)) == 4
    other = await store.put("/seq-other/", b"x", sequential=True)
    assert other.key.endswith("1".zfill(20))  # every prefix counts on its own


async def test_sequential_with_indexes(store: MetadataStore) -> None:
    for segment in ["s1", "s2", "s1"]:
        await store.put(
            "/txn-op/T/", segment.encode(), sequential=True, indexes={"writes": segment}
        )
    s1 = await store.index_range("writes", "s1")
    assert [e.value for e in s1.entries] == [b"s1", b"s1"]
    assert [e.key for e in s1.entries] == sorted(e.key for e in s1.entries)


async def test_delete_range_resets_the_counter(store: MetadataStore) -> None:
    await store.put("/q/", b"1", sequential=True)
    await store.put("/q/", b"2", sequential=True)
    await store.delete_range("/q/")
    again = await store.put("/q/", b"3", sequential=True)
    assert again.key == "/q/" + "1".zfill(20)


async def test_a_client_kept_one_write_behind_gets_its_number(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client always one write behind a busier one loses every race to the shared
    counter while that client has puts queued; those are races lost to progress, not a
    failing store: it gets its number once the prefix quietens (it gave up after 64
    attempts: StoreUnavailable). Here the busy client takes one more number right before
    each of the slow client's store calls, a hundred times."""
    busy, slow = make_store(), make_store()
    original = slow.engine.txn
    rounds = 0

    async def one_write_behind(*args: Any, **kwargs: Any) -> TxnResult:
        nonlocal rounds
        if rounds < 100:
            rounds += 1
            await busy.put("/seq-busy/", b"b", sequential=True)
        return await original(*args, **kwargs)

    monkeypatch.setattr(slow.engine, "txn", one_write_behind)
    record = await slow.put("/seq-busy/", b"s", sequential=True)
    assert rounds == 100  # it was kept behind all that time, and did not give up
    assert record.key.endswith(str(101).zfill(20))  # after the busy client's hundred
