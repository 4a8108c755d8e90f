"""Watches that survive connection loss: each event from a start revision, exactly once,
in revision order.

An engine watch breaks when its connection does (``StoreUnavailable``);
:class:`ResumableWatch` opens it again from the first revision it has not delivered, with
a growing pause between attempts (at most ``watch_retry_max_s``). The store's ``watch*``
methods (:class:`~segtxn.metastore.store.MetadataStore`) are built on :func:`resumable`.

An outage is logged once per watch: a WARNING when it breaks, the failed attempts after it
at DEBUG, and an INFO with how long it lasted when events flow again (a ten-second etcd
outage used to print a WARNING per attempt of every watch, and nothing when it ended).

A watch the store refuses while it resumes (``StoreAccessDenied``: its user lost the
permission to read the range meanwhile) is tried again in the same way, since access may
be given back (the engine's ``denied``, and the servers' readiness, say so meanwhile), but
the refusal is logged at WARNING when it starts: retried quietly as an outage, it left a
user nothing to tell why no event arrived. A refusal of the first attempt is raised to the
caller (:func:`resumable`), as any other failure to open is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from segtxn.metastore.engine import Engine, RawEvent
from segtxn.metastore.errors import InvalidArgument, StoreAccessDenied, StoreUnavailable

log = logging.getLogger(__name__)


class ResumableWatch:
    """An engine watch that re-establishes itself after connection loss.

    Invariant: every event with revision >= ``start`` is delivered exactly once, in
    revision order. Engines deliver whole revisions (etcd does not split a revision's
    events unless asked to fragment), so after a break it resumes from the revision after
    the last one delivered. A quiet watch resumes from its start; if compaction has passed
    that point meanwhile, it ends with ``Compacted`` and the caller re-reads.
    """

    def __init__(
        self, engine: Engine, lo: bytes, hi: bytes | None, start: int, retry_max_s: float
    ) -> None:
        self._engine = engine
        self._lo, self._hi = lo, hi
        self._next = start
        self._retry_max_s = retry_max_s
        self._stack: contextlib.AsyncExitStack | None = None
        self._iter: AsyncIterator[Sequence[RawEvent]] | None = None

    async def open(self) -> AsyncIterator[Sequence[RawEvent]]:
        """(Re-)establish the engine watch from the first revision not yet delivered."""
        await self._close_stream()
        stack = contextlib.AsyncExitStack()
        try:
            stream = await stack.enter_async_context(
                self._engine.watch(self._lo, self._hi, self._next)
            )
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._iter = stack, stream
        return stream

    async def _close_stream(self) -> None:
        stack, self._stack, self._iter = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def close(self) -> None:
        await self._close_stream()

    async def events(self) -> AsyncIterator[RawEvent]:
        delay = 0.01
        broken: float | None = None  # when the stream broke, until events flow again
        refused = False  # the last attempt was refused (StoreAccessDenied)
        loop = asyncio.get_running_loop()
        while True:
            try:
                stream = self._iter or await self.open()
                batch = await anext(stream)
            except (StoreUnavailable, StoreAccessDenied) as e:
                denied = isinstance(e, StoreAccessDenied)
                if denied and not refused:
                    log.warning(
                        "watch on %r: StoreAccessDenied (%s): nothing arrives until the "
                        "store's user may read it again; resuming",
                        self._lo,
                        e,
                    )
                elif broken is None:
                    log.warning("watch on %r broke (%s); resuming", self._lo, e)
                else:
                    log.debug("watch on %r: still broken (%s)", self._lo, e)
                broken = loop.time() if broken is None else broken
                refused = denied
                await self._close_stream()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
                continue
            except StopAsyncIteration:
                return
            if broken is not None:
                log.info(
                    "watch on %r resumed, %.1f s after it broke", self._lo, loop.time() - broken
                )
                broken, refused = None, False
            delay = 0.01
            for event in batch:
                if event.mod_revision < self._next:
                    continue  # already delivered before a reconnect
                yield event
            self._next = max(self._next, batch[-1].mod_revision + 1)


@asynccontextmanager
async def resumable(
    engine: Engine, lo: bytes, hi: bytes | None, from_revision: int | None, retry_max_s: float
) -> AsyncIterator[AsyncIterator[RawEvent]]:
    """A :class:`ResumableWatch` on ``[lo, hi)`` from ``from_revision`` (None: changes after
    the current revision), open while the context lasts, as its stream of events."""
    start = from_revision if from_revision is not None else await engine.current_revision() + 1
    if start < 1:
        raise InvalidArgument("from_revision must be >= 1")
    stream = ResumableWatch(engine, lo, hi, start, retry_max_s)
    await stream.open()
    try:
        yield stream.events()
    finally:
        await stream.close()
