"""Producer order is storage order: the turns that keep a producer's sends in send order.

A producer pipelines its sends, and the broker handles each one in its own task. Some
sends wait before their ledger append — for a transaction header read from the store, for
PIP-373's topic property, for a v4 transaction's lock, for room in the write queue — and
without care a send that waits less overtakes an earlier one that waits more: the
producer's messages are stored out of sequence-id order (issue 14: sends 101..105 of one
transaction stored as 105, 101, 102, 103, 104).

So each send takes a :class:`Turn` from its producer's :class:`SendOrder` when it arrives,
in arrival (= sequence id) order. It may do its checks at once, concurrently with the
others, but it queues its ledger append only after the previous send of that producer has
queued its own, or given up. The managed ledger writes its queue in order
(:meth:`~segtxn.ledger.ManagedLedger.enqueue`), so positions follow sequence ids. Only the
queueing is ordered: the writes themselves share group commits, and durability is awaited
concurrently.

The order lives in the producer's de-duplication state (one per producer name and topic),
so it outlives a connection: after a reconnect, new sends queue behind the old
connection's sends that are still in flight.

Rules for a holder of a turn:

- release it once the append is queued, or at once when the send will not append (a
  duplicate, a refusal, a failure): a turn that is never released stalls the producer;
- wait for it before taking any lock another send of the same producer may need (a later
  send holding a lock while it waits for an earlier one's turn would deadlock).

Waiting costs nothing when the previous send has already queued its append, which is the
plain path: nothing there waits before the append.
"""

from __future__ import annotations

import asyncio

from segtxn.ledger import ManagedLedger, Position


class Turn:
    """One send's place in its producer's order (take it with :meth:`SendOrder.take`)."""

    __slots__ = ("_mine", "_previous")

    def __init__(self, previous: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
        self._previous = previous
        self._mine = mine

    async def wait(self) -> None:
        """Return once every earlier send of the producer has queued its append or given up.

        Cancelling the waiter leaves the earlier sends alone."""
        previous = self._previous
        if previous is not None and not previous.done():
            await asyncio.shield(previous)

    def release(self) -> None:
        """This send has queued its append, or will not append: the next send may go once
        every earlier one has gone too (a send that gives up early never lets a later one
        overtake an earlier one). Idempotent."""
        if self._mine.done():
            return
        previous = self._previous
        if previous is None or previous.done():
            self._mine.set_result(None)
        else:
            previous.add_done_callback(self._pass_on)

    def _pass_on(self, _: asyncio.Future[None]) -> None:
        if not self._mine.done():
            self._mine.set_result(None)

    async def enqueue(self, ledger: ManagedLedger, payload: bytes) -> asyncio.Future[Position]:
        """Wait for this turn, queue ``payload`` on ``ledger``, and pass the turn on
        (whether or not the ledger took the entry).

        Returns:
            The entry's position, once it is durable (see ``ManagedLedger.enqueue``).
        """
        await self.wait()
        try:
            return await ledger.enqueue(payload)
        finally:
            self.release()

    def enqueue_now(self, ledger: ManagedLedger, payload: bytes) -> asyncio.Future[Position] | None:
        """:meth:`enqueue` where nothing needs waiting for (this turn has come, and the
        ledger has room): a plain call, no coroutine per send. None: it would wait, and
        nothing was queued nor released; call :meth:`enqueue` then.

        Raises what ``ledger.enqueue`` raises (the turn is passed on then)."""
        previous = self._previous
        if previous is not None and not previous.done():
            return None
        try:
            queued = ledger.enqueue_now(payload)
        except BaseException:
            self.release()
            raise
        if queued is not None:
            self.release()
        return queued


class SendOrder:
    """The chain of turns of one producer name on one topic."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None
        """Released when the most recently taken turn is (None: no turn taken yet)."""

    def take(self) -> Turn:
        """The next turn: call once per send, in the order the sends arrive."""
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turn = Turn(self._last, mine)
        self._last = mine
        return turn

    @property
    def idle(self) -> bool:
        """No send of this producer is waiting to queue its append."""
        return self._last is None or self._last.done()
