"""Edges of the fault injector: a drop that lands while a watch is still being created.

The injector's watch creation is a round trip to the backend (on etcd, a ``Watch`` call and
its confirmation) between its fault check and the moment the watch is listed as open. The
tests park that round trip on an event, drop the watches meanwhile, and then let the
creation finish: the watch must come up broken, as one whose connection was lost in the
middle of its creation would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from segtxn.metastore import MetadataStore, StoreUnavailable
from segtxn.metastore.engine import PutOp, RawEvent, WatchReply
from segtxn.metastore.faults import FaultInjector

KEY = b"/drop-race/k"


class Gate:
    """Parks the inner engine's watch creations until the test opens it."""

    def __init__(self) -> None:
        self.creating = asyncio.Event()
        self.open = asyncio.Event()

    def around(
        self, create: Callable[..., AbstractAsyncContextManager[object]]
    ) -> Callable[..., AbstractAsyncContextManager[object]]:
        @asynccontextmanager
        async def gated(*args: object) -> AsyncIterator[object]:
            self.creating.set()
            await self.open.wait()
            async with create(*args) as stream:
                yield stream

        return gated

    async def drop_while_creating(self, faults: FaultInjector) -> None:
        """Wait until a creation is parked, drop the watches, then let it go on."""
        async with asyncio.timeout(10):
            await self.creating.wait()
        assert faults.drop_watches() == 0  # not listed yet: nothing to break right now
        self.open.set()


async def _written(faults: FaultInjector) -> int:
    """Write KEY through the injector; its revision (a live watch from it hears it)."""
    result = await faults.txn([], [PutOp(KEY, b"v")])
    return result.revision


async def test_a_watch_created_across_a_drop_comes_up_broken(
    store: MetadataStore, faults: FaultInjector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the watch was listed only after its creation, so the drop missed it and it
    lived on, hearing the write, and never any later compaction a test meant it to hear."""
    gate = Gate()
    monkeypatch.setattr(faults.inner, "watch", gate.around(faults.inner.watch))
    revision = await _written(faults)

    async def follow() -> Sequence[RawEvent]:
        async with faults.watch(KEY, None, revision) as batches:
            return await anext(batches)

    following = asyncio.create_task(follow())
    await gate.drop_while_creating(faults)
    with pytest.raises(StoreUnavailable, match="dropped"):
        await asyncio.wait_for(following, 10)


async def test_a_multiplexed_stream_created_across_a_drop_comes_up_broken(
    store: MetadataStore, faults: FaultInjector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a multiplexed stream (``watch_many``): its watches are refused."""
    gate = Gate()
    monkeypatch.setattr(faults.inner, "watch_many", gate.around(faults.inner.watch_many))
    revision = await _written(faults)

    async def follow() -> WatchReply:
        async with faults.watch_many() as mux:
            await mux.create(1, KEY, None, revision)
            return await anext(mux.replies())

    following = asyncio.create_task(follow())
    await gate.drop_while_creating(faults)
    with pytest.raises(StoreUnavailable, match="dropped"):
        await asyncio.wait_for(following, 10)


async def test_a_watch_created_after_a_drop_is_not_broken(
    store: MetadataStore, faults: FaultInjector
) -> None:
    """A drop breaks what is open or being created then, not the watches made later."""
    assert faults.drop_watches() == 0
    revision = await _written(faults)
    async with faults.watch(KEY, None, revision) as batches:
        batch = await asyncio.wait_for(anext(batches), 10)
    assert [e.key for e in batch] == [KEY]
    assert faults.open_watches == 0
