"""A connection's outbox (segtxn/broker/outbox.py): what is queued while a write is in
flight goes out after it, in order, coalesced; ``close`` returns once everything queued is
written, and at once when the socket went away. (A queue that overflows hangs up:
tests/broker/test_delivery_edges.py.)"""

from __future__ import annotations

import asyncio

from segtxn.broker.outbox import Outbox
from segtxn.protocol import frames
from segtxn.protocol.frames import Receipt


class _Socket:
    """aiohttp's WebSocketResponse as far as an outbox uses it; its first write waits for
    :attr:`release`."""

    closed = False

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[bytes] = []
        self.writing = asyncio.Event()
        self.release = asyncio.Event()
        self.fail = fail

    async def send_bytes(self, data: bytes) -> None:
        if not self.sent and not self.writing.is_set():
            self.writing.set()
            await self.release.wait()
        if self.fail:
            raise ConnectionResetError("gone")
        self.sent.append(data)


def receipts(data: list[bytes]) -> list[int]:
    decoded = [frames.server_frame.decode(d) for d in data]
    return [f.seq for frame in decoded for f in frames.unbatch(frame) if isinstance(f, Receipt)]


async def test_what_is_queued_during_a_write_follows_it_in_order_and_close_waits_for_it() -> None:
    socket = _Socket()
    outbox = Outbox(socket, 100, "test")  # type: ignore[arg-type]
    outbox.start()
    outbox.send(Receipt(seq=0, message_id=(1, 0)))
    await socket.writing.wait()  # the first write is in flight
    for seq in range(1, 30):
        outbox.send(Receipt(seq=seq, message_id=(1, seq)))
    closing = asyncio.create_task(outbox.close())
    await asyncio.sleep(0)  # sleep-ok: one turn, in which close must not have ended
    assert not closing.done()
    socket.release.set()
    await asyncio.wait_for(closing, timeout=5)
    assert receipts(socket.sent) == list(range(30))
    assert len(socket.sent) == 2  # the first alone, the 29 queued behind it as one


async def test_close_returns_at_once_when_the_socket_went_away_with_frames_queued() -> None:
    socket = _Socket(fail=True)
    outbox = Outbox(socket, 100, "test")  # type: ignore[arg-type]
    outbox.start()
    outbox.send(Receipt(seq=0, message_id=(1, 0)))
    await socket.writing.wait()
    outbox.send(Receipt(seq=1, message_id=(1, 1)))
    socket.release.set()
    await asyncio.wait_for(outbox.close(), timeout=1)  # not the 5 s flush limit
    assert socket.sent == []
