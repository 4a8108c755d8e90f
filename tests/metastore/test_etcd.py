"""etcd-only behaviour: real reconnects, endpoint failover, namespaces, and etcd's own limits."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from segtxn.metastore import (
    InvalidArgument,
    StoreUnavailable,
    open_store,
)
from segtxn.metastore.etcd import parse_endpoints
from segtxn.metastore.etcd_server import EtcdServer, free_port
from tests.waiting import take


@pytest.fixture
def private_etcd() -> Iterator[EtcdServer]:
    """An etcd of this test's own, so the test may kill it."""
    server = EtcdServer.in_temp_dir(unsafe_no_fsync=True)
    server.start()
    yield server
    server.stop()


async def test_watch_resumes_across_a_killed_and_restarted_server(
    private_etcd: EtcdServer,
) -> None:
    store = open_store(private_etcd.url("/restart"))
    try:
        async with store.watch_prefix("/r/") as events:
            for i in range(5):
                await store.put(f"/r/{i}", b"before")
            before = await take(events, 5)
            private_etcd.kill()  # SIGKILL: every connection drops at once
            await asyncio.to_thread(private_etcd.start)
            for i in range(5, 10):
                await _put_retrying(store, f"/r/{i}")
            after = await take(events, 5, timeout=30)
    finally:
        await store.close()
    assert [e.key for e in before + after] == [f"/r/{i}" for i in range(10)]


async def _put_retrying(store: object, key: str) -> None:
    from segtxn.metastore import MetadataStore

    assert isinstance(store, MetadataStore)
    for _ in range(200):
        try:
            await store.put(key, b"after")
            return
        except StoreUnavailable:
            await asyncio.sleep(0.05)  # sleep-ok: bounded retry while etcd elects itself
    raise AssertionError("etcd did not come back")


async def test_failover_to_the_next_endpoint(etcd_server: EtcdServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = open_store(f"etcd://{dead},{etcd_server.endpoint}/failover")
    try:
        with pytest.raises(StoreUnavailable):
            await store.put("/k", b"x")  # the first endpoint does not answer
        record = await store.put("/k", b"x")  # the next request goes to the live one
        assert record.value == b"x"
    finally:
        await store.close()


async def test_namespaces_are_isolated(etcd_server: EtcdServer) -> None:
    a = open_store(etcd_server.url(f"/ns-a-{os.getpid()}"))
    b = open_store(etcd_server.url(f"/ns-b-{os.getpid()}"))
    try:
        await a.put("/shared-name", b"a")
        assert await b.get("/shared-name") is None
        await b.put("/shared-name", b"b")
        got = await a.get("/shared-name")
        assert got is not None and got.value == b"a"
    finally:
        await a.close()
        await b.close()


def test_endpoint_parsing() -> None:
    assert parse_endpoints("a:1,b,  c:3 ") == ["a:1", "b:2379", "c:3"]
    with pytest.raises(InvalidArgument):
        open_store("etcd:///only-a-path")
