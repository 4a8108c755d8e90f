"""A process whose etcd channel is busy in one thread starts children by fork in another
(``subprocess`` with a ``preexec_fn``, as PySpark starts its JVM): every child gets to its
``exec``. With gRPC's fork handlers on, 10-15 % of them crashed (SIGSEGV) before it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import uuid

from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer

FORKS = 200
EXIT_CODE = 7


def _nothing() -> None:
    """A ``preexec_fn``: its presence alone makes ``subprocess`` fork rather than spawn."""


def _fork_children(busy: threading.Event) -> list[int]:
    busy.wait(10)
    return [
        subprocess.run(
            ["/bin/sh", "-c", f"exit {EXIT_CODE}"], preexec_fn=_nothing, check=False
        ).returncode
        for _ in range(FORKS)
    ]


async def test_children_forked_while_etcd_calls_are_in_flight_all_exec(
    etcd_server: EtcdServer,
) -> None:
    store = open_store(etcd_server.url(f"/grpc-fork-{os.getpid()}-{uuid.uuid4().hex[:8]}"))
    busy = threading.Event()
    forking = asyncio.ensure_future(asyncio.to_thread(_fork_children, busy))
    try:
        writes = 0
        while not forking.done():  # the channel stays in use while the children start
            await store.put(f"/k{writes % 20}", b"x" * 100)
            writes += 1
            busy.set()
        codes = await forking
    finally:
        await store.close()
    crashed = [code for code in codes if code != EXIT_CODE]
    assert not crashed, f"{len(crashed)} of {FORKS} children died before exec: {crashed[:10]}"
