"""Transactions, the Pythonic way.

```python
async with client.transaction(timeout_s=30) as txn:
    await producer.send(b"derived", key="k", txn=txn)
    await consumer.acknowledge(message, txn=txn)
# committed here; an exception inside the block aborts instead
```

Sends and acks in a transaction are tracked: ``commit`` first waits for every one of them
(one still opening the transaction, registering its topic, or waiting for room in its
producer's window included: counted from its call).
If any failed, the transaction is *poisoned*: ``commit`` aborts it and raises
:class:`TransactionFailed` (a transaction is all or nothing, so one lost message means none
may count). That includes a send or ack refused before it left (a bad argument, a topic
that cannot take part, no room in time): an application that caught the error and went on
would otherwise commit the rest without it. One whose caller cancelled it (the task
awaiting it was cancelled) poisons it too, with :class:`OperationCancelled`: it may have
reached the broker and been applied, and a commit would then count what the application
believes it cancelled. A transaction whose timeout passes is aborted by its coordinator;
committing it then fails with ``InvalidTxnStatus``.

When a transaction does not commit (it is aborted, its commit is refused, or ending it fails
with an unknown outcome), every consumer that acknowledged messages in it asks the broker to
deliver its unacknowledged messages again, from the earliest, once the transaction has let
go of them; until then it hands the application nothing newer from those topics. So after
``abort()`` returns, the next messages an ordered consumer receives start with the ones
the transaction had acknowledged, as if the consumer had sought back (Kafka's consumer does
this by hand after an abort).

**Pipelined transactions.** A loop that commits each batch before it receives the next
waits a whole commit per batch. ``client.transaction(after=previous)`` lets it work on the
next batch while the previous one commits (``asyncio.create_task(previous.commit())``):
the new transaction starts once the previous one's sends and acks are done, and its commit
waits for the previous one to end. Only if that one COMMITTED does this one commit;
otherwise it is aborted too (TransactionFailed from PrecedingNotCommitted), so what a chain
of them wrote counts in order or not at all: had the first aborted while the second
committed, the first's inputs, delivered again, would be processed again after the
second's outputs were already out.

This module is a transaction's end: ``commit``, ``abort``, leaving ``async with``, its
client's close. How it starts, its states, and how its sends and acks join it (the half
they call): :mod:`segtxn.client.txnjoining`. Finding the coordinators, failing over
between them and pre-starting transactions: :mod:`segtxn.client.coordinators`. Its
operations in flight, their failures and whom to tell when it does not commit:
:mod:`segtxn.client.txnoperations`. How a send or an acknowledgment poisons the
transaction it is in: :mod:`segtxn.client.poisoning`; a v4 transaction's ADD_PARTITION and
ADD_SUBSCRIPTION calls: :mod:`segtxn.client.registrations`. Tracing on, a transaction is a
span whose children are its NEW_TXN, sends, acks and END_TXN (docs/tracing.md).

Time limits: ``start``, ``commit``, ``abort`` and ``status`` each end within the client's
operation timeout (or their ``timeout_s``), coordinator fail-over included; a registration
made by a send or an acknowledgment ends within that call's own limit. A commit that times
out before END_TXN was sent raises ``Timeout`` (ABORTABLE: it did not commit); one that
times out after raises ``Timeout`` (OUTCOME_UNKNOWN: ``commit()`` may be called again).
A v5 transaction whose operations all went to one broker is committed by that broker
(:mod:`segtxn.client.onestep`), with END_TXN's outcome and errors.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from segtxn.client.coordinators import Coordinators
from segtxn.client.errors import ClientError, Timeout
from segtxn.client.onestep import Answer, Placements, commit_at
from segtxn.client.timeouts import Deadline
from segtxn.client.txnjoining import Joinable
from segtxn.client.txnstates import (
    OutcomeUnknown,
    PrecedingNotCommitted,
    TransactionEnded,
    TransactionFailed,
    TransactionState,
)
from segtxn.protocol.errors import InvalidTxnStatus, ServerError, TransactionNotFound
from segtxn.protocol.txn import TxnAction

__all__ = [
    "OutcomeUnknown",
    "PrecedingNotCommitted",
    "Transaction",
    "TransactionEnded",
    "TransactionFailed",
    "TransactionState",
]

log = logging.getLogger(__name__)


class Transaction(Joinable):
    """One transaction. Get it from ``client.transaction()``; use it as an async context
    manager, or call ``commit()`` / ``abort()`` yourself.

    This class is its end (commit, abort, leaving ``async with``, its client's close); what
    its sends and acknowledgments call to join it (its start and state included) is in
    :class:`~segtxn.client.txnjoining.Joinable`, which it extends."""

    def __init__(
        self,
        coordinators: Coordinators,
        timeout_s: float,
        *,
        one_step: bool = False,
        after: Transaction | None = None,
    ) -> None:
        """``timeout_s``: its lifetime at the coordinator (NEW_TXN's); ``one_step``: commit
        a v5 transaction whose operations all went to one broker at that broker;
        ``after``: the transaction this one follows (see the module docstring)."""
        super().__init__(coordinators, timeout_s, one_step=one_step, after=after)
        self.committed_by: str | None = None
        """Once COMMITTED, who confirmed it: ``"broker"`` (the one-step commit) or
        ``"coordinator"`` (END_TXN); None before, or when it committed nothing."""
        self._asked_to_commit = "coordinator"
        """Who was last asked to commit it: when that answer is lost and an abort is then
        refused, it is who committed it."""

    async def commit(self, *, timeout_s: float | None = None) -> None:
        """Wait for the transaction's operations, then END_TXN(COMMIT), all within
        ``timeout_s`` (default: the client's operation timeout). With the one-step commit
        (a v5 transaction whose operations all went to one broker), that broker is asked
        to commit it first, without waiting for them; the outcome and errors are the same.

        Committing a committed transaction again does nothing (as aborting an aborted one
        does: a retried commit is told it committed, not to abort); an aborted one cannot
        be committed.

        Raises:
            TransactionEnded: it was aborted (ClientClosed: by its client's close).
            TransactionFailed: an operation failed, or was cancelled by its caller
                (``__cause__`` is then OperationCancelled); the transaction was aborted.
            ServerError(InvalidTxnStatus): it timed out (or was aborted) first.
            Timeout: ABORTABLE when its operations were not done in time (it was not
                committed: abort it, or its coordinator will after its timeout);
                OUTCOME_UNKNOWN when END_TXN got no answer (``commit()`` may be repeated).
        """
        if self.state is TransactionState.COMMITTED:
            return
        deadline = self._deadline(timeout_s)
        if self.state is TransactionState.NEW and not await self.operations.settle(deadline):
            raise self.operations.late(deadline)  # a send or ack is starting it, not in time
        if self.state is TransactionState.NEW:  # nothing reached a coordinator or broker
            if self.operations.failure is not None:  # but one was refused before it started
                self._move(TransactionState.ABORTED)
                raise TransactionFailed(
                    "the transaction (never started) was not committed: an operation in it failed",
                    failure=self.operations.failure,
                ) from self.operations.failure
            self._move(TransactionState.COMMITTED)
            return
        self._check_open(TransactionState.COMMITTING)  # an unknown outcome: commit again
        await self._follow(deadline)
        answer = Answer.NOT_HERE
        placements = self.placements  # (None: v4, or the one-step commit is off)
        if (
            placements is not None
            and self.state is TransactionState.OPEN
            and self.operations.failure is None
        ):
            answer = await self._commit_at_broker(placements, deadline)
            if answer is Answer.COMMITTED:
                return
        if not await self.operations.settle(deadline):
            if answer is Answer.UNKNOWN:  # the broker may have committed it: not poisoned
                raise Timeout(
                    f"transaction {self._id}: no answer from its broker's commit, and "
                    f"{len(self.operations.in_flight)} operations not done within "
                    f"{deadline}: it may have committed (commit() may be called again)"
                )
            raise self.operations.late(deadline)
        if self.operations.failure is not None:
            if await self._abort_failed(deadline):
                return  # the broker's one-step commit had landed
            raise TransactionFailed(
                f"transaction {self._id} aborted: an operation in it failed",
                failure=self.operations.failure,
            ) from self.operations.failure
        asked_before = self.state is TransactionState.COMMITTING  # its answer was lost
        self._move(TransactionState.COMMITTING)
        self._asked_to_commit = "coordinator"
        try:
            await self._end(TxnAction.COMMIT, deadline)
        except BaseException as e:
            if isinstance(e, TransactionNotFound) and asked_before:
                # collected after it ended, committed or not: no answer tells which any more
                await self.operations.failed()
                raise OutcomeUnknown(
                    f"transaction {self._id}: its commit was asked again after its record "
                    "was collected; whether it committed is unknown"
                ) from e
            if isinstance(e, InvalidTxnStatus | TransactionNotFound):
                self._move(TransactionState.ABORTED)
                self._span_ends(e)
            await self.operations.failed()  # aborted, or unknown: commit() may be called again
            raise
        self.committed_by = "coordinator"
        self.operations.committed()

    async def _follow(self, deadline: Deadline) -> None:
        """Before anything is asked to commit it: wait, for at most half of what is left
        until ``deadline`` (the rest is for aborting it), for the transaction it follows to
        end. Unless that one COMMITTED, this one is poisoned with PrecedingNotCommitted (so
        the commit goes on to abort it)."""
        after = self.after
        if after is None:
            return
        remaining = deadline.remaining()
        wait = deadline if remaining is None else Deadline(remaining / 2)
        ended = await after.wait_ended(wait)
        self.after = None  # (known now: let it go)
        if after.state is TransactionState.COMMITTED:
            return
        how = "was aborted" if ended else f"had not ended within {wait}"
        self.operations.poison(
            PrecedingNotCommitted(
                f"transaction {self._id} follows transaction {after._id}, which {how}: "
                "it is aborted too, so that nothing it wrote or acknowledged counts before "
                "what that one did"
            )
        )

    async def _commit_at_broker(self, placements: Placements, deadline: Deadline) -> Answer:
        """The one-step commit if eligible (nothing failed, each operation placed or settled
        by ``deadline``, all placed on one broker), else NOT_HERE (still OPEN).
        COMMITTED once its operations are done or ``deadline`` passed, whatever they say.
        Raises InvalidTxnStatus / TransactionNotFound (it is ABORTED), ClientClosed."""
        if self.operations.failure is not None or not await placements.wait(deadline):
            return Answer.NOT_HERE  # (not placed in time: commit() finds them late)
        broker = placements.broker()
        if broker is None or self.operations.failure is not None:
            return Answer.NOT_HERE
        self._move(TransactionState.COMMITTING)
        self._asked_to_commit = "broker"
        call = commit_at(self._coordinators.connector, placements, broker, self.id, deadline)
        traced = {"segtxn.txn.id": str(self.id), "segtxn.txn.action": "COMMIT"}
        try:
            answer = await self._traced("end-txn", call, {**traced, "segtxn.txn.broker": broker})
        except (InvalidTxnStatus, TransactionNotFound) as e:
            self._move(TransactionState.ABORTED)
            self._span_ends(e)
            await self.operations.failed()
            raise
        if answer is Answer.COMMITTED:
            await self.operations.settle(deadline)  # their futures done as commit() returns
            self._committed("broker")
        elif answer is Answer.NOT_HERE:
            self._move(TransactionState.OPEN)  # nothing was decided
        return answer

    async def _abort_failed(self, deadline: Deadline) -> bool:
        """END_TXN(ABORT) after a failed operation or on ``abort()``; True if refused
        because a commit whose answer was lost had landed (the coordinator says COMMITTED).
        Raises what END_TXN raised, or Timeout (OUTCOME_UNKNOWN): the state was unreadable
        then."""
        try:
            await self._end(TxnAction.ABORT, deadline)
        except InvalidTxnStatus as e:
            if self.state is TransactionState.COMMITTING:  # a commit was asked for
                try:
                    committed = await self.status(timeout_s=deadline.cap(None)) == "COMMITTED"
                except (ServerError, ClientError) as unread:
                    raise Timeout(
                        f"transaction {self._id}: its abort was refused ({e}) and its state "
                        "could not be read: whether it committed is unknown"
                    ) from unread
                if committed:
                    self._committed(self._asked_to_commit)
                    return True
            raise
        finally:
            if self.state is not TransactionState.COMMITTED:
                await self.operations.failed()
        return False

    def _committed(self, by: str) -> None:
        self._move(TransactionState.COMMITTED)
        self.committed_by = by
        self.operations.committed()
        self._span_ends()

    async def abort(self, *, timeout_s: float | None = None) -> None:
        """END_TXN(ABORT); nothing the transaction wrote or acknowledged will count. Waits
        for its operations in flight for at most half of ``timeout_s`` (default: the
        client's operation timeout), then aborts in what is left.

        Aborting an aborted transaction again does nothing; a committed one cannot be.

        Raises:
            Timeout: no coordinator answered in time (RETRIABLE: abort again; its
                coordinator aborts it after its timeout anyway).
            ClientError: it was committed (what it wrote and acknowledged counts).
        """
        deadline = self._deadline(timeout_s)
        if self.state is TransactionState.COMMITTED:
            raise ClientError(
                f"transaction {self._id} is COMMITTED: it cannot be aborted (what it wrote "
                "and acknowledged counts)"
            )
        if self.state is TransactionState.ABORTED:
            return
        remaining = deadline.remaining()  # (in NEW, a send or ack may be starting it:)
        await self.operations.settle(Deadline(None if remaining is None else remaining / 2))
        if self.state is TransactionState.NEW:  # (one starting it late aborts what opens)
            self._move(TransactionState.ABORTED)
            return
        if await self._abort_failed(deadline):  # a commit whose answer was lost had landed
            raise ClientError(
                f"transaction {self._id} is COMMITTED (its commit, whose answer was lost, had "
                "landed): it cannot be aborted (what it wrote and acknowledged counts)"
            )

    async def _end(self, action: TxnAction, deadline: Deadline) -> None:
        """END_TXN at the coordinator; the transaction is then COMMITTED or ABORTED."""
        await self._traced(
            "end-txn",
            self._coordinators.end(self.id, action, deadline, self._opened_at),
            {"segtxn.txn.id": str(self.id), "segtxn.txn.action": action.value},
        )
        self._move(
            TransactionState.COMMITTED if action is TxnAction.COMMIT else TransactionState.ABORTED
        )
        self._span_ends()

    async def status(self, *, timeout_s: float | None = None) -> str:
        """The coordinator's state of the transaction (OPEN, COMMITTED, ABORTED, ...).

        Raises ServerError (TransactionNotFound), Timeout (RETRIABLE), or ClientError as
        :attr:`id` does (not started; or ended with nothing in it: no coordinator knows it,
        ``state`` says how it ended)."""
        reply = await self._coordinators.call(
            "GET", f"/txn/v2/{self.id}", deadline=self._deadline(timeout_s)
        )
        return str(reply["state"])

    async def __aenter__(self) -> Transaction:
        return self  # started by its first send or acknowledgment (v4 or v5 by topic)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state not in (TransactionState.NEW, TransactionState.OPEN) and not self.opening:
            if exc is None and self._closed_by_client:  # not by the block: it must not
                self._check_open()  # look committed (raises ClientClosed)
            return  # ended explicitly inside the block
        # (NEW, nothing in it: it commits or aborts as any other, so that what is done with
        # it after the block, a send or start(), finds it ended rather than opening it)
        if exc is None:
            try:
                await self.commit()
            except asyncio.CancelledError as cancelled:
                # cancelled while it waited for its operations: END_TXN(COMMIT) never went
                # out, so nothing committed, and left OPEN the transaction would hold its
                # inputs and keep every reader of its outputs' segments waiting until its
                # timeout; a cancel in the block aborts, and so does this one
                if self.state in (TransactionState.OPEN, TransactionState.NEW):
                    await self.abort_quietly(f"after {type(cancelled).__name__}")
                raise
        else:
            await self.abort_quietly(f"after {type(exc).__name__}")

    async def abort_at_close(self, timeout_s: float) -> None:
        """Its client closes with it open, or being opened: abort it (:meth:`abort_quietly`).
        What the application calls on it next (``commit()``, a send, leaving its ``async
        with``) raises ClientClosed."""
        if self.state is TransactionState.OPEN or self.opening:
            self._closed_by_client = True
            await self.abort_quietly("at its client's close", timeout_s=timeout_s)

    async def abort_quietly(self, why: str, *, timeout_s: float | None = None) -> None:
        """:meth:`abort`, never raising: one that fails (no coordinator answered in time,
        the client closed) is logged at WARNING with ``why``, and its coordinator aborts
        the transaction at its timeout anyway. For where raising would replace a more
        important outcome: leaving ``async with`` by an exception (the application's own,
        or a cancellation: the task would go on as if it had not been cancelled), or
        ``Client.close()``."""
        try:
            await self.abort(timeout_s=timeout_s)
        except (ServerError, ClientError) as e:
            log.warning(
                "transaction %s: not aborted %s (%s: %s); its coordinator aborts it at its timeout",
                self._id,
                why,
                type(e).__name__,
                e,
            )
