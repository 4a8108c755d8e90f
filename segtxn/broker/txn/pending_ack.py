"""Pending acknowledgments: acks made inside a transaction, applied only when it commits.

PIP-31's PENDING_ACK rules, shared by both ways of storing them: while a transaction holds a
message's ack the message is delivered to nobody; a second transaction acknowledging it gets
``TransactionConflict``; a plain ack of it is ignored; the same transaction acknowledging it
again is a no-op. Commit applies the acks to the cursor (individual or cumulative); abort
releases the messages for redelivery.

Where they are kept: :mod:`segtxn.broker.txn.pending_ack_records` for ``segment://``
subscriptions (op records, PIP-471), :mod:`segtxn.broker.txn.pending_ack_log` for
``persistent://`` ones (a log, PIP-31).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from segtxn.ledger import ManagedCursor, Position
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId


class PendingAckStore(ABC):
    @abstractmethod
    def is_pending(self, position: Position) -> bool:
        """True while a transaction holds an ack of ``position``."""

    @abstractmethod
    async def ack(
        self,
        txn: TxnId,
        positions: list[Position],
        *,
        cumulative: bool,
        guard: Callable[[], None] | None = None,
    ) -> None:
        """Record acks in ``txn``; returns once they are durable. ``guard`` is called
        right before the positions are reserved, with no await in between, and may refuse
        by raising (the subscription checks there that they are still the consumer's)."""

    def holds_up_to(self, position: Position) -> bool:
        """Whether an open transaction holds the ack of ``position`` or of one before it
        (a plain cumulative ack up to ``position`` would take it)."""
        return False

    def transactions(self) -> set[TxnId]:
        """The open transactions holding acks now."""
        return set()

    def holder(self, position: Position) -> TxnId | None:
        """The open transaction holding the ack of ``position``, if one does."""
        return None

    def holds(self, txn: TxnId, positions: list[Position], *, cumulative: bool) -> bool:
        """Whether ``txn`` holds the acks of ``positions`` already (with ``cumulative``, of
        everything up to the last of them): the same ack again, in the same transaction."""
        return False

    def pending_count(self) -> int:
        """Acks held by open transactions: one per individual ack, one per transaction
        holding a cumulative ack (for metrics)."""
        return 0

    async def recover(self) -> None:  # noqa: B027 - nothing to rebuild unless overridden
        """Rebuild state on load."""

    async def close(self) -> None:  # noqa: B027
        """Stop background work."""


class NoPendingAcks(PendingAckStore):
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def is_pending(self, position: Position) -> bool:
        return False

    async def ack(
        self,
        txn: TxnId,
        positions: list[Position],
        *,
        cumulative: bool,
        guard: Callable[[], None] | None = None,
    ) -> None:
        raise ServerError(
            ErrorName.NOT_ALLOWED,
            f"{self._topic}: v5 transactions acknowledge on scalable topics (segment://); "
            "persistent:// topics take part in v4 (marker-based) transactions",
        )


class ReservingPendingAckStore(PendingAckStore):
    """PENDING_ACK's rules, shared by v5 (op records) and v4 (a log): which transaction
    holds which position (individually, or cumulatively up to one), and the conflicts."""

    def __init__(self, cursor: ManagedCursor, release: Callable[[list[Position]], None]) -> None:
        """``release`` is called with the positions an aborted transaction acknowledged:
        they are to be delivered again."""
        self._cursor = cursor
        self._release = release
        self._individual: dict[Position, TxnId] = {}
        self._cumulative: dict[TxnId, Position] = {}

    def is_pending(self, position: Position) -> bool:
        return position in self._individual or any(
            position <= upto for upto in self._cumulative.values()
        )

    def holds_up_to(self, position: Position) -> bool:
        # a cumulative hold covers everything unacknowledged up to it, the first one too
        return bool(self._cumulative) or any(p <= position for p in self._individual)

    def transactions(self) -> set[TxnId]:
        return set(self._individual.values()) | set(self._cumulative)

    def pending_count(self) -> int:
        return len(self._individual) + len(self._cumulative)

    def holder(self, position: Position) -> TxnId | None:
        txn = self._individual.get(position)
        if txn is not None:
            return txn
        for owner, upto in self._cumulative.items():
            if position <= upto:
                return owner
        return None

    def holds(self, txn: TxnId, positions: list[Position], *, cumulative: bool) -> bool:
        if cumulative:
            upto = self._cumulative.get(txn)
            return upto is not None and max(positions) <= upto
        return all(self.holder(position) == txn for position in positions)

    def _check(self, txn: TxnId, positions: list[Position], *, cumulative: bool) -> None:
        """Raises ServerError(TransactionConflict): acknowledged already, or held by
        another open transaction."""
        for position in positions:
            if self._cursor.is_acked(position):
                raise ServerError(
                    ErrorName.TRANSACTION_CONFLICT, f"{position} is already acknowledged"
                )
            holder = self.holder(position)
            if holder is not None and holder != txn:
                raise ServerError(
                    ErrorName.TRANSACTION_CONFLICT,
                    f"{position} is acknowledged by transaction {holder}, still open",
                )
        if cumulative:
            upto = max(positions)
            for position, holder in self._individual.items():
                if holder != txn and position <= upto:
                    raise ServerError(
                        ErrorName.TRANSACTION_CONFLICT,
                        f"{position} is acknowledged by transaction {holder}, still open",
                    )
            # Two cumulative holds always overlap (each covers everything unacknowledged up
            # to it), so one open transaction at a time acknowledges cumulatively (PIP-31):
            # with two, the abort of one left what both held to the other, and its commit
            # took messages whose processing had been aborted.
            for holder, held in self._cumulative.items():
                if holder != txn:
                    raise ServerError(
                        ErrorName.TRANSACTION_CONFLICT,
                        f"transaction {holder}, still open, acknowledged cumulatively up to "
                        f"{held}: one transaction at a time acknowledges cumulatively",
                    )

    def _reserve(self, txn: TxnId, positions: list[Position], *, cumulative: bool) -> Any:
        """Hold ``positions`` for ``txn``; returns what :meth:`_unreserve` needs."""
        if cumulative:
            before = self._cumulative.get(txn)
            upto = max(positions)
            held = self._cumulative[txn] = upto if before is None else max(before, upto)
            return before, held
        reserved = [p for p in positions if p not in self._individual]
        for position in reserved:
            self._individual[position] = txn
        return reserved

    def _unreserve(self, txn: TxnId, undo: Any, *, cumulative: bool) -> None:
        """Take back a reservation whose ack failed. Only the hold that reservation made:
        ``txn`` may have ended meanwhile (its outcome applied and its holds dropped), and a
        hold put back then was never released again."""
        if cumulative:
            before, held = undo
            if self._cumulative.get(txn) != held:
                return  # ended meanwhile, or a later ack of it holds more
            if before is None:
                del self._cumulative[txn]
            else:
                self._cumulative[txn] = before
            return
        for position in undo:
            if self._individual.get(position) == txn:
                del self._individual[position]

    def _holds_any(self, txn: TxnId) -> bool:
        """Whether ``txn`` holds any ack here."""
        return txn in self._cumulative or txn in self._individual.values()

    def _held_by(self, txn: TxnId) -> tuple[list[Position], Position | None]:
        individual = sorted(p for p, t in self._individual.items() if t == txn)
        return individual, self._cumulative.get(txn)

    async def _settle(
        self,
        txn: TxnId,
        committed: bool,
        individual: list[Position],
        upto: Position | None,
        *,
        wait: bool = True,
    ) -> None:
        """Apply a decision: a commit acknowledges on the cursor (durably, unless ``wait``
        is False: see :meth:`ManagedCursor.ack`), an abort releases the positions for
        redelivery; either way ``txn`` holds nothing after."""
        if committed:
            if individual:
                await self._cursor.ack(individual, wait=wait)
            if upto is not None:
                await self._cursor.ack_cumulative(upto, wait=wait)
        for position in individual:
            self._individual.pop(position, None)
        self._cumulative.pop(txn, None)
        if committed:
            self._release([])  # wakes the dispatcher: a sealed ledger may be done
        else:
            self._release([*individual, *([upto] if upto is not None else [])])
