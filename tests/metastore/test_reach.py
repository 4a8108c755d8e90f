"""Opening a store from a flag: URLs refused before anything connects (``check_url``), and
a store that does not answer given up on in bounded time (``wait_reachable``)."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator

import pytest

from segtxn.metastore import (
    InvalidArgument,
    StoreUnavailable,
    check_url,
    open_store,
    wait_reachable,
)
from segtxn.metastore.etcd_server import EtcdServer, free_port


@pytest.mark.parametrize(
    "url", ["memory://", "etcd://127.0.0.1:2379", "etcd://a:1,b:2/ns", "etcd://host/ns"]
)
def test_good_urls_pass(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("zookeeper://x", "unknown metadata store URL"),
        ("127.0.0.1:2379", "unknown metadata store URL"),
        ("memory://x", "a memory store URL is just 'memory://'"),
        ("etcd://", "expected etcd://host:port"),
        ("etcd://h:99999", "is not host:port (port 1-65535)"),
        ("etcd://h:0", "is not host:port (port 1-65535)"),
        ("etcd://h:x", "is not host:port"),
        ("etcd://h:1?a=b", "expected etcd://host:port"),
    ],
)
def test_bad_urls_are_refused_without_connecting(url: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(says)):
        check_url(url)
    with pytest.raises(InvalidArgument):
        open_store(url)


async def test_a_store_that_answers_is_reached_at_once() -> None:
    async with open_store("memory://") as store:
        assert await wait_reachable(store, timeout_s=5, url="memory://") >= 0


async def test_a_real_etcd_is_reached(etcd_server: EtcdServer) -> None:
    url = etcd_server.url("/reach")
    async with open_store(url) as store:
        assert await wait_reachable(store, timeout_s=5, url=url) > 0


async def test_a_dead_port_is_given_up_at_the_timeout() -> None:
    url = f"etcd://127.0.0.1:{free_port()}"
    loop = asyncio.get_running_loop()
    async with open_store(url) as store:
        started = loop.time()
        with pytest.raises(
            StoreUnavailable, match=r"not reachable within 1 s \(\d+ attempts; last: "
        ):
            await wait_reachable(store, timeout_s=1, url=url)
        assert 1 <= loop.time() - started < 3


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield int(listener.getsockname()[1])


async def test_a_store_that_never_answers_is_given_up_at_the_timeout(silent_port: int) -> None:
    url = f"etcd://127.0.0.1:{silent_port}"
    loop = asyncio.get_running_loop()
    async with open_store(url) as store:
        started = loop.time()
        with pytest.raises(StoreUnavailable, match=r"not reachable within 1\.5 s"):
            await wait_reachable(store, timeout_s=1.5, url=url)
        assert 1.5 <= loop.time() - started < 3  # not the 5 s of one request's own timeout
