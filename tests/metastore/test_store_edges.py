"""The metadata store at its edges, on both backends: keys and index keys that are not
UTF-8, a negative index limit, and point watches that meet a refusal while their stream is
opened again. Each failed before its fix (a review)."""

from __future__ import annotations

import pytest

from segtxn.metastore import (
    InvalidArgument,
    InvalidKey,
    MetadataStore,
    StoreAccessDenied,
    WatchEvent,
)
from segtxn.metastore.faults import FaultInjector
from tests.metastore.conftest import MakeStore
from tests.waiting import wait_until


def _faults(store: MetadataStore) -> FaultInjector:
    assert isinstance(store.engine, FaultInjector)
    return store.engine


# ---------------------------------------------------------------- bad keys get clear errors


async def test_a_key_with_a_lone_surrogate_is_an_invalid_key(store: MetadataStore) -> None:
    """A str that is not encodable as UTF-8 is a bad key: InvalidKey (an InvalidArgument),
    not a UnicodeEncodeError escaping from keys.check_key."""
    bad = "/lone-\ud800"
    with pytest.raises(InvalidKey):
        await store.put(bad, b"x")
    with pytest.raises(InvalidKey):
        await store.get(bad)
    with pytest.raises(InvalidKey):
        await store.list_prefix(bad)


async def test_an_index_key_with_a_lone_surrogate_is_an_invalid_key(store: MetadataStore) -> None:
    with pytest.raises(InvalidKey):
        await store.put("/rec", b"x", indexes={"by-name": "bad-\udc80"})
    with pytest.raises(InvalidKey):
        await store.index_range("by-name", ("bad-\udc80",))
    assert await store.get("/rec") is None


async def test_a_negative_index_range_limit_is_refused(store: MetadataStore) -> None:
    """list_prefix/list_range refuse limit < 0 with InvalidArgument; index_range silently
    reads the whole index instead."""
    for i in range(3):
        await store.put(f"/n/{i}", b"v", indexes={"neg": i})
    with pytest.raises(InvalidArgument):
        await store.list_prefix("/n/", limit=-1)
    with pytest.raises(InvalidArgument):
        await store.index_range("neg", limit=-1)


# ---------------------------------------------------- point watches: no store error ends them


async def test_point_watches_survive_a_refusal_while_reconnecting(make_store: MakeStore) -> None:
    """PointWatches._run: "Once up, no store error ends it" -- but only StoreUnavailable is
    retried. One StoreAccessDenied (a token refused once, a role briefly revoked: the engine
    treats ``denied`` as transient) while the stream reopens ends the task for good, silently:
    every point watch stops delivering and the owner is never told."""
    store, watcher = make_store(), make_store()
    heard: list[WatchEvent] = []
    points = watcher.point_watches(heard.append, lambda key: None)
    await points.start()
    try:
        start = await store.revision() + 1
        points.add("/pw/a", start)
        await store.put("/pw/a", b"1")
        await wait_until(lambda: len(heard) == 1, what="the first event")
        faults = _faults(watcher)
        faults.fail("watch", error=StoreAccessDenied("injected: refused once"), times=1)
        assert faults.drop_watches() == 1
        await wait_until(lambda: faults.injected >= 2, what="the refusal to fire")
        await store.put("/pw/a", b"2")
        await wait_until(
            lambda: len(heard) == 2,
            timeout=5,
            what=f"the change after a transient refusal (task: {points._task})",
        )
    finally:
        await points.close()
