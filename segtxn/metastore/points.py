"""Point watches on many keys, multiplexed on one stream, each resumed on its own.

A broker in ``scoped`` header-watch mode follows one header per transaction its segments
care about: thousands of keys that come and go. One engine watch each would be one etcd
stream each; :class:`PointWatches` puts them all on one multiplexed stream
(:meth:`~segtxn.metastore.engine.Engine.watch_many`) and keeps, per key, the first revision
not yet delivered. When the stream breaks it opens a new one and creates every watch again
from that revision (after a pause that grows to the store's ``watch_retry_max_s``), so each
change of each key is delivered exactly once, in revision order. A watch whose history is
gone ends alone: its owner hears ``on_compacted`` and must read the key again and add it
again (from the read's revision + 1).

:meth:`PointWatches.add` and :meth:`PointWatches.cancel` do not wait: they queue the
request for the stream's sender task (the header cache calls them from synchronous code).
A watch is created from the revision it was added with whenever the sender gets to it: its
start is explicit, so nothing is missed meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from segtxn.metastore import keys as K
from segtxn.metastore.engine import Engine, RawEvent, WatchMux
from segtxn.metastore.errors import (
    InvalidArgument,
    MetadataStoreError,
    StoreClosed,
    StoreUnavailable,
)
from segtxn.metastore.records import WatchEvent

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.01
"""The first pause before opening a broken stream again (it doubles each time)."""


@dataclass(eq=False)
class _Point:
    watch_id: int
    next_revision: int
    """The first revision not yet delivered: where the watch starts (again)."""


class PointWatches:
    """Watches on single keys over one multiplexed stream (see the module docstring).

    Made by :meth:`~segtxn.metastore.store.MetadataStore.point_watches`; ``on_event`` and
    ``on_compacted`` are called on the stream's task and must not block (they may call
    :meth:`add` and :meth:`cancel`).
    """

    def __init__(
        self,
        engine: Engine,
        decode: Callable[[RawEvent], WatchEvent],
        on_event: Callable[[WatchEvent], None],
        on_compacted: Callable[[str], None],
        retry_max_s: float,
    ) -> None:
        self._engine = engine
        self._decode = decode
        self._on_event = on_event
        self._on_compacted = on_compacted
        self._retry_max_s = retry_max_s
        self._points: dict[bytes, _Point] = {}
        self._keys: dict[int, bytes] = {}
        self._ids = itertools.count(1)  # etcd reads watch_id 0 as "pick one for me"
        self._outbox: dict[int, bytes | None] = {}
        """Requests not yet sent, oldest first: a create (its key) or a cancel (None)."""
        self._outbox_ready = asyncio.Event()
        self._up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        """How many keys are watched."""
        return len(self._points)

    def add(self, key: str, from_revision: int) -> None:
        """Watch ``key`` from ``from_revision`` (inclusive). A key already watched keeps
        its watch (it already delivers everything newer than its owner has seen).

        Raises:
            InvalidKey: not a valid key.
            InvalidArgument: ``from_revision`` < 1.
        """
        raw = K.check_key(key)
        if from_revision < 1:
            raise InvalidArgument("from_revision must be >= 1")
        if raw in self._points:
            return
        watch_id = next(self._ids)
        self._points[raw] = _Point(watch_id, from_revision)
        self._keys[watch_id] = raw
        self._outbox[watch_id] = raw
        self._outbox_ready.set()

    def cancel(self, key: str) -> None:
        """Stop watching ``key`` (nothing is delivered for it from now on); a key not
        watched is left alone."""
        point = self._points.pop(K.check_key(key), None)
        if point is None:
            return
        del self._keys[point.watch_id]
        if self._outbox.pop(point.watch_id, None) is None:  # created already: cancel it
            self._outbox[point.watch_id] = None
            self._outbox_ready.set()

    async def start(self) -> None:
        """Open the stream; return once it is open and the store has answered (opening an
        etcd stream sends nothing: a store that cannot be reached is found here, as it is
        when a single watch is confirmed).

        Raises:
            MetadataStoreError: the store did not answer, or the stream could not be
                opened (the task has ended).
        """
        await self._engine.current_revision()
        self._task = asyncio.create_task(self._run(), name="point-watches")
        up = asyncio.create_task(self._up.wait(), name="point-watches-up")
        try:
            await asyncio.wait({self._task, up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
            await asyncio.gather(up, return_exceptions=True)
        if not self._up.is_set():
            self._task.result()
            raise StoreClosed("the point watches ended before they started")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        """Keep a stream open until the store is closed; after a break, every watch is
        created again from its next revision. Once up, no store error ends it."""
        pause_s = RETRY_MIN_S
        while True:
            try:
                async with self._engine.watch_many() as mux:
                    # A new stream knows no watch: create each from where it stopped.
                    self._outbox = {p.watch_id: key for key, p in self._points.items()}
                    self._outbox_ready.set()
                    self._up.set()
                    pause_s = RETRY_MIN_S
                    await self._serve(mux)
            except StoreClosed:
                return
            except MetadataStoreError as e:
                # Once up, any refusal of a stream being opened again is taken as passing
                # (a token forgotten, a role briefly revoked): ending here stopped every
                # point watch for good, with nothing said.
                if not self._up.is_set():
                    raise
                level = logging.WARNING if isinstance(e, StoreUnavailable) else logging.ERROR
                log.log(level, "the point watch stream broke (%s); resuming", e)
                await asyncio.sleep(pause_s)
                pause_s = min(pause_s * 2, self._retry_max_s)

    async def _serve(self, mux: WatchMux) -> None:
        """Send requests and receive replies until either side fails (raised)."""
        tasks = {
            asyncio.create_task(self._send(mux), name="point-watches-send"),
            asyncio.create_task(self._receive(mux), name="point-watches-receive"),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()
        raise StoreUnavailable("the point watch stream ended")

    async def _send(self, mux: WatchMux) -> None:
        while True:
            if not self._outbox:
                self._outbox_ready.clear()
                await self._outbox_ready.wait()
                continue
            watch_id, key = next(iter(self._outbox.items()))
            del self._outbox[watch_id]  # an add or cancel from now on queues anew
            if key is None:
                await mux.cancel(watch_id)
            else:
                await mux.create(watch_id, key, None, self._points[key].next_revision)

    async def _receive(self, mux: WatchMux) -> None:
        async for reply in mux.replies():
            key = self._keys.get(reply.watch_id)
            if key is None:
                continue  # cancelled: replies that were already on their way
            point = self._points[key]
            if reply.compacted:
                del self._points[key], self._keys[reply.watch_id]
                self._on_compacted(key.decode())
                continue
            for event in reply.events:
                if reply.watch_id not in self._keys:
                    break  # cancelled by the owner as it heard the previous event
                if event.mod_revision < point.next_revision:
                    continue  # delivered before the stream broke
                point.next_revision = event.mod_revision + 1
                self._on_event(self._decode(event))
