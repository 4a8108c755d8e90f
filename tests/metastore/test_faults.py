"""The fault injector itself: each fault fires when asked, as often as asked, and is counted."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.metastore import MetadataStore, NotFound, StoreUnavailable
from segtxn.metastore.faults import FaultInjector
from tests.waiting import take, wait_until


async def test_fail_counts_and_clears(store: MetadataStore, faults: FaultInjector) -> None:
    faults.fail("txn", times=2)
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            await store.put("/a", b"x")
    await store.put("/a", b"x")  # the rule is used up
    assert faults.injected == 2
    faults.fail("range", times=None)
    for _ in range(3):
        with pytest.raises(StoreUnavailable):
            await store.get("/a")
    faults.clear()
    assert await store.get("/a") is not None


async def test_fail_only_matching_keys(store: MetadataStore, faults: FaultInjector) -> None:
    faults.fail("txn", key_prefix="/txn-op/", times=None, error=NotFound("/txn-op/x"))
    await store.put("/txn/1", b"header")
    with pytest.raises(NotFound):
        await store.put("/txn-op/1/", b"op", sequential=True)
    faults.clear()
    await store.put("/txn-op/1/", b"op", sequential=True)


async def test_fail_after_apply_leaves_the_write_in_place(
    store: MetadataStore, faults: FaultInjector
) -> None:
    """A reply lost on the way back: the caller sees an error, the store has the write."""
    faults.fail("txn", after_apply=True)
    with pytest.raises(StoreUnavailable):
        await store.put("/landed", b"yes")
    got = await store.get("/landed")
    assert got is not None and got.value == b"yes"


async def test_delay_slows_an_operation(store: MetadataStore, faults: FaultInjector) -> None:
    loop = asyncio.get_running_loop()
    faults.delay("range", 0.2)
    started = loop.time()
    await store.get("/x")
    assert loop.time() - started >= 0.2
    assert faults.injected == 1


async def test_hold_answers_in_the_order_the_test_picks(
    store: MetadataStore, faults: FaultInjector
) -> None:
    await store.put("/h/a", b"a")
    hold = faults.hold("range", key_prefix="/h/", times=3)
    answered: list[str] = []

    async def read(key: str) -> None:
        await store.get(key)
        answered.append(key)

    readers = [asyncio.create_task(read(k)) for k in ("/h/a", "/h/b", "/h/c")]  # calls 0, 1, 2
    await hold.wait_for(3)
    assert hold.parked == 3 and not answered  # applied, answers parked
    await store.get("/elsewhere")  # other keys are not held
    hold.release(2, 0, 1)
    await asyncio.gather(*readers)
    assert answered == ["/h/c", "/h/a", "/h/b"]
    await store.get("/h/a")  # the rule is used up
    assert faults.injected == 3
    with pytest.raises(ValueError, match="only range and txn"):
        faults.hold("watch")


async def test_hold_before_parks_the_write_until_released(
    store: MetadataStore, faults: FaultInjector
) -> None:
    """``before``: the call waits before the backend applies it (a write reaching the
    store late), so a reader sees nothing until it is let go."""
    hold = faults.hold("txn", key_prefix="/late/", before=True)
    writing = asyncio.create_task(store.put("/late/x", b"x"))
    await hold.wait_for(1)
    assert await store.get("/late/x") is None  # not applied while parked
    hold.release()
    await writing
    got = await store.get("/late/x")
    assert got is not None and got.value == b"x"


async def test_drop_watches_is_invisible_to_the_caller(
    store: MetadataStore, faults: FaultInjector
) -> None:
    async with store.watch_prefix("/d/") as events:
        await store.put("/d/1", b"1")
        assert faults.drop_watches() == 1
        await store.put("/d/2", b"2")  # written while the watch is down
        got = await take(events, 2)
        await wait_until(lambda: faults.open_watches == 1, what="watch re-established")
    assert [e.key for e in got] == ["/d/1", "/d/2"]


async def test_unknown_operation_is_refused(faults: FaultInjector) -> None:
    with pytest.raises(ValueError, match="unknown operation"):
        faults.fail("nonsense")
