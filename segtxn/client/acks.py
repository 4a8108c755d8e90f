"""A stream's acknowledgments: gathered into frames, matched to receipts, sent again.

Acknowledgments made in the same turn of the event loop (a batch acknowledged together, a
transaction's acks) travel as one ``Ack`` frame per (transaction, delivery epoch): one
request, one task on the broker, one receipt and, in a transaction, one rewrite of its acks
record, instead of one of each per message. A frame per ack, its task, its timer and its
socket write were the largest share of a consuming client's CPU (cProfile of the bench's
consume-transform-produce loop).

Each ack keeps its own deadline and its own answer:

- a refused frame refuses every ack in it. In a transaction that changes nothing (one refused
  ack already dooms the transaction, docs/transactions.md); plain acks from several calls
  refused as ``InvalidArgument`` (an id the topic never held) are sent again one call per
  frame, so only the call that named the bad id fails, and ahead of every ack gathered
  since (all made after them). Frames written before the refusal came cannot wait for
  them: a transaction's ack written meanwhile may find an earlier message not acknowledged
  (``TransactionConflict`` on an ordered subscription);
- a frame whose callers have all given up (timed out or cancelled) is not sent again after
  a reconnect; until then it is, like any unanswered ack;
- a lost connection alone fails nothing: the stream attaches again and sends the unanswered
  frames first (a topic handed to another broker keeps its acks). Only once the stream
  has reached no broker for the client's ``request_timeout_s`` (a broker restarting is back
  within it: :class:`~segtxn.client.outage.Outage`, as for a producer's sends) does every
  ack still awaited fail, at once (:meth:`Acknowledgments.lost`): nothing can answer it
  meanwhile, and waiting out its timeout kept a caller (``segtxn consume`` of a dead
  broker) 30 s for nothing. A stream that
  stops reconnecting for good (a refusal it would meet again, a broker certificate the client
  does not trust) fails them too, and every ack made after it, at once
  (:meth:`Acknowledgments.end`);
- cumulative acks are never gathered (one frame each, as they were asked);
- frames leave in the order their acks were made: only acks made one after the other with
  the same (transaction, epoch) share a frame. On an ordered subscription a transaction
  acknowledges in order (docs/protocol.md, "Ordered redelivery"): its ack of a message is
  refused while an earlier one is neither acknowledged nor held by it, so a plain ack (or
  a cumulative one) made before it must reach the broker before it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from segtxn.client.errors import ClientClosed, ConnectionLost, Timeout
from segtxn.client.messages import MessageId
from segtxn.client.timeouts import Deadline, Expiries
from segtxn.protocol.errors import ErrorCategory, InvalidArgument, ServerError
from segtxn.protocol.frames import Ack

request_ids = itertools.count(1)
"""Request ids of this process's streams: one sequence for acks, redeliveries and nacks, so
an answer names exactly one request."""

Placed = Callable[[asyncio.Future[None], str], None]
"""Called with an ack's future and a broker's URL when a frame carrying the ack is being
written to that broker (a transaction's :meth:`~segtxn.client.onestep.Placements.placed`)."""

_Key = tuple[tuple[int, int] | None, int | None]
"""What acks must share to travel in one frame: (transaction, delivery epoch)."""


@dataclass(eq=False)
class _Waiter:
    """One caller's ack: its positions, its answer, its deadline."""

    positions: list[tuple[int, int]]
    future: asyncio.Future[None]
    deadline: Deadline
    traceparent: str | None = None
    """The caller's span (tracing on): a frame carries its first ack's."""
    placed: Placed | None = None
    """In a transaction: told each time a frame carrying it is written (one-step commit)."""


@dataclass(eq=False)
class _Run:
    """Acks made one after the other that travel in one frame (in the order made)."""

    key: _Key
    cumulative: bool
    alone: bool
    """Travels alone: a cumulative ack, or one call of a refused frame sent again."""
    waiters: list[_Waiter]


@dataclass(eq=False)
class _Request:
    """One Ack frame on its way: what it carries and who waits for its answer."""

    frame: Ack
    waiters: list[_Waiter] = field(default_factory=list)
    written: bool = False
    """Written at least once: the broker may have applied it, answered or not."""

    def wanted(self) -> bool:
        return any(not waiter.future.done() for waiter in self.waiters)


class Acknowledgments:
    """The acks of one stream. The stream calls :meth:`take` before each write (and, via
    ``schedule``, once per turn in which acks were gathered), :meth:`unanswered` when it
    attaches again, and :meth:`answered` for each receipt or refusal."""

    def __init__(self, what: str, schedule: Callable[[], None]) -> None:
        """``schedule``: arrange for :meth:`take` to be called and its frames written soon
        (called once per batch, when its first ack is gathered)."""
        self._what = what
        self._schedule = schedule
        self._gathering: list[_Run] = []
        """Acks not yet taken, in the order they were made."""
        self._in_flight: dict[int, _Request] = {}
        self._expiries: Expiries[_Waiter] = Expiries(self._expire, _pending)
        self._ended: tuple[str, BaseException] | None = None
        """Why the stream stopped reconnecting, and the error it stopped with (:meth:`end`):
        an ack made since fails at once."""

    def submit(
        self,
        ids: list[MessageId],
        *,
        cumulative: bool,
        txn: tuple[int, int] | None,
        epoch: int | None,
        deadline: Deadline,
        traceparent: str | None = None,
        placed: Placed | None = None,
    ) -> asyncio.Future[None]:
        """Queue an ack; the future is done once the broker made it durable.
        ``traceparent``: the caller's span (tracing on), carried by the frame; ``placed``:
        told at each write of a frame carrying it (:meth:`placing`).

        The future fails with ServerError (refused), Timeout (OUTCOME_UNKNOWN: no receipt by
        ``deadline``; it may have been applied; it is sent again after a reconnect only
        inside a frame other acks still wait for), ConnectionLost (:meth:`lost`; at once
        after :meth:`end`) or ClientClosed.
        """
        positions = [(i.ledger_id, i.entry_id) for i in ids]
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(positions, future, deadline, traceparent, placed)
        if self._ended is not None:  # nothing will ever write it
            future.set_exception(self._connection_lost(waiter, False, *self._ended))
            return future
        self._gather(_Run((txn, epoch), cumulative, cumulative, [waiter]))
        if deadline.at is not None:
            self._expiries.add(deadline.at, waiter)
        return waiter.future

    def take(self) -> list[Ack]:
        """The frames of everything gathered, now in flight (to write, in this order)."""
        taken = []
        for run in self._gathering:
            waiters = [w for w in run.waiters if not w.future.done()]  # given up: not sent
            if waiters:
                positions = [p for w in waiters for p in w.positions]
                txn, epoch = run.key
                taken.append(self._send(positions, run.cumulative, txn, epoch, waiters))
        self._gathering.clear()
        return taken

    def _gather(self, run: _Run) -> None:
        """Queue ``run`` after everything gathered; joined to the last run when both may
        share a frame (the same key, neither alone), so the order made is the order sent."""
        if not self._gathering:
            self._schedule()
        last = self._gathering[-1] if self._gathering else None
        if last is not None and last.key == run.key and not last.alone and not run.alone:
            last.waiters += run.waiters
        else:
            self._gathering.append(run)

    def _send(
        self,
        positions: list[tuple[int, int]],
        cumulative: bool,
        txn: tuple[int, int] | None,
        epoch: int | None,
        waiters: list[_Waiter],
    ) -> Ack:
        frame = Ack(
            message_ids=positions,
            cumulative=cumulative,
            request_id=next(request_ids),
            txn=txn,
            epoch=epoch,
            traceparent=next((w.traceparent for w in waiters if w.traceparent), None),
        )
        self._in_flight[frame.request_id] = _Request(frame, waiters)
        return frame

    def placing(self, frame: Ack, broker_url: str) -> None:
        """``frame`` is being written to ``broker_url``: from now on its outcome is unknown
        until answered; tell its acks' ``placed``."""
        request = self._in_flight.get(frame.request_id)
        if request is not None:
            request.written = True
        if request is not None and frame.txn is not None:
            for waiter in request.waiters:
                if waiter.placed is not None and not waiter.future.done():
                    waiter.placed(waiter.future, broker_url)

    def unanswered(self) -> list[Ack]:
        """Frames still wanted whose answer has not come (to send again on a new attachment);
        those no caller waits for any more are forgotten."""
        for request_id, request in list(self._in_flight.items()):
            if not request.wanted():
                del self._in_flight[request_id]
        return [request.frame for request in self._in_flight.values()]

    def answered(self, request_id: int, error: ServerError | None) -> None:
        """The broker's receipt (``error`` None) or refusal of a request; unknown ids (given
        up on meanwhile) are ignored."""
        request = self._in_flight.pop(request_id, None)
        if request is None:
            return
        waiting = [waiter for waiter in request.waiters if not waiter.future.done()]
        if (
            error is not None
            and isinstance(error, InvalidArgument)
            and request.frame.txn is None
            and len(request.waiters) > 1
        ):
            # each call on its own, so only the bad one fails; before what was gathered
            # since (made after them), so the order made is still the order sent
            if waiting and not self._gathering:
                self._schedule()
            self._gathering[:0] = [_Run((None, None), False, True, [w]) for w in waiting]
            return
        for waiter in waiting:
            if error is None:
                waiter.future.set_result(None)
            else:
                waiter.future.set_exception(error)

    def pending(self) -> list[asyncio.Future[None]]:
        """The answers still awaited (gathered or in flight)."""
        waiters = [w for run in self._gathering for w in run.waiters]
        waiters += [w for request in self._in_flight.values() for w in request.waiters]
        return [waiter.future for waiter in waiters if not waiter.future.done()]

    def lost(self, broker_url: str, why: str, cause: BaseException) -> None:
        """The connection to ``broker_url`` was lost and the stream could not reach a broker
        again (``why``; ``cause``, the error of that attempt): fail every ack still awaited
        with ConnectionLost now, rather than at its deadline, since nothing can answer it
        meanwhile. One written (the broker may have applied it) is OUTCOME_UNKNOWN, one
        never written (gathered, or taken while the stream had no socket) RETRIABLE. None is
        sent again: the caller was told."""
        failing = [(w, r.written) for r in self._in_flight.values() for w in r.waiters]
        failing += [(w, False) for run in self._gathering for w in run.waiters]
        self._in_flight.clear()
        self._gathering.clear()
        lost = f"the connection to {broker_url} was lost and {why}"
        for waiter, written in failing:
            if not waiter.future.done():
                waiter.future.set_exception(self._connection_lost(waiter, written, lost, cause))

    def end(self, broker_url: str, why: str, cause: BaseException) -> None:
        """The stream stopped reconnecting for good (``why``; ``cause``, the error it
        stopped with: a refusal, a certificate not trusted): :meth:`lost`, and every ack
        made from now on fails at once with ConnectionLost (RETRIABLE: never sent), as no
        connection will ever carry it."""
        self.lost(broker_url, why, cause)
        self._ended = (f"the connection to {broker_url} was lost and {why}", cause)

    def _connection_lost(
        self, waiter: _Waiter, written: bool, lost: str, cause: BaseException
    ) -> ConnectionLost:
        what = f"acknowledgment of {len(waiter.positions)} message(s) on {self._what}"
        error = (
            ConnectionLost(
                f"{what}: no receipt: {lost}; it may or may not have been applied "
                "(acknowledging it again is harmless)",
                category=ErrorCategory.OUTCOME_UNKNOWN,
            )
            if written
            else ConnectionLost(f"{what}: not sent: {lost}", category=ErrorCategory.RETRIABLE)
        )
        error.__cause__ = cause
        return error

    def close(self) -> None:
        """Fail every ack still awaited with ClientClosed."""
        for future in self.pending():
            future.set_exception(ClientClosed("closed before the ack was confirmed"))
        self._expiries.clear()
        self._gathering.clear()
        self._in_flight.clear()

    def _expire(self, waiter: _Waiter) -> None:
        if waiter.future.done():
            return
        waiter.future.set_exception(
            Timeout(
                f"acknowledgment of {len(waiter.positions)} message(s) on {self._what}: no "
                f"receipt within {waiter.deadline}; it may or may not have been applied"
            )
        )
        for request_id, request in list(self._in_flight.items()):
            if waiter in request.waiters and not request.wanted():
                del self._in_flight[request_id]  # given up on by everyone: not sent again


def _pending(waiter: _Waiter) -> bool:
    return not waiter.future.done()
