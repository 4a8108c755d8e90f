"""etcd-only behaviour: real reconnects, endpoint failover, namespaces, etcd's own limits, and
cancels that meet etcd's replies."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

from segtxn.metastore import (
    InvalidArgument,
    LeaderElection,
    StoreSettings,
    StoreUnavailable,
    open_store,
)
from segtxn.metastore.etcd import EtcdEngine, parse_endpoints
from segtxn.metastore.etcd_server import EtcdServer, free_port
from tests.waiting import take, wait_until


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


async def test_point_watches_resume_across_a_killed_and_restarted_server(
    private_etcd: EtcdServer,
) -> None:
    """Many point watches on one Watch call: when etcd dies and comes back, each is created
    again from its own next revision (nothing missed, nothing twice)."""
    store = open_store(private_etcd.url("/restart-points"), StoreSettings(watch_retry_max_s=0.2))
    heard: list[tuple[str, bytes | None]] = []
    compacted: list[str] = []
    watches = store.point_watches(
        lambda e: heard.append((e.key, None if e.record is None else e.record.value)),
        compacted.append,
    )
    await watches.start()
    try:
        start = await store.revision() + 1
        for i in range(3):
            watches.add(f"/r/{i}", start)
        for i in range(3):
            await store.put(f"/r/{i}", b"before")
        await wait_until(lambda: len(heard) == 3, what="the changes before the kill")
        private_etcd.kill()  # SIGKILL: the stream drops with every other connection
        await asyncio.to_thread(private_etcd.start)
        for i in range(3):
            await _put_retrying(store, f"/r/{i}")
        await wait_until(lambda: len(heard) == 6, timeout=30, what="the changes after it")
    finally:
        await watches.close()
        await store.close()
    for i in range(3):
        assert [value for key, value in heard if key == f"/r/{i}"] == [b"before", b"after"]
    assert compacted == []


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


class _ConfirmationGate:
    """Holds back etcd's confirmation of the next watch an engine opens: once the reply has
    arrived, ``arrived`` is set, and the engine only gets it after :meth:`release`.

    It wraps the engine's gRPC watch stub (its connection's) because the race it sets
    up is below every wrapper the store has: a task cancelled at the moment the reply to
    its watch request is already in. Only the first read of that one call is held.
    """

    def __init__(self, engine: EtcdEngine) -> None:
        stubs = engine.connection.stubs()
        self._stub = stubs.watch
        stubs.watch = self
        self.arrived = asyncio.Event()
        self._released = asyncio.Event()
        self._armed = True

    def Watch(self, **options: Any) -> Any:  # the stub's method name (and its metadata=)
        call = self._stub.Watch(**options)
        if not self._armed:
            return call
        self._armed = False
        return _GatedCall(call, self)

    def release(self) -> None:
        self._released.set()

    async def hold(self) -> None:
        """(For the gated call.) The reply is in: say so, and wait for :meth:`release`."""
        self.arrived.set()
        await self._released.wait()


class _GatedCall:
    """A watch call whose first reply waits for its gate (see :class:`_ConfirmationGate`)."""

    def __init__(self, call: Any, gate: _ConfirmationGate) -> None:
        self._call = call
        self._gate = gate
        self._first = True

    async def write(self, request: Any) -> None:
        await self._call.write(request)

    async def read(self) -> Any:
        response = await self._call.read()
        if self._first:
            self._first = False
            await self._gate.hold()
        return response

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    async def code(self) -> Any:
        return await self._call.code()


async def test_a_cancel_that_meets_a_watch_confirmation_is_not_lost(
    etcd_server: EtcdServer,
) -> None:
    """A task cancelled just as etcd's confirmation of its new watch arrives ends
    cancelled. It used to swallow the cancel (Python 3.11's ``asyncio.wait_for`` returns
    the result of an inner call that finished as the cancel came in) and run on with the
    watch open, so whoever awaited it, e.g. ``Leadership.resign``, hung for good."""
    engine = EtcdEngine([etcd_server.endpoint], f"/gate-{os.getpid()}".encode())
    start = await engine.current_revision() + 1
    gate = _ConfirmationGate(engine)

    async def follow() -> None:
        async with engine.watch(b"/k", None, start) as batches:
            async for _ in batches:
                pass

    task = asyncio.create_task(follow())
    try:
        async with asyncio.timeout(10):
            await gate.arrived.wait()
        gate.release()  # the reply is in first,
        task.cancel()  # then, before the engine has seen it, the cancel
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(10):
                await task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await engine.close()


async def test_resigning_as_the_leadership_watch_is_confirmed(etcd_server: EtcdServer) -> None:
    """``resign`` right after ``campaign`` returns, while the leadership's guard is still
    opening its watch, gives the leadership up (it used to hang: the guard's watch task
    swallowed the cancel, see the test above)."""
    store = open_store(etcd_server.url(f"/resign-{os.getpid()}"))
    try:
        session = await store.open_session(5)
        assert isinstance(store.engine, EtcdEngine)
        gate = _ConfirmationGate(store.engine)  # the next watch is the guard's
        election = LeaderElection(store, "tc-0", session, b"a")
        leadership = await election.campaign()
        async with asyncio.timeout(10):
            await gate.arrived.wait()
        gate.release()
        async with asyncio.timeout(10):
            await leadership.resign()
        assert leadership.lost.is_set()
        assert await election.leader() is None
        await session.close()
    finally:
        await store.close()
