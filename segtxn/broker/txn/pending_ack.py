"""Pending acknowledgments: acks made inside a transaction, applied only when it commits.

PIP-31's PENDING_ACK state, stored the PIP-471 way for ``segment://`` subscriptions: each
transactional ack is an op record ``/txn-op/<txn>/<seq>`` (kind ``ack``, indexed
``acks-by-segment-sub``), written in the same atomic step as a check that the header is
still OPEN. While the transaction is open the message is delivered to nobody; a second
transaction acknowledging it gets ``TransactionConflict``; a plain ack of it is ignored.
When the header watch reports the outcome: commit applies the acks to the cursor
(individual or cumulative, durably) and abort releases the messages for redelivery; then
the op records are deleted. A crash half-way repeats the (idempotent) materialization on
recovery, which rebuilds everything from the index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.txn.headers import HeaderCache
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.ledger import ManagedCursor, Position
from segtxn.metastore import MetadataStore, MetadataStoreError, NotFound
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T

log = logging.getLogger(__name__)


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

    def transactions(self) -> set[TxnId]:
        """The open transactions holding acks now."""
        return set()

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

    def transactions(self) -> set[TxnId]:
        return set(self._individual.values()) | set(self._cumulative)

    def holder(self, position: Position) -> TxnId | None:
        txn = self._individual.get(position)
        if txn is not None:
            return txn
        for owner, upto in self._cumulative.items():
            if position <= upto:
                return owner
        return None

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

    def _reserve(self, txn: TxnId, positions: list[Position], *, cumulative: bool) -> Any:
        """Hold ``positions`` for ``txn``; returns what :meth:`_unreserve` needs."""
        if cumulative:
            before = self._cumulative.get(txn)
            upto = max(positions)
            self._cumulative[txn] = upto if before is None else max(before, upto)
            return before
        reserved = [p for p in positions if p not in self._individual]
        for position in reserved:
            self._individual[position] = txn
        return reserved

    def _unreserve(self, txn: TxnId, undo: Any, *, cumulative: bool) -> None:
        if cumulative:
            if undo is None:
                self._cumulative.pop(txn, None)
            else:
                self._cumulative[txn] = undo
            return
        for position in undo:
            if self._individual.get(position) == txn:
                del self._individual[position]

    def _held_by(self, txn: TxnId) -> tuple[list[Position], Position | None]:
        individual = sorted(p for p, t in self._individual.items() if t == txn)
        return individual, self._cumulative.get(txn)

    async def _settle(
        self, txn: TxnId, committed: bool, individual: list[Position], upto: Position | None
    ) -> None:
        """Apply a decision: a commit acknowledges on the cursor (durably), an abort
        releases the positions for redelivery; either way ``txn`` holds nothing after."""
        if committed:
            if individual:
                await self._cursor.ack(individual)
            if upto is not None:
                await self._cursor.ack_cumulative(upto)
        for position in individual:
            self._individual.pop(position, None)
        self._cumulative.pop(txn, None)
        if committed:
            self._release([])  # wakes the dispatcher: a sealed ledger may be done
        else:
            self._release([*individual, *([upto] if upto is not None else [])])


class MetadataPendingAckStore(ReservingPendingAckStore):
    def __init__(
        self,
        segment: str,
        subscription: str,
        *,
        cursor: ManagedCursor,
        store: MetadataStore,
        headers: HeaderCache,
        release: Callable[[list[Position]], None],
        metrics: BrokerMetrics,
        ops: OpRecordWriter,
    ) -> None:
        super().__init__(cursor, release)
        self.segment = segment
        self.subscription = subscription
        self._store = store
        self._headers = headers
        self._metrics = metrics
        self._ops = ops
        self._op_keys: dict[TxnId, list[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

    async def ack(
        self,
        txn: TxnId,
        positions: list[Position],
        *,
        cumulative: bool,
        guard: Callable[[], None] | None = None,
    ) -> None:
        """Raises ServerError(TransactionNotFound / TransactionConflict)."""
        self._headers.listen(txn, self._on_header)
        header, version = await self._headers.get(txn)
        if header is None:
            raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}")
        if header.state is not TxnState.OPEN:
            raise ServerError(ErrorName.TRANSACTION_CONFLICT, f"{txn} is {header.state}")
        if guard is not None:
            guard()
        self._check(txn, positions, cumulative=cumulative)
        # Checked and reserved with no await in between: a concurrent ack of the same
        # position by another transaction sees the reservation and conflicts.
        undo = self._reserve(txn, positions, cumulative=cumulative)
        ops = (
            [self._op(max(positions), cumulative=True)]
            if cumulative
            else [self._op(p, cumulative=False) for p in positions]
        )
        try:
            await self._write(txn, version, ops)
        except BaseException:
            self._unreserve(txn, undo, cumulative=cumulative)
            raise
        cached = self._headers.cached(txn)
        if cached is not None and cached.state.final:  # decided while we were writing
            self._on_header(txn, cached)

    def _op(self, position: Position, *, cumulative: bool) -> T.TxnOp:
        return T.TxnOp(
            T.OpKind.ACK,
            self.segment,
            (position.ledger_id, position.entry_id),
            self.subscription,
            cumulative,
        )

    async def _write(self, txn: TxnId, version: int, ops: list[T.TxnOp]) -> list[str]:
        """All the op records, batched with others of ``txn`` (several per store step).

        Raises ServerError(TransactionConflict / PersistenceError); records written before a
        failure are deleted when the transaction's (aborted) outcome is materialized.
        """
        results = await asyncio.gather(
            *(self._ops.write(txn, version, op) for op in ops), return_exceptions=True
        )
        keys = [r for r in results if isinstance(r, str)]
        self._op_keys.setdefault(txn, []).extend(keys)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return keys

    # ------------------------------------------------------------------ outcomes

    def _on_header(self, txn: TxnId, header: T.TxnHeader | None) -> None:
        if header is not None and not header.state.final:
            return
        task = asyncio.create_task(
            self._materialize(txn, header), name=f"pending-ack-{self.segment}-{txn}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _materialize(self, txn: TxnId, header: T.TxnHeader | None) -> None:
        async with self._lock:
            individual, upto = self._held_by(txn)
            if not individual and upto is None and txn not in self._op_keys:
                return
            committed = header is not None and header.state is TxnState.COMMITTED
            outcome = TxnState.COMMITTED if committed else TxnState.ABORTED
            self._metrics.txn_materialized.add(1, {"outcome": outcome.value, "part": "acks"})
            log.debug(
                "txn %s: %s materialized on %s subscription %s (%d acks%s)",
                txn,
                outcome.value,
                self.segment,
                self.subscription,
                len(individual),
                "" if upto is None else f", cumulative up to {upto}",
            )
            try:
                await self._settle(txn, committed, individual, upto)
                for key in self._op_keys.pop(txn, []):
                    with contextlib.suppress(NotFound):
                        await self._store.delete(key)
                self._headers.forget(txn, self._on_header)
            except MetadataStoreError as e:
                log.warning(
                    "txn %s: materializing its %s on %s subscription %s failed (%s); retried "
                    "when the segment is loaded again",
                    txn,
                    outcome.value,
                    self.segment,
                    self.subscription,
                    e,
                )

    # ------------------------------------------------------------------ recovery

    async def recover(self) -> None:
        started = time.perf_counter()
        ops = await self._store.index_range(T.IDX_ACKS, (self.segment, self.subscription))
        self._metrics.txn_index_query.record(time.perf_counter() - started)
        for entry in ops.entries:
            txn = T.txn_of_op_key(entry.key)
            op = T.decode_op(entry.value)
            position = Position(*op.position)
            if op.cumulative:
                self._cumulative[txn] = max(self._cumulative.get(txn, position), position)
            else:
                self._individual[position] = txn
            self._op_keys.setdefault(txn, []).append(entry.key)
        for txn in list(self._op_keys):
            self._headers.listen(txn, self._on_header)
            header, _ = await self._headers.get(txn)
            if header is None or header.state.final:
                await self._materialize(txn, header)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for txn in list(self._op_keys):
            self._headers.forget(txn, self._on_header)
