"""The ``etcd://`` backend's watch streams: one watch per call, or many on one.

A single watch (:func:`confirmed_watch`) writes its ``WatchCreateRequest`` and waits for
etcd to confirm it, so a write made once it is entered is seen. etcd's Watch RPC is a
bidirectional stream that carries any number of watches: each ``WatchCreateRequest`` names
its own ``watch_id`` (etcd 3.4 or newer honours a client's id), a ``WatchCancelRequest``
ends one, and every ``WatchResponse`` says which watch it is about. A broker that follows
one header per transaction it cares about thus holds one stream (:class:`EtcdWatchMux`),
not thousands. Requests are written one at a time (a gRPC stream allows one write in
flight); the replies are read by the stream's one consumer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
from aetcd import rpc

from segtxn.metastore.engine import EventKind, RawEvent, WatchMux, WatchReply
from segtxn.metastore.errors import Compacted, MetadataStoreError, StoreClosed, StoreUnavailable

Failed = Callable[[grpc.aio.AioRpcError], Awaitable[MetadataStoreError]]
"""The engine's translation of a gRPC failure (it also fails over to the next endpoint)."""

Cancelled = Callable[[str], MetadataStoreError]
"""The engine's translation of etcd's reason for cancelling a watch it was not asked to
cancel (``StoreAccessDenied`` for "permission denied", which the engine also counts as a
refusal of its credentials: :attr:`~segtxn.metastore.engine.Engine.denied`)."""


def raw_event(event: Any, namespace: bytes) -> RawEvent:
    """An etcd ``mvccpb.Event`` as the engine's event, its key without the namespace."""
    kv = event.kv
    kind = EventKind.DELETE if event.type == rpc.Event.DELETE else EventKind.PUT
    return RawEvent(
        kind, kv.key[len(namespace) :], kv.value, kv.mod_revision, kv.create_revision, kv.lease
    )


@asynccontextmanager
async def confirmed_watch(
    call: Any,
    create: Any,
    *,
    namespace: bytes,
    timeout_s: float,
    failed: Failed,
    cancelled: Cancelled,
    closed: Callable[[], bool],
) -> AsyncIterator[AsyncIterator[Sequence[RawEvent]]]:
    """One watch on an open ``Watch`` call (the engine opens and finishes the call): entered
    once etcd confirmed ``create``; its batches of events, in revision order.

    Raises (on entering or from the iterator): Compacted, StoreUnavailable, StoreClosed,
    StoreAccessDenied (etcd refused the watch: its user may not read the range).
    """
    try:
        await call.write(rpc.WatchRequest(create_request=create))
        # Not asyncio.wait_for: on Python 3.11 it runs the read as a task of its own
        # and, when a cancel of *this* task comes in just as that read has finished,
        # returns the reply and drops the cancel. The caller (a leadership's guard,
        # say) then runs on with an open watch, and whoever awaits it hangs.
        # asyncio.timeout reads in this task, so a cancel always propagates.
        async with asyncio.timeout(timeout_s):
            created = await call.read()
    except grpc.aio.AioRpcError as e:
        raise await failed(e) from e
    except TimeoutError as e:
        raise StoreUnavailable("etcd did not confirm a watch in time") from e
    if created is grpc.aio.EOF:
        raise StoreUnavailable("etcd closed the watch stream while creating it")
    _check(created, cancelled)
    yield _batches(call, created, namespace, failed=failed, cancelled=cancelled, closed=closed)


def _check(response: Any, cancelled: Cancelled) -> None:
    if response.compact_revision:
        raise Compacted(int(response.compact_revision))
    if response.canceled:
        raise cancelled(response.cancel_reason)


async def _batches(
    call: Any,
    first: Any,
    namespace: bytes,
    *,
    failed: Failed,
    cancelled: Cancelled,
    closed: Callable[[], bool],
) -> AsyncIterator[Sequence[RawEvent]]:
    response = first
    while True:
        if response.events:
            yield [raw_event(e, namespace) for e in response.events]
        try:
            response = await call.read()
        except grpc.aio.AioRpcError as e:
            if closed():
                raise StoreClosed("the etcd store is closed") from e
            raise await failed(e) from e
        if response is grpc.aio.EOF:
            raise StoreUnavailable("etcd ended the watch stream")
        _check(response, cancelled)


class EtcdWatchMux(WatchMux):
    """The watches of one open ``Watch`` call (the engine opens and finishes the call)."""

    def __init__(
        self,
        call: Any,
        namespace: bytes,
        failed: Failed,
        cancelled: Cancelled,
        closed: Callable[[], bool],
    ) -> None:
        self._call = call
        self._ns = namespace
        self._failed = failed
        self._cancelled_by_etcd = cancelled
        self._closed = closed
        self._writing = asyncio.Lock()
        self._cancelled: set[int] = set()
        """Watches we cancelled whose confirmation has not come back yet."""

    async def create(self, watch_id: int, lo: bytes, hi: bytes | None, start_revision: int) -> None:
        create = rpc.WatchCreateRequest(
            key=self._ns + lo, start_revision=start_revision, watch_id=watch_id
        )
        if hi is not None:
            create.range_end = self._ns + hi
        await self._write(rpc.WatchRequest(create_request=create))

    async def cancel(self, watch_id: int) -> None:
        self._cancelled.add(watch_id)
        cancel = rpc.WatchCancelRequest(watch_id=watch_id)
        await self._write(rpc.WatchRequest(cancel_request=cancel))

    async def _write(self, request: Any) -> None:
        async with self._writing:
            try:
                await self._call.write(request)
            except grpc.aio.AioRpcError as e:
                raise await self._failed(e) from e
            except grpc.aio.UsageError as e:  # the call has ended: so has the stream
                raise StoreUnavailable(f"the etcd watch stream has ended ({e})") from e

    async def replies(self) -> AsyncIterator[WatchReply]:
        while True:
            try:
                response = await self._call.read()
            except grpc.aio.AioRpcError as e:
                if self._closed():
                    raise StoreClosed("the etcd store is closed") from e
                raise await self._failed(e) from e
            if response is grpc.aio.EOF:
                raise StoreUnavailable("etcd ended the watch stream")
            watch_id = int(response.watch_id)
            if response.compact_revision:
                yield WatchReply(watch_id, compacted=int(response.compact_revision))
            elif response.canceled:
                if watch_id not in self._cancelled:  # (one refused breaks the stream)
                    reason = response.cancel_reason or "no reason given"
                    raise self._cancelled_by_etcd(f"watch {watch_id}: {reason}")
                self._cancelled.discard(watch_id)
            elif response.events:
                yield WatchReply(watch_id, [raw_event(e, self._ns) for e in response.events])
