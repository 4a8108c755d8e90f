"""A producer's sends in flight: the window of ``max_pending`` slots, the table of the
messages not yet answered (in sequence order), the ones still to write on the connection of
the moment, and each one's send timeout.

A message holds its slot from the moment it is queued until it leaves the table: answered
(a receipt or a refusal), timed out, or failed with the producer. Not until its future is
done: a caller that cancels ``send`` cancels the future, but the message goes on (written
again after a reconnect, perhaps stored), and a slot freed then let more than
``max_pending`` be in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from segtxn.aio import Window
from segtxn.client.errors import ClientError, ConnectionLost, Timeout
from segtxn.client.messages import MessageId
from segtxn.client.timeouts import Deadline, Expiries
from segtxn.client.transaction import Transaction
from segtxn.protocol.errors import ErrorCategory
from segtxn.protocol.frames import Send


@dataclass(eq=False)
class Pending:
    """One message in flight: its frame, its caller's future, its transaction."""

    send: Send
    future: asyncio.Future[MessageId]
    txn: Transaction | None = None
    tracked: asyncio.Future[Any] | None = None
    """The future ``txn`` tracks for this send (its placements are recorded under it)."""
    written: bool = False
    """Taken to be written on a connection once (it may have reached the broker)."""


class InFlight:
    """The messages of one producer that the broker has not answered yet.

    ``timed_out(seq)`` makes the error a message gets at its send timeout (it names the
    producer and its last trouble)."""

    def __init__(self, max_pending: int, timed_out: Callable[[int], BaseException]) -> None:
        self.max_pending = max_pending
        self._table: dict[int, Pending] = {}  # seq -> pending, in seq order
        self._unsent: deque[int] = deque()
        self._window = Window(max_pending)
        self._timed_out = timed_out
        self._expiries: Expiries[int] = Expiries(self._expire, self._table.__contains__)
        self._settled = asyncio.Event()
        """Set by each :meth:`settle` (what :meth:`flush` waits on)."""

    def __len__(self) -> int:
        return len(self._table)

    def take_room(self) -> bool:
        """Take a slot of the window if one is free now (True); else :meth:`room` waits.
        (Asked first for every send: a free slot costs no coroutine, no timer.)"""
        return self._window.try_acquire()

    async def room(self, deadline: Deadline, producer: str) -> None:
        """Take a slot of the window, waiting until ``deadline`` for one.

        Raises:
            Timeout: no room by ``deadline`` (retriable: nothing was sent).
        """
        if self._window.try_acquire():
            return  # there is room: no timer needed
        try:
            async with deadline.timeout():
                await self._window.acquire()
        except TimeoutError as e:
            raise Timeout(
                f"{producer}: no room to send within {deadline} "
                f"({self.max_pending} messages in flight); nothing was sent",
                category=ErrorCategory.RETRIABLE,
            ) from e

    def give_back(self) -> None:
        """A slot taken by :meth:`take_room` or :meth:`room` will not be used (the send
        was refused after it had room: nothing was queued)."""
        self._window.release()

    def add(self, pending: Pending, deadline: Deadline) -> None:
        """Queue ``pending`` (its slot taken by :meth:`room`) to be written, timed out at
        ``deadline``."""
        seq = pending.send.seq
        self._table[seq] = pending
        self._unsent.append(seq)
        if deadline.at is not None:
            self._expiries.add(deadline.at, seq)

    def send_all_again(self) -> None:
        """A new connection: every message not yet answered is written again, in order
        (the broker de-duplicates)."""
        self._unsent = deque(sorted(self._table))

    @property
    def unsent(self) -> int:
        """How many are still to write on the connection of the moment (at most)."""
        return len(self._unsent)

    def next_batch(self, max_messages: int, max_bytes: int) -> list[Pending]:
        """Take the next messages to write, in order: at most ``max_messages``, and no
        more than ``max_bytes`` of payload unless it is one message.

        One never written whose transaction has ended meanwhile (an ``abort()`` that
        stopped waiting for it, while its producer reconnected) is not: it fails with
        TransactionEnded (the broker would only refuse it; its seq is left a gap, which
        the broker's de-duplication allows). One written before is written again: it may
        have been stored, and its answer is the broker's."""
        batch: list[Pending] = []
        size = 0
        while self._unsent and len(batch) < max_messages:
            pending = self._table.get(self._unsent[0])
            if pending is None:  # already answered
                self._unsent.popleft()
                continue
            if not pending.written and pending.txn is not None and pending.txn.ended:
                self._unsent.popleft()
                try:
                    pending.txn.check_not_ended()
                except ClientError as e:
                    self.settle(pending.send.seq, error=e)
                continue
            if batch and size + len(pending.send.payload) > max_bytes:
                break
            self._unsent.popleft()
            pending.written = True
            batch.append(pending)
            size += len(pending.send.payload)
        return batch

    def settle(
        self, seq: int, *, result: MessageId | None = None, error: BaseException | None = None
    ) -> bool:
        """``seq`` was answered (``result``, or ``error``): it leaves the table and its slot
        is free; its caller's future gets the answer unless it was cancelled. Returns
        whether ``seq`` was in flight (an answer may come twice, or after a timeout)."""
        pending = self._table.pop(seq, None)
        if pending is None:
            return False
        self._window.release()
        self._settled.set()
        if not pending.future.done():  # done: its caller cancelled it, the message went on
            if error is not None:
                pending.future.set_exception(error)
            else:
                pending.future.set_result(result)  # type: ignore[arg-type]
        return True

    def fail_all(self, error: BaseException) -> None:
        """Every message in flight fails with ``error`` (the producer is closed or was
        refused for good)."""
        for seq in list(self._table):
            self.settle(seq, error=error)
        self._expiries.clear()

    def lost(self, producer: str, lost: str, cause: BaseException) -> None:
        """The producer's connection was lost and ``lost`` says why no broker will answer
        (``cause``, the error of the last attempt): every message in flight fails now
        with ConnectionLost, rather than at its send timeout, and is not sent again (its
        caller was told; its seq is left a gap, which the broker's de-duplication allows).
        One written (the broker may have stored it) is OUTCOME_UNKNOWN, one never written
        RETRIABLE."""
        for seq, pending in list(self._table.items()):
            if pending.written:
                error = ConnectionLost(
                    f"{producer}: message {seq}: no receipt: {lost}; it was sent, and may "
                    "or may not have been stored: sending it again may store it twice "
                    "(the broker de-duplicates only the producer's own re-sends)",
                    category=ErrorCategory.OUTCOME_UNKNOWN,
                )
            else:
                error = ConnectionLost(
                    f"{producer}: message {seq} was not sent: {lost}; nothing was stored: "
                    "sending it again is safe",
                    category=ErrorCategory.RETRIABLE,
                )
            error.__cause__ = cause
            self.settle(seq, error=error)
        self._unsent.clear()

    def _expire(self, seq: int) -> None:
        """The send timeout of ``seq``: it is given up (even one its caller cancelled,
        which holds its slot till now)."""
        if seq in self._table:
            self.settle(seq, error=self._timed_out(seq))

    async def flush(self, deadline: Deadline, producer: str) -> None:
        """Wait until every message in flight now is answered (or timed out): one whose
        ``send`` was cancelled too, since it goes on and may be stored.

        Raises:
            Timeout: some were not by ``deadline``.
        """
        if not self._table:
            return
        last = next(reversed(self._table))  # the table is in seq order: wait until its
        try:  # first seq is past ``last``
            async with deadline.timeout():
                while self._table and next(iter(self._table)) <= last:
                    self._settled.clear()
                    await self._settled.wait()
        except TimeoutError:
            late = sum(1 for seq in self._table if seq <= last)
            raise Timeout(f"{producer}: {late} messages still in flight after {deadline}") from None
