"""A WebSocket connection's outbound side: a bounded queue of frames and one task that
writes them, so slow sockets never block a dispatcher. What is queued while it writes goes
out together (runs of receipts or messages as one batch frame: :func:`frames.coalesce`).
"""

from __future__ import annotations

import asyncio
import collections
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
    is queued when it attaches); they are written, in order, once ``start`` is called.

    The queue is a deque and an event, not an ``asyncio.Queue``: every frame a broker sends
    (each message, receipt, ack receipt) passes through here, and the queue's put, get and
    ``task_done`` cost about 1 µs a frame against 0.2 (timeit, 100,000 frames)."""

    def __init__(self, ws: web.WebSocketResponse, size: int, name: str) -> None:
        self.ws = ws
        self._size = size
        self._queued: collections.deque[Frame] = collections.deque()
        self._wake = asyncio.Event()
        self._written = asyncio.Event()
        """Set while nothing queued is left unwritten (or the writer stopped for good)."""
        self._written.set()
        self._name = name
        self.task: asyncio.Task[None] | None = None
        self._hanging_up: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The socket is prepared: write what is queued and what comes."""
        self.task = asyncio.create_task(self._run(), name=f"ws-sender-{self._name}")

    def send(self, frame: Frame) -> None:
        if self._hanging_up is not None:
            return  # nothing more goes to a connection being closed
        if len(self._queued) >= self._size:
            log.warning(
                "%s: outbound queue full; closing a connection that does not read", self._name
            )
            if self.task is not None:
                self.task.cancel()
            self._hanging_up = asyncio.create_task(self._hang_up(), name=f"ws-hang-up-{self._name}")
            return
        self._queued.append(frame)
        self._written.clear()
        self._wake.set()

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
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queued:
                    count = min(len(self._queued), _MAX_COALESCED)
                    queued = [self._queued.popleft() for _ in range(count)]
                    try:
                        for frame in frames.coalesce(queued):  # runs of receipts/messages
                            if not self.ws.closed:
                                await self.ws.send_bytes(frames.encode(frame))
                    except ConnectionError:  # the client went away: nothing more to write
                        log.info("%s: the connection closed while writing", self._name)
                        return
                self._written.set()
        finally:
            self._written.set()  # (stopped: what is left is never written)

    async def close(self) -> None:
        if self._hanging_up is not None:
            await asyncio.gather(self._hanging_up, return_exceptions=True)
        if self.task is None:
            return
        # flush what is queued (receipts, ack receipts) unless the socket is gone
        if not self.ws.closed and not self.task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self._written.wait()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
