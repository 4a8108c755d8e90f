"""Poisoning: how a send or an acknowledgment dooms the transaction it was made in.

A transaction is all or nothing, so an operation in it that fails must stop it from
committing the rest without it, even when the application caught the error and went on.
``with poisons(txn):`` wraps every send and acknowledgment given a transaction (in
:mod:`segtxn.client.producer`, :mod:`segtxn.client.scalable` and
:mod:`segtxn.client.acknowledging`): whatever the call raises, a refusal before it left
included, marks the transaction failed, and its ``commit`` then aborts it and raises
:class:`~segtxn.client.transaction.TransactionFailed`. A call whose caller cancelled it
poisons it with :class:`~segtxn.client.errors.OperationCancelled`: it may have reached the
broker and been applied.

It is apart from :mod:`segtxn.client.transaction` because it is the operations' side of the
contract: the transaction only keeps the first failure (``Operations.poison``); what counts
as one is decided where the operations are made.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from segtxn.client.errors import OperationCancelled
from segtxn.client.transaction import Transaction

__all__ = ["poisons"]


def poisons(txn: Transaction | None) -> contextlib.AbstractContextManager[None]:
    """``with poisons(txn):`` around a send or acknowledgment given ``txn``: whatever it
    raises poisons the transaction, so ``commit`` aborts instead of committing the rest
    without it (a cancel: with :class:`OperationCancelled`). Without a transaction, a shared
    context that does nothing.

    Raises:
        TypeError: ``txn`` is neither None nor a Transaction (a transaction's id, say).
    """
    if txn is None:
        return _NOTHING
    if not isinstance(txn, Transaction):
        raise TypeError(
            f"txn is a Transaction (client.transaction()) or None, not {type(txn).__name__}"
        )
    return _Poisoning(txn)


_NOTHING = contextlib.nullcontext()


class _Poisoning(contextlib.AbstractContextManager[None]):
    __slots__ = ("_txn",)

    def __init__(self, txn: Transaction) -> None:
        self._txn = txn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, asyncio.CancelledError):
            exc = OperationCancelled(
                f"an operation in transaction {self._txn._id} was cancelled by its caller"
            )
        self._txn.operations.poison(exc)
