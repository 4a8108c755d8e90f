"""The errors an op-record step's waiters are refused with (:mod:`segtxn.broker.txn.oprecords`):
the store failed the step, the segment's ledger was opened by another broker (or the store
could not be read to tell), the broker is stopping. Apart from the writer so that what a
send is told can be read in one place."""

from __future__ import annotations

import asyncio

from segtxn.broker.txn.opdrafts import Owner, Waiting
from segtxn.failures import translate
from segtxn.ledger.fencing import OwnerUnknown
from segtxn.ledger.ownership import changed_by_its_owner
from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId


async def owner_refusal(
    txn: TxnId, owner: Owner, version: int, refused: MetadataStoreError
) -> ServerError | None:
    """The refusal for ops whose step was ``refused`` because ``owner``'s ledger's metadata
    record is no longer at ``version`` (the one the step checked), or None when the change
    is this broker's own (a rollover, a trim: the step is tried again on the new version).

    TransactionConflict only on proof that another broker opened the ledger (the segment
    is not served here any more; that proof stopped the ledger, and the broker lets the
    segment go: :mod:`segtxn.ledger.ownership`). ServiceNotReady when the ledger's own
    change is in doubt (its answer and read-back lost) and could not be settled to tell
    whose change it was
    (:func:`~segtxn.ledger.ownership.changed_by_its_owner`: the store failed the read, even
    read again, refused it, or the ledger must be reopened): the step wrote nothing and
    nothing is decided, so the store's trouble is what the sends are told, as for any step
    the store failed. It was taken for a take-over, TransactionConflict "not served by this
    broker any more", on one failed read."""
    try:
        if await changed_by_its_owner(owner, version):
            return None
    except OwnerUnknown as e:
        error = ServerError(
            ErrorName.SERVICE_NOT_READY, f"could not record the op: {e}; nothing is decided"
        )
        error.__cause__ = e
        return error
    error = ServerError(
        ErrorName.TRANSACTION_CONFLICT,
        f"{owner.name} is not served by this broker any more (another one opened its "
        f"ledger): {txn} cannot record its ops on it here",
    )
    error.__cause__ = refused
    return error


def store_failed(e: MetadataStoreError) -> ServerError:
    """The refusal for ops whose step the store failed: what the store's trouble is on the
    wire (unreachable or slow: ServiceNotReady, full, access denied), as for any other call;
    PersistenceError ("stored data is damaged or missing") only for what is none of those.
    Either way the transaction cannot commit these ops."""
    wire = translate(e)
    name = ErrorName.PERSISTENCE if wire is None else wire.name
    message = str(e) if wire is None else wire.message
    error = ServerError(name, f"could not record the op: {message}")
    error.__cause__ = e
    return error


def stopping() -> ServerError:
    """The refusal for ops a closing writer did not record (or cannot tell it did)."""
    return ServerError(
        ErrorName.SERVICE_NOT_READY, "could not record the op: the broker is stopping"
    )


def refuse_stopped(left: list[Waiting]) -> None:
    """Refuse the waiters a closing writer leaves unanswered (ServiceNotReady: the broker is
    stopping), each draft with one failed for good: a step cut in flight may have landed or
    not, and a queued one's record will not hold what its participant believes."""
    for waiting in left:
        if all(done.done() for done in waiting.waiters):
            continue
        error = stopping()
        if waiting.draft.failed is None:
            waiting.draft.failed = error
        fail_waiters(waiting.waiters, error)


def fail_waiters(waiters: list[asyncio.Future[None]], error: ServerError) -> None:
    for done in waiters:
        if not done.done():
            done.set_exception(error)
            done.exception()  # retrieved: the waiter re-raises it
