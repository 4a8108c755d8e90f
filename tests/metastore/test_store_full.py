"""A store whose etcd reached its size quota (the NOSPACE alarm) refuses every write with
StoreFull: not StoreUnavailable (it does not pass by itself, so retrying is no use), and
the write was not applied. Against a real etcd started with a tiny --quota-backend-bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from segtxn.metastore import MetadataStore, StoreFull, StoreUnavailable, open_store
from segtxn.metastore.etcd_server import EtcdServer

QUOTA_BYTES = 256 * 1024
"""Small enough to fill in a few writes, large enough for etcd to start."""
CHUNK = b"x" * 60_000
FILL_LIMIT = 1000
"""etcd checks the quota against its database file, which grows when a batch commits
(every 100 ms): how many writes it takes varies (5 to 44 seen)."""


@pytest.fixture
def small_etcd() -> Iterator[EtcdServer]:
    """A private etcd with a tiny backend quota (it is filled, so not the shared one)."""
    server = EtcdServer.in_temp_dir(unsafe_no_fsync=True, quota_backend_bytes=QUOTA_BYTES)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def store(small_etcd: EtcdServer) -> AsyncIterator[MetadataStore]:
    opened = open_store(small_etcd.url("/full"))
    try:
        yield opened
    finally:
        await opened.close()


async def fill(store: MetadataStore, prefix: str = "/filler/") -> StoreFull:
    """Write until the store is full; the StoreFull that says so."""
    for i in range(FILL_LIMIT):
        try:
            await store.put(f"{prefix}{i}", CHUNK)
        except StoreFull as e:
            return e
    raise AssertionError(f"{FILL_LIMIT * len(CHUNK)} bytes written and the store is not full")


async def test_a_full_etcd_refuses_writes_with_store_full_and_applies_none(
    store: MetadataStore,
) -> None:
    error = await fill(store)
    assert not error.retriable and not isinstance(error, StoreUnavailable)
    assert "database space exceeded" in str(error)
    with pytest.raises(StoreFull):  # every write now, however small
        await store.put("/small", b"1")
    assert await store.get("/small") is None  # not applied; reads still work
    # A delete (a transaction) is refused the same way, not applied, as a rule; on a loaded
    # machine etcd let one through once (a delete writes nothing new: etcd's maintenance
    # mode accepts deletes). Either way it is all or nothing, and never another error.
    try:
        await store.delete("/filler/0")
    except StoreFull:
        assert await store.get("/filler/0") is not None
    else:
        assert await store.get("/filler/0") is None


async def test_a_full_etcd_refuses_a_new_session_and_keeps_the_old_ones(
    store: MetadataStore,
) -> None:
    """A new session is a lease grant: refused. An existing one's keep-alive still works,
    so a broker or coordinator holding one keeps its place while the store is full."""
    async with await store.open_session(ttl_s=5) as session:
        await fill(store)
        with pytest.raises(StoreFull):
            await store.open_session(ttl_s=5)
        assert await store.engine.lease_keepalive(session.lease_id) > 0
