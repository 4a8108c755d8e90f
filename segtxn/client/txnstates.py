"""A client transaction's states, their one transition table, and its errors: aborted
because an operation in it failed, ended before an operation could join it, or an outcome
that cannot be learned (:mod:`segtxn.client.transaction`)."""

from __future__ import annotations

import enum

from segtxn.client.errors import ClientError
from segtxn.protocol.errors import ErrorCategory

__all__ = [
    "NEXT",
    "OutcomeUnknown",
    "PrecedingNotCommitted",
    "TransactionEnded",
    "TransactionFailed",
    "TransactionState",
]


class TransactionState(enum.StrEnum):
    """Where a client's transaction is (a ``str``: ``txn.state == "ABORTED"`` holds)."""

    NEW = "NEW"
    """Nothing done in it yet: its first send or ack (or ``start()``) opens it."""
    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    """A commit asked for (END_TXN(COMMIT), or a broker's one-step commit), its answer not
    (yet) had: ``commit()`` may be called again."""
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


NEXT: dict[TransactionState, frozenset[TransactionState]] = {
    TransactionState.NEW: frozenset(
        {TransactionState.OPEN, TransactionState.COMMITTED, TransactionState.ABORTED}
    ),
    TransactionState.OPEN: frozenset(
        {TransactionState.COMMITTING, TransactionState.COMMITTED, TransactionState.ABORTED}
    ),
    TransactionState.COMMITTING: frozenset(
        {TransactionState.COMMITTED, TransactionState.ABORTED, TransactionState.OPEN}
    ),
    TransactionState.COMMITTED: frozenset(),
    TransactionState.ABORTED: frozenset(),
}
"""The one transition table: a commit of a NEW transaction commits nothing; a commit whose
outcome is unknown stays COMMITTING until it is known; a broker that answers a one-step
commit "not here" decided nothing, so the transaction is OPEN again (a cancel while it then
waits for its operations aborts it, as one before the commit would)."""


class TransactionFailed(ClientError):
    """The transaction was aborted because one of its operations failed (see __cause__).

    ``category`` is ABORTABLE (start a new transaction: what it acknowledged is delivered
    again) unless the failure is one a new transaction would meet again: a FATAL error
    (``MessageTooLarge``, ``TopicNotFound``, ``ClientClosed``, ...) or one that is not the
    client's or a server's (a ``TypeError`` for a value that is not bytes), then FATAL."""

    def __init__(self, message: str, *, failure: BaseException | None = None) -> None:
        super().__init__(message)
        category = getattr(failure, "category", None)
        if isinstance(category, ErrorCategory) and category is not ErrorCategory.FATAL:
            self.category = ErrorCategory.ABORTABLE  # it was aborted: the outcome is known


class TransactionEnded(ClientError):
    """A send or acknowledgment was given a transaction that has ended (COMMITTED or
    ABORTED): it was not made, and nothing went to a broker. ABORTABLE: it can only go in a
    new transaction (``client.transaction()``). Raised too for one that waited (for room in
    its producer's window) while an ``abort()`` that stopped waiting for it ended the
    transaction: the broker would only have refused it. ``start()`` of an ended transaction
    and ``commit()`` of an aborted one raise it too (``commit()`` of a committed one
    returns). A transaction aborted by its client's close says so with ``ClientClosed``
    instead."""

    category = ErrorCategory.ABORTABLE


class OutcomeUnknown(ClientError):
    """Whether the transaction committed cannot be learned any more: a commit whose answer
    was lost was asked again after the coordinator had collected the transaction's record
    (``gc_retention_s`` after it ended). Its state stays COMMITTING; only the application
    can tell, from what the transaction wrote, whether it counted."""

    category = ErrorCategory.OUTCOME_UNKNOWN


class PrecedingNotCommitted(ClientError):
    """The transaction this one follows (``client.transaction(after=...)``) did not commit:
    it was aborted, or its outcome was not known by the time this one's commit gave up
    waiting. This one is aborted too (the ``__cause__`` of its commit's
    :class:`TransactionFailed`): committed, what it wrote would count before what the one it
    follows wrote once that one's inputs are processed again, out of order.

    ABORTABLE: start a new transaction; what both acknowledged is delivered again, in
    order."""

    category = ErrorCategory.ABORTABLE
