"""Whose transaction a frame names: only the role that opened a transaction (or a
superuser) may write in it or acknowledge in it (docs/security.md).

A producer's ``send`` and a consumer's ``ack`` and ``redeliver`` may name a transaction.
With security on, the connection's :class:`TxnAccess` checks the first frame naming each
transaction against the role its owner is recorded as, before the frame does anything, and
remembers the transactions it let through (a transaction's owner never changes). The owner
of a v5 transaction is in its header (the broker's header cache, else one store read); a
v4 transaction's is asked of its coordinator, as the cluster role (the same call as v4
admission: segtxn/broker/txn/v4checks.py).

A transaction the store or its coordinator does not know is let through here: the frame's
own checks refuse it (``TransactionNotFound``), as they always did.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from segtxn.auth import Principal, check_owner
from segtxn.broker.service import BrokerService
from segtxn.failures import translate
from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T

MAX_REMEMBERED = 1024
"""Transactions one connection remembers as allowed; past that it forgets them all and
checks again (a header read each, usually from the cache)."""


class TxnAccess:
    """The transaction checks of one WebSocket connection. ``principal`` says who sends on
    it, under the policy in force at each check (None: security off, every transaction
    allowed, nothing read): a superuser a reloaded policy took out is one no more."""

    def __init__(self, service: BrokerService, principal: Callable[[], Principal | None]) -> None:
        self._service = service
        self._principal = principal
        self._allowed: set[TxnId] = set()

    async def check(self, txn: TxnId) -> None:
        """Refuse ``txn`` unless this connection's role opened it or is a superuser.

        Raises:
            ServerError(NotAuthorized): another role's transaction.
            ServerError(ServiceNotReady): its owner could not be learned (store or
                coordinator away): retriable.
            ServerError(MetadataError): its (v5) header record is damaged.
        """
        principal = self._principal()
        if principal is None or principal.superuser or txn in self._allowed:
            return
        if not all(0 <= half < 2**64 for half in txn):
            return  # not an id at all: the frame's own checks refuse it
        try:
            owner = await self._owner(txn)
        except ServerError as e:
            if e.name is ErrorName.TRANSACTION_NOT_FOUND:
                return  # the frame's own checks say so
            raise
        check_owner(principal, owner, f"transaction {txn}")
        if len(self._allowed) >= MAX_REMEMBERED:
            self._allowed.clear()
        self._allowed.add(txn)

    async def refusal(self, txn: tuple[int, int] | None) -> ServerError | None:
        """Why sends naming ``txn`` (None: no transaction) are refused here, or None."""
        if txn is None:
            return None
        try:
            await self.check(TxnId(*txn))
        except ServerError as e:
            return e
        return None

    async def _owner(self, txn: TxnId) -> str | None:
        if txn.is_v5:
            # the cache if it has it; else one read that leaves the cache as it was (a
            # refused frame must not make the broker hold a header for ever)
            header = self._service.headers.cached(txn)
            if header is None:
                try:
                    record = await self._service.store.get(T.header_key(txn))
                except MetadataStoreError as e:  # (each send is answered with it: retriable)
                    raise translate(e) or ServerError(
                        ErrorName.SERVICE_NOT_READY, f"the owner of {txn} is unknown: {e}"
                    ) from e
                if record is None:
                    raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}")
                try:
                    header = T.decode_header(record.value)
                except (msgspec.DecodeError, ValueError) as e:  # (each send is answered)
                    raise ServerError(
                        ErrorName.METADATA, f"the header record of {txn} is damaged: {e}"
                    ) from e
            return header.owner
        return await self._service.v4_checks.owner(txn)
