"""A WebSocket connection's outbound side: a bounded queue of frames and one task that
writes them, so slow sockets never block a dispatcher. What is queued while it writes goes
out together (runs of receipts or messages as one batch frame: :func:`frames.coalesce`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSCloseCode, web

from segtxn.protocol import frames
from segtxn.protocol.frames import Frame

log = logging.getLogger(__name__)

_MAX_COALESCED = 1000
"""Frames an outbox takes off its queue at once (and sends as few WebSocket messages)."""
HANG_UP_S = 5.0
"""How long a connection that does not read gets to take its close frame before it is cut."""


class Outbox:
    """A bounded queue of frames and the task that writes them to the socket.

    Frames may be queued before the WebSocket is prepared (a consumer's ``ConsumerReady``
    is queued when it attaches); they are written, in order, once ``start`` is called."""

    def __init__(self, ws: web.WebSocketResponse, size: int, name: str) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[Frame] = asyncio.Queue(maxsize=size)
        self._name = name
        self.task: asyncio.Task[None] | None = None
        self._hanging_up: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The socket is prepared: write what is queued and what comes."""
        self.task = asyncio.create_task(self._run(), name=f"ws-sender-{self._name}")

    def send(self, frame: Frame) -> None:
        if self._hanging_up is not None:
            return  # nothing more goes to a connection being closed
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            log.warning(
                "%s: outbound queue full; closing a connection that does not read", self._name
            )
            if self.task is not None:
                self.task.cancel()
            self._hanging_up = asyncio.create_task(self._hang_up(), name=f"ws-hang-up-{self._name}")

    async def _hang_up(self) -> None:
        """Close a connection that does not read: with a close frame if its socket takes one
        within :data:`HANG_UP_S`, else cut. Its handler then detaches what it had (a
        consumer's unacknowledged messages go to the others); the writer alone stopped, it
        stayed attached, served nothing and held them."""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(HANG_UP_S):
                await self.ws.close(
                    code=WSCloseCode.TRY_AGAIN_LATER, message=b"the connection does not read"
                )
                return
        transport = self.ws.get_extra_info("transport")
        if transport is not None:
            transport.abort()

    async def _run(self) -> None:
        while True:
            queued = [await self.queue.get()]
            while len(queued) < _MAX_COALESCED and not self.queue.empty():
                queued.append(self.queue.get_nowait())
            try:
                for frame in frames.coalesce(queued):  # runs of receipts/messages: one each
                    if not self.ws.closed:
                        await self.ws.send_bytes(frames.encode(frame))
            except ConnectionError:  # the client went away: nothing more to write
                log.info("%s: the connection closed while writing", self._name)
                return
            finally:
                for _ in queued:
                    self.queue.task_done()

    async def close(self) -> None:
        if self._hanging_up is not None:
            await asyncio.gather(self._hanging_up, return_exceptions=True)
        if self.task is None:
            return
        # flush what is queued (receipts, ack receipts) unless the socket is gone
        if not self.ws.closed and not self.task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self.queue.join()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
