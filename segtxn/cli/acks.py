"""``segtxn consume``'s acknowledgments in flight: a bounded number at once, each counted
as its answer comes.

``consume`` awaited each acknowledgment's answer before it received the next message: a
round trip per message, about 1,400 msg/s on a memory standalone and 300 on etcd, against
7-9k msg/s for ``produce``. :class:`Acks` lets up to :data:`ACKS_IN_FLIGHT` of them await
their answers while it receives on (acks queued together travel in one frame, and the
broker saves them in one cursor write), and keeps what the one-at-a-time loop promised:

- a message is counted as received at once, and is *in doubt* until its acknowledgment is
  answered: a stop then (Ctrl-C) leaves it unknown whether the broker applied it. So the
  counts are exact at any moment: received = acknowledged + unacknowledged + in doubt;
- an acknowledgment that failed is counted unacknowledged (of unknown outcome when it got
  no answer); one refused for good (not retriable), or failures that go on for longer than
  the outage limit with none answered well between, stop the command with that error;
- the command stops (and ends) only once every acknowledgment in flight is answered (each
  within the client's operation timeout), so only an interrupt leaves any in doubt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from segtxn.cli.errors import describe
from segtxn.client import ConnectionLost, ErrorCategory, ServerError, Timeout

__all__ = ["ACKS_IN_FLIGHT", "Acks"]

T = TypeVar("T")

ACKS_IN_FLIGHT = 256
"""At most this many acknowledgments await their answers at once; with that many, the next
message is received once one of them is answered. It bounds what an interrupt leaves in
doubt (and what the client holds for them). ``consume --help`` says the number."""


class Acks:
    """The acknowledgments of one ``consume``: how many messages were received, and what
    became of their acknowledgments.

    Args:
        outage_limit_s: acknowledgments that keep failing (retriably) for longer than this
            with none answered well between stop the command (the client's operation
            timeout: an outage it cannot ride out).
        limit: at most this many in flight at once.
        clock: the clock the outage is measured on (seconds).
    """

    def __init__(
        self,
        outage_limit_s: float,
        *,
        limit: int = ACKS_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.received = 0
        self.acknowledged = 0
        self.unacknowledged = 0
        """Acknowledgments that failed (the message may be delivered again)."""
        self.unknown = 0
        """Of ``unacknowledged``, those that got no answer (timed out, or the connection
        was lost after they were written): the broker may have applied them."""
        self._outage_limit_s = outage_limit_s
        self._limit = limit
        self._clock = clock
        self._in_flight = 0
        self._answer = asyncio.Event()
        """Set at each answer: a wait for room, or for the last answer, looks again."""
        self._failing_since: float | None = None
        """When the acknowledgments that failed since the last one answered well began."""
        self._failure: BaseException | None = None
        self._stopped = asyncio.Event()

    @property
    def in_doubt(self) -> int:
        """Messages received whose acknowledgment has no answer yet (or was never sent)."""
        return self.received - self.acknowledged - self.unacknowledged

    def took(self) -> None:
        """One more message received: in doubt until its acknowledgment is answered."""
        self.received += 1

    def add(self, ack: asyncio.Future[None]) -> None:
        """Count ``ack`` (a taken message's acknowledgment) in flight until it is answered."""
        self._in_flight += 1
        ack.add_done_callback(self._answered)

    async def room(self) -> None:
        """Return once fewer than the limit are in flight.

        Raises:
            the error that stops the command (an acknowledgment refused for good, or
            failing for longer than the outage limit), once one was answered so.
        """
        while True:
            if self._failure is not None:
                raise self._failure
            if self._in_flight < self._limit:
                return
            await self._next_answer()

    async def unless_stopped(self, receiving: Awaitable[T]) -> T:
        """``receiving``'s result, or (when acknowledgments are in flight and one is
        answered with an error that stops the command first) that error, ``receiving``
        then cancelled: a consumer waiting long (``--idle-timeout``) for a message stops
        as soon as the one-at-a-time loop did, at the failing acknowledgment."""
        if not self._in_flight:  # nothing can stop it meanwhile: no task to race
            return await receiving
        waiting = asyncio.ensure_future(receiving)
        stopping = asyncio.create_task(self._stopped.wait(), name="consume-ack-failure")
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not waiting.done():
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
        if waiting.cancelled() and self._failure is not None:  # (its message, if it took
            raise self._failure  # one, is not counted: it was not acknowledged)
        return waiting.result()

    async def settled(self) -> None:
        """Return once every acknowledgment in flight is answered (each within the
        client's operation timeout).

        Raises:
            the error that stops the command, if one was answered so.
        """
        await self.drained()
        if self._failure is not None:
            raise self._failure

    async def drained(self) -> None:
        """Return once every acknowledgment in flight is answered (and counted)."""
        while self._in_flight:
            await self._next_answer()

    async def _next_answer(self) -> None:
        self._answer.clear()
        await self._answer.wait()

    def _answered(self, ack: asyncio.Future[None]) -> None:
        self._in_flight -= 1
        self._answer.set()
        if ack.cancelled():  # no answer will come: in doubt
            return
        error = ack.exception()  # (retrieved: not logged as never retrieved)
        if error is None:
            self.acknowledged += 1
            self._failing_since = None
        elif isinstance(error, ServerError) and not error.retriable:
            self.unacknowledged += 1  # refused for good (not authorized, ...): not applied
            self._stop(error)
        elif isinstance(error, ServerError | Timeout | ConnectionLost):
            self._failed(error)
        else:  # the consumer closed under it (ClientClosed): applied or not, unknown
            self._stop(error)

    def _failed(self, error: ServerError | Timeout | ConnectionLost) -> None:
        """Count a failed acknowledgment (of unknown outcome, if it says so); stop once
        they have failed for longer than the outage limit without one answered well."""
        self.unacknowledged += 1
        if error.category is ErrorCategory.OUTCOME_UNKNOWN:
            self.unknown += 1
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since > self._outage_limit_s:
            self._stop(error)
        if self.unacknowledged == 1:
            click.echo(
                f"Warning: an acknowledgment failed ({describe(error)}); going on: a "
                "message whose acknowledgment failed may be delivered again",
                err=True,
            )

    def _stop(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
            self._stopped.set()
