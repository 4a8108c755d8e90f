"""The broker-wide publish buffer: the payload bytes of sends read from producer
connections and not yet answered, bounded over all of them
(``BrokerSettings.max_publish_buffer_bytes``, ``segtxn broker --publish-buffer-size``).

Why: each producer connection reads up to ``max_pending_sends`` sends before it stops
reading its socket, each up to ``max_message_bytes``, and a ledger bounds only its own write
queue (sends waiting for room in it hold their payloads meanwhile). Many producers, or a
client opening many producer connections, could make a broker hold memory without bound and
die of it, stalling every topic it serves. Pulsar bounds the same thing broker-wide
(``maxMessagePublishBufferSizeInMB``: reading from producer connections pauses while the
buffer is full), Kafka with ``queued.max.request.bytes``.

The contract (segtxn/broker/producer_endpoint.py keeps it):

- a send takes its payload's bytes (:meth:`PublishBudget.cost`) **before it takes its
  turn**, and gives them back when it is answered (stored, refused or failed, cancelled
  included: a byte never given back would stall the broker for ever);
- while there is no room, its connection stops reading frames (backpressure through TCP, as
  its own window of sends does); connections waiting are served **first come, first
  served** (a later one, even a small one, never overtakes: none starves);
- a send in flight never needs more room to finish: a ``send_batch`` starts the sends it
  has taken in before it waits for room (they give it back); ``commit`` frames take none;
  and a one-step commit waiting for sends still to come (after it on its connection, or on
  another) does not hold back the op records of those in flight while a connection waits
  here (``on_wait``, :attr:`PublishBudget.full`: :meth:`Commits.wait_counted
  <segtxn.broker.txn.commits.Commits.wait_counted>`). It did: they held the room the later
  sends waited for, and the commit was answered "not here" after its 2 s wait;
- the limit is at least the largest message (a start-up error otherwise,
  :class:`~segtxn.broker.settings.BrokerSettings`): every send the broker accepts fits in
  an empty buffer. A payload larger than that (refused ``MessageTooLarge`` in its turn, up
  to the frame limit) costs the whole buffer, never more: it waits for the buffer to empty.

What it does not count: the key, properties and frame overhead of each send (at most
64 KiB beside its payload), and the one frame each waiting connection has read and waits
with (up to the WebSocket frame limit): the memory held is at most the limit plus one frame
per producer connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from segtxn.exposition import Count

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
"""A connection that has to wait for room is logged (INFO) at most this often: a full buffer
under load would otherwise log every send."""


class PublishBudget:
    """``limit`` bytes, taken with :meth:`take` (or :meth:`try_take`) and given back with
    :meth:`give_back`, first come first served; one per broker service.

    A waiter cancelled while it waits takes nothing; one cancelled as it is handed its room
    gives it back (as ``asyncio.Semaphore`` and :class:`segtxn.aio.Window` do)."""

    __slots__ = ("_in_use", "_logged_at", "_on_wait", "_waiters", "_waits", "limit")

    def __init__(
        self,
        limit: int,
        waits: Count | None = None,
        *,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        """``waits`` counts the times a connection had to wait for room; ``on_wait`` is
        called as each begins to wait (:attr:`full` is true then)."""
        if limit < 1:
            raise ValueError(f"a publish buffer needs at least one byte, not {limit}")
        self.limit = limit
        self._in_use = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._logged_at = -LOG_EVERY_S
        self._waits = waits if waits is not None else Count()
        self._on_wait = on_wait

    @property
    def in_use(self) -> int:
        """Bytes taken and not given back."""
        return self._in_use

    @property
    def full(self) -> bool:
        """A connection waits for room: the sends it has read are held back."""
        return bool(self._waiters)

    @property
    def waiting(self) -> int:
        """Connections waiting for room now (each waits for one send at a time)."""
        return sum(1 for _, waiter in self._waiters if not waiter.done())

    def cost(self, payload_bytes: int) -> int:
        """What a send of ``payload_bytes`` takes: its size, or the whole buffer for a
        payload larger than it (refused anyway: see the module docstring)."""
        return min(payload_bytes, self.limit)

    def try_take(self, nbytes: int) -> bool:
        """Take ``nbytes`` if there is room and nobody waits; whether it did (never waits)."""
        self._check(nbytes)
        if self._waiters or self._in_use + nbytes > self.limit:
            return False
        self._in_use += nbytes
        return True

    async def take(self, nbytes: int) -> None:
        """Take ``nbytes``, waiting behind the connections that wait already.

        Raises:
            ValueError: more than the limit (ask for :meth:`cost`).
        """
        if self.try_take(nbytes):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((nbytes, waiter))
        self._waits.add(1)
        self._note_wait()
        if self._on_wait is not None:
            self._on_wait()
        try:
            await waiter
        except asyncio.CancelledError:
            if not waiter.cancelled():
                self.give_back(nbytes)  # handed its room as it was cancelled: passed on
            else:
                self._drop(waiter)
                self._wake()  # it may have been first, holding up those behind it
            raise

    def give_back(self, nbytes: int) -> None:
        """Give back what one :meth:`take` or :meth:`try_take` took (or several, summed):
        to the first waiters, in order, as long as each fits."""
        if not 0 <= nbytes <= self._in_use:
            raise ValueError(f"giving back {nbytes} bytes, {self._in_use} taken")
        self._in_use -= nbytes
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            nbytes, waiter = self._waiters[0]
            if waiter.done():  # cancelled meanwhile
                self._waiters.popleft()
                continue
            if self._in_use + nbytes > self.limit:
                return
            self._waiters.popleft()
            self._in_use += nbytes
            waiter.set_result(None)

    def _drop(self, waiter: asyncio.Future[None]) -> None:
        for i, (_, queued) in enumerate(self._waiters):
            if queued is waiter:
                del self._waiters[i]
                return

    def _check(self, nbytes: int) -> None:
        if not 0 <= nbytes <= self.limit:
            raise ValueError(f"{nbytes} bytes: a send takes 0 to at most the limit, {self.limit}")

    def _note_wait(self) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            return
        self._logged_at = now
        log.info(
            "publish buffer full: %d of %d bytes held by sends in flight; producer "
            "connections wait for room, their sockets unread (%d waiting; logged at most "
            "once a minute)",
            self._in_use, self.limit, self.waiting,
        )  # fmt: skip
