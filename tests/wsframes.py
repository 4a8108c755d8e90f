"""Reading a broker's frames on a raw WebSocket, as tests that speak the protocol by hand do.

A broker sends consecutive receipts or messages together (``ReceiptBatch``,
``MessageBatch``); :func:`next_frame` hands them out one by one, as the client does, so a
test reads the frames the broker meant, whatever travelled together."""

from __future__ import annotations

import weakref
from collections import deque

import aiohttp

from segtxn.protocol import frames

_unread: weakref.WeakKeyDictionary[aiohttp.ClientWebSocketResponse, deque[frames.Frame]] = (
    weakref.WeakKeyDictionary()
)


async def next_frame(ws: aiohttp.ClientWebSocketResponse, timeout_s: float = 10) -> frames.Frame:
    """The next server frame on ``ws`` within ``timeout_s``; fails on anything but a frame."""
    unread = _unread.setdefault(ws, deque())
    if not unread:
        message = await ws.receive(timeout=timeout_s)
        assert message.type is aiohttp.WSMsgType.BINARY, (
            f"expected a frame, got {message.type!r} {message.data!r} {message.extra!r}"
        )
        unread.extend(frames.unbatch(frames.server_frame.decode(message.data)))
    return unread.popleft()
