"""A producer's connection as the way to ask its broker for the one-step commit
(:mod:`segtxn.client.onestep`): a ``commit`` frame on a WebSocket the client already holds,
instead of an HTTP request. That request cost the client about a third of a millisecond of
CPU per transaction and the broker a quarter (py-spy, bench/peer.py ``txn 10``): more than
the broker's op-record step.

The producer writes the queued frames after its sends (the broker reads them in that order)
and hands this channel the answers it reads. When its connection is lost, every commit
still waiting fails with ConnectionError: it may have been acted on, so the transaction's
outcome is unknown to the caller (never "not here")."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from segtxn import tracing
from segtxn.protocol.errors import ErrorName, ServerError, server_error
from segtxn.protocol.frames import Commit, CommitAnswer, Error
from segtxn.protocol.txn import TxnId

__all__ = ["CommitChannel"]


class CommitChannel:
    """The commits asked on one producer's connection (see the module docstring)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        """``wake``: tells the producer's writer that a frame is queued."""
        self._wake = wake
        self._ids = itertools.count(1)
        self._queued: list[Commit] = []
        self._waiting: dict[int, asyncio.Future[CommitAnswer]] = {}
        self.broker_url: str | None = None
        """The broker the connection of the moment is to (None: not connected)."""
        self.supported = True
        """False once the broker could not read a ``commit`` frame (a broker older than
        the frame answers ``InvalidMessage``): commits then go over HTTP."""

    async def commit(
        self, txn: TxnId, ops: int, digest: int, timeout_s: float | None
    ) -> CommitAnswer:
        """Ask the broker to commit ``txn`` (its ``ops`` operations with ``digest``), within
        ``timeout_s`` (None: no limit); the current span's trace context goes with it.

        Raises:
            ServerError: the broker refused it (what END_TXN's refusals are).
            ConnectionError: the connection was lost before the answer (it may have landed).
            TimeoutError: no answer within ``timeout_s`` (it may have landed).
        """
        request_id = next(self._ids)
        answer: asyncio.Future[CommitAnswer] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        self._queued.append(
            Commit(
                request_id=request_id,
                txn=(txn.most, txn.least),
                ops=ops,
                digest=digest,
                traceparent=tracing.current_traceparent(),
            )
        )
        self._wake()
        try:
            async with asyncio.timeout(timeout_s):
                return await answer
        finally:
            self._waiting.pop(request_id, None)

    def take(self) -> list[Commit]:
        """The frames to write now (the writer's, after its sends)."""
        queued, self._queued = self._queued, []
        return [frame for frame in queued if frame.request_id in self._waiting]

    def answered(self, frame: CommitAnswer | Error) -> None:
        """Hand over an answer read on the connection (one to a commit no longer waited
        for is dropped)."""
        waiting = None if frame.request_id is None else self._waiting.get(frame.request_id)
        if waiting is None or waiting.done():
            return
        if isinstance(frame, Error):
            waiting.set_exception(server_error(ErrorName.parse(frame.error), frame.message))
        else:
            waiting.set_result(frame)

    def unreadable(self, error: ServerError) -> bool:
        """An error the broker sent naming neither a send nor a request: if it is
        ``InvalidMessage`` while commits wait, the broker could not decode a frame, and from
        a broker that reads every frame this client writes but ``commit`` (an older one),
        that was a commit. The waiting commits fail with it (nothing was decided) and later
        ones are not asked here. True if it was taken so (False: not a commit's)."""
        if error.name is not ErrorName.INVALID_MESSAGE or not self._waiting:
            return False
        self.supported = False
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(error)
                waiting.exception()  # retrieved: its caller re-raises it
        return True

    def lost(self, why: str) -> None:
        """The connection is gone (or the producer closed): nothing is asked on it any more,
        and what waits fails."""
        self.broker_url = None
        self._queued.clear()
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(ConnectionError(why))
                waiting.exception()  # retrieved: its caller re-raises it
