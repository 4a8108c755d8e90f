"""The writing half of a :class:`~segtxn.client.stream.MessageStream`: its socket, its
acknowledgments, and the frames and tasks it writes with.

Contract:

- every frame goes out behind one lock, after the acks gathered so far
  (:mod:`segtxn.client.acks`), so an ack made before a nack, a redelivery request or a flow
  reaches the broker before it, also across a reconnect;
- a write with no socket (the stream is reconnecting) writes nothing and fails nobody: the
  acks it took are in flight, and the new attachment sends them first; a connection that
  fails under a write is not the writer's problem either (the read loop notices it and
  attaches again);
- any other failure of a write (a bug, an error where none was expected) closes the socket,
  so that the stream attaches again: an attachment starts from a rewind and sends the
  unanswered acks, which is all that a lost write could have left undone;
- work the stream owns (gathered acks, a redelivery request whose caller gave up) runs as a
  task of the stream, cancelled by its close, and its error, if any, is logged here, never
  left for asyncio to report as "never retrieved".

Attaching, reading and the ordering promise are :mod:`segtxn.client.stream`'s; it is apart
because what leaves the client and what arrives are two concerns (the read side knows
nothing of how acks are gathered).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp

from segtxn.client.acks import Acknowledgments, Placed
from segtxn.client.messages import MessageId
from segtxn.client.timeouts import Deadline, close_quietly
from segtxn.protocol import frames
from segtxn.protocol.frames import Ack
from segtxn.protocol.names import TopicName

__all__ = ["StreamWrites"]

# its lines are the stream's story: they keep its logger
log = logging.getLogger("segtxn.client.stream")


class StreamWrites:
    """A stream's socket and what it writes on it; :class:`~segtxn.client.stream.MessageStream`
    builds on it, setting ``_ws`` and ``_broker`` as it attaches and loses its connection."""

    def __init__(self, kind: str, topic: TopicName) -> None:
        self.topic = topic
        self._kind = kind
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._broker = ""
        """The URL of the broker ``_ws`` is connected to (kept after a loss: acks failed
        because the stream cannot reach a broker again name it)."""
        self._acks = Acknowledgments(str(topic), self._write_acks_soon)
        self._writing = asyncio.Lock()
        """Held while frames are written: acks gathered before a frame go out before it."""
        self._writes: set[asyncio.Task[None]] = set()
        """Writes the stream owns: gathered acks, and redelivery requests (sent even when
        their caller gave up)."""

    @property
    def attached(self) -> bool:
        """False while the stream is reconnecting: nothing can arrive on it meanwhile."""
        return self._ws is not None

    async def _send(self, frame: frames.Frame) -> None:
        """Send on the current connection, if any, after the acks gathered so far. A
        connection failing under the send is not the caller's problem: the reader notices,
        reconnects, and what must be sent again is (acks until their receipts come; an
        attachment starts from a rewind)."""
        async with self._writing:
            await self._write([*self._acks.take(), frame])

    def _write_acks_soon(self) -> None:
        """Acks were gathered: write them in the next turn of the loop (with whatever else
        is gathered by then), unless a write before it takes them first."""
        self._own(self._write_gathered(), f"{self._kind}-acks-{self.topic}")

    def _own(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` as a task of the stream (cancelled by :meth:`close`). Its error, if
        it ends with one, is logged here: its caller may have given up on it (a redelivery
        request is written anyway), and asyncio would report it as "Task exception was
        never retrieved", with a traceback, only once the task is collected."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._writes.add(task)
        task.add_done_callback(self._owned_done)
        return task

    def _owned_done(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning(
                "%s on %s: its task %s failed: %s: %s",
                self._kind, self.topic, task.get_name(), type(error).__name__, error,
                exc_info=error,
            )  # fmt: skip

    async def _write_gathered(self) -> None:
        async with self._writing:
            await self._write(self._acks.take())

    async def _write(self, batch: Sequence[frames.Frame]) -> None:
        ws, broker = self._ws, self._broker  # the read loop may give it up meanwhile
        if ws is None or not batch:
            return  # reconnecting: the new attachment sends the unanswered acks
        try:
            for frame in batch:
                if isinstance(frame, Ack):
                    self._acks.placing(frame, broker)
                await ws.send_bytes(frames.encode(frame))
        except (aiohttp.ClientError, ConnectionError) as e:
            log.info("%s on %s: a send failed (%s); reconnecting", self._kind, self.topic, e)
        except Exception as e:  # the reader notices no failure of this kind
            await self._attach_again(ws, "a send failed", e)

    async def _attach_again(
        self, ws: aiohttp.ClientWebSocketResponse | None, what: str, error: Exception
    ) -> None:
        """``what`` failed with ``error``, neither aiohttp's nor a lost connection's (a
        bug, or a server error where none was expected), so something may not have been
        written: a redelivery request whose rewind the stream waits for, having dropped its
        queue for it, or acks. Close ``ws``: the stream attaches again, which starts from a
        rewind and sends the unanswered acks again."""
        log.warning(
            "%s on %s: %s (%s: %s); attaching again",
            self._kind, self.topic, what, type(error).__name__, error,
            exc_info=error,
        )  # fmt: skip
        if ws is not None:
            await close_quietly(ws.close())

    def ack(
        self,
        ids: list[MessageId],
        *,
        cumulative: bool,
        txn: tuple[int, int] | None = None,
        epoch: int | None = None,
        deadline: Deadline,
        traceparent: str | None = None,
        placed: Placed | None = None,
    ) -> asyncio.Future[None]:
        """Acknowledge ``ids``: the future is done once the broker made it durable (sent
        again after a reconnect until then). Acks of the same turn of the loop travel
        together (segtxn/client/acks.py); ``traceparent`` names the caller's span;
        ``placed`` is told each time a frame carrying the ack is written, with the
        broker's URL (a transaction's one-step commit).

        The future fails with:
            ServerError: the broker refused it.
            Timeout: no receipt by ``deadline`` (OUTCOME_UNKNOWN: it may have been applied;
                it is sent again after a reconnect only inside a frame other acks still
                wait for).
            ConnectionLost: the connection was lost and the stream could not reach a
                broker again (OUTCOME_UNKNOWN if the ack was written, else RETRIABLE), or
                stopped reconnecting for good (a refusal, a certificate not trusted: also
                at once for an ack made after that).
            ClientClosed: the stream closed first.
        """
        return self._acks.submit(
            ids,
            cumulative=cumulative,
            txn=txn,
            epoch=epoch,
            deadline=deadline,
            traceparent=traceparent,
            placed=placed,
        )

    async def settle_acks(self, limit_s: float) -> None:
        """Wait, at most ``limit_s``, for the acks in flight to be confirmed."""
        waiting = self._acks.pending()
        if waiting:
            await asyncio.wait(waiting, timeout=limit_s)

    async def _close_writes(self) -> None:
        """Cancel the writes the stream owns, close its socket, and fail every ack still
        awaited with ClientClosed."""
        for task in self._writes:
            task.cancel()
        await asyncio.gather(*self._writes, return_exceptions=True)
        if self._ws is not None:
            await close_quietly(self._ws.close())
        self._acks.close()
