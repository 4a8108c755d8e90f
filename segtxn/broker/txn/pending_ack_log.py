"""PIP-31's pending-ack store for ``persistent://`` subscriptions: a log, kept bounded.

:class:`MLPendingAckStore` logs a transaction's acks on a subscription to the
``<topic>-<sub>__transaction_pending_ack`` managed ledger before they are acknowledged
(same PENDING_ACK rules as v5: conflicts, plain acks ignored while pending);
``END_TXN_ON_SUBSCRIPTION`` applies them to the cursor (commit) or releases them (abort),
then logs the outcome. Recovery (the subscription's next load on this broker) replays the
log: the acks of transactions still open are held again, and committed ones are applied
again (cursor acks repeat safely).

**What the log must keep** is the acks of the transactions still open: a committed
transaction's acks are durable in the cursor before its COMMIT is logged (all but those a
cursor save leaves out, past its ``max_persisted_ranges`` ranges: kept, committed, until a
save holds them), and an aborted one's are released. So the log is a
:class:`~segtxn.ledger.compacted.CompactedLog`: once ``compact_entries`` entries were
appended since its last compaction (and twice as many as it would keep), it is cut, every
open transaction's acks are logged again past the cut (in
ops of at most :data:`MAX_POSITIONS_PER_OP` positions), and the ledgers before the cut are
deleted. A crash at any step leaves a log that replays to the same open transactions and
acks (:mod:`segtxn.ledger.compacted` says why). Ended transactions are then forgotten by the
log (this store still remembers the last 100,000 in memory); a late ack of one is refused
by its coordinator's answer (:mod:`segtxn.broker.txn.v4checks`).

**The log goes with its subscription**: deleting the subscription, or its topic, deletes it
(:func:`delete_log`, by its name, :func:`pending_ack_log`, whether the subscription is
loaded or not: :mod:`segtxn.broker.subscriptions`). Left, it was
replayed by a subscription made again under the name, on the topic or on one created again
under the topic's name, whose ledger numbers its entries from the start again: the deleted
one's committed acks were applied to the new cursor, and the new topic's first messages
were never delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from segtxn.aio import cancel
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.txn.markers import remember
from segtxn.broker.txn.pending_ack import ReservingPendingAckStore
from segtxn.broker.txn.v4checks import V4TransactionChecks
from segtxn.ledger import (
    LedgerError,
    LedgerSettings,
    LogStorage,
    ManagedCursor,
    ManagedLedger,
    Position,
    delete_unopened,
)
from segtxn.ledger.compacted import CompactedLog
from segtxn.ledger.managed import metadata_key
from segtxn.metastore import MetadataStore, MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnAction, TxnId, TxnState

log = logging.getLogger(__name__)

MAX_POSITIONS_PER_OP = 4096
"""A compaction re-logs an open transaction's individual acks in ops of at most this many."""


class PendingAckOp(msgspec.Struct, frozen=True):
    txn: tuple[int, int]
    op: str
    """``ack``, ``COMMIT`` or ``ABORT``."""
    positions: list[tuple[int, int]] = msgspec.field(default_factory=list)
    cumulative: bool = False


_encode = msgspec.json.Encoder().encode
_decode_op = msgspec.json.Decoder(PendingAckOp).decode


def pending_ack_log(topic: str, subscription: str) -> str:
    return f"{topic}-{subscription}__transaction_pending_ack"


async def delete_log(name: str, store: MetadataStore, storage: LogStorage) -> None:
    """Delete the pending-ack log ``name`` if it exists (it is closed everywhere), as far
    as it is left, without opening it (:func:`~segtxn.ledger.delete_unopened`): a deletion
    stopped part-way through its files leaves some of them gone, and opening the log is
    refused for them (``LedgerMissing``), so a retry that opened it never finished, and its
    topic, marked deleting, could never be deleted.

    Raises:
        LedgerMismatch: a file of it is not its own (a foreign volume); nothing was deleted.
        LedgerError, MetadataStoreError: a step failed; doing it again goes on.
    """
    await delete_unopened(name, store, storage)


class MLPendingAckStore(ReservingPendingAckStore):
    """PIP-31's pending-ack store for a ``persistent://`` subscription (module docstring)."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        *,
        cursor: ManagedCursor,
        topic_ledger: ManagedLedger,
        store: MetadataStore,
        storage: LogStorage,
        settings: LedgerSettings,
        release: Callable[[list[Position]], None],
        checks: V4TransactionChecks,
        compact_entries: int = 1000,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        super().__init__(cursor, release)
        self.topic = topic
        self._checks = checks
        self.subscription = subscription
        self._topic_ledger = topic_ledger
        self._store = store
        self._storage = storage
        self._settings = settings
        self._compact_entries = compact_entries
        self._metrics = metrics
        self._name = pending_ack_log(topic, subscription)
        self._log: CompactedLog | None = None
        self._open_lock = asyncio.Lock()
        self._ended: OrderedDict[TxnId, TxnState] = OrderedDict()
        self._unsaved: dict[TxnId, list[Position]] = {}
        """Committed transactions' acks a cursor save did not hold (past its
        ``max_persisted_ranges`` ranges): compactions log them again, committed, so that a
        restart applies them again instead of delivering their messages again."""
        self._locks: dict[TxnId, asyncio.Lock] = {}
        self._compaction: asyncio.Task[None] | None = None

    def __str__(self) -> str:
        return f"{self.topic} subscription {self.subscription!r}"

    async def _ledger(self) -> CompactedLog:
        """The log, opened on first use. Its retriable stop (another owner's fence met by
        a compaction or a write, too few replicas, a full disk) stops the topic's ledger
        too (:meth:`~segtxn.ledger.appends.LedgerAppends.stop_with`): the broker unloads the
        topic, as for a stop of its own, and the next load reopens the log. Left alone,
        the stopped log refused every later transactional ack of the subscription."""
        async with self._open_lock:
            if self._log is None:
                self._log = await CompactedLog.open(
                    self._name, self._store, self._storage, self._settings
                )
                self._topic_ledger.stop_with(self._log.ledger)  # (see _ledger's docstring)
            return self._log

    async def ack(
        self,
        txn: TxnId,
        positions: list[Position],
        *,
        cumulative: bool,
        guard: Callable[[], None] | None = None,
    ) -> None:
        """Raises ServerError(TransactionConflict), or TransactionNotFound /
        InvalidTxnStatus / ServiceNotReady when its coordinator does not confirm it open with
        this subscription in it (asked once per transaction)."""
        if txn in self._ended:
            raise ServerError(ErrorName.TRANSACTION_CONFLICT, f"{txn} is {self._ended[txn]}")
        await self._checks.admit_ack(txn, self.topic, self.subscription, self)
        log_ = await self._ledger()
        undo: list[Any] = []

        def admit() -> None:  # checked and reserved with no await in between
            if guard is not None:
                guard()
            if txn in self._ended:  # ended while its coordinator was asked: nothing releases
                # a hold taken now (a repeated END changes nothing; recovery replays it)
                raise ServerError(ErrorName.TRANSACTION_CONFLICT, f"{txn} is {self._ended[txn]}")
            self._check(txn, positions, cumulative=cumulative)
            undo.append(self._reserve(txn, positions, cumulative=cumulative))

        pairs = [p.as_pair() for p in positions]
        op = PendingAckOp((txn.most, txn.least), "ack", pairs, cumulative)
        try:
            await log_.append(_encode(op), admit=admit)
        except BaseException:
            if undo:
                self._unreserve(txn, undo[0], cumulative=cumulative)
            raise
        self._compact_if_due(log_)

    async def end(self, txn: TxnId, action: TxnAction) -> bool:
        """END_TXN_ON_SUBSCRIPTION: commit applies the acks to the cursor, abort releases
        them; then the outcome is logged (idempotent). Returns whether this call ended it
        (False: it had ended so already), as :meth:`MarkerTransactionBuffer.end` does."""
        outcome = action.outcome
        async with self._locks.setdefault(txn, asyncio.Lock()):
            ended = self._ended.get(txn)
            if ended is not None:
                if ended is not outcome:
                    raise ServerError(ErrorName.INVALID_TXN_STATUS, f"{txn} already {ended}")
                return False
            individual, upto = self._held_by(txn)
            if individual or upto is not None:
                log.debug(
                    "txn %s: %s on %s subscription %s", txn, action, self.topic, self.subscription
                )
                await self._settle(txn, outcome is TxnState.COMMITTED, individual, upto)
                if outcome is TxnState.COMMITTED:
                    self._keep_unsaved(txn, individual)
                log_ = await self._ledger()
                await log_.append(_encode(PendingAckOp((txn.most, txn.least), action.value)))
                self._compact_if_due(log_)
            remember(self._ended, txn, outcome)
            self._checks.ended(txn, self)
            self._locks.pop(txn, None)
        return True

    def _keep_unsaved(self, txn: TxnId, acked: list[Position]) -> None:
        """Remember what of a commit's acks the cursor's saves do not hold."""
        unsaved = [p for p in acked if not self._cursor.saved(p)]
        if unsaved:
            self._unsaved[txn] = unsaved
        else:
            self._unsaved.pop(txn, None)

    # ------------------------------------------------------------------ compaction

    def _compact_if_due(self, log_: CompactedLog) -> None:
        if self._compaction is None and log_.due(self._compact_entries, len(self.transactions())):
            self._compaction = asyncio.create_task(
                self._compact(), name=f"pending-ack-log-compaction-{self._name}"
            )

    async def _compact(self) -> None:
        try:
            await self.compact()
        except (LedgerError, MetadataStoreError) as e:
            log.warning("%s: pending-ack log compaction failed (retried later): %s", self, e)
        finally:
            self._compaction = None

    async def compact(self) -> None:
        """Keep the acks of the open transactions only (see the module docstring).

        Raises:
            LedgerError, MetadataStoreError: a step failed (the log stays correct).
        """
        log_ = await self._ledger()

        async def keep() -> Sequence[bytes]:
            ops: list[bytes] = []
            for txn in sorted(self.transactions(), key=lambda t: (t.most, t.least)):
                individual, upto = self._held_by(txn)
                for i in range(0, len(individual), MAX_POSITIONS_PER_OP):
                    chunk = [p.as_pair() for p in individual[i : i + MAX_POSITIONS_PER_OP]]
                    ops.append(_encode(PendingAckOp((txn.most, txn.least), "ack", chunk)))
                if upto is not None:
                    op = PendingAckOp((txn.most, txn.least), "ack", [upto.as_pair()], True)
                    ops.append(_encode(op))
            for txn, acked in list(self._unsaved.items()):  # committed, not in a save
                self._keep_unsaved(txn, acked)
                for i in range(0, len(self._unsaved.get(txn, [])), MAX_POSITIONS_PER_OP):
                    chunk = [p.as_pair() for p in self._unsaved[txn][i : i + MAX_POSITIONS_PER_OP]]
                    ops.append(_encode(PendingAckOp((txn.most, txn.least), "ack", chunk)))
                if txn in self._unsaved:
                    ops.append(_encode(PendingAckOp((txn.most, txn.least), "COMMIT")))
            return ops

        await log_.compact(keep)
        if self._metrics is not None:
            self._metrics.txn_v4_log_compactions.add(1, {"log": "pending_ack"})

    @property
    def ledger(self) -> ManagedLedger | None:
        """The log's managed ledger, once opened (None before: this subscription has had
        no v4 ack here); the broker's repairer keeps its closed ledgers copied."""
        return None if self._log is None else self._log.ledger

    @property
    def log_entries(self) -> int:
        """Entries the log holds after its cursor (0 before it is opened)."""
        return 0 if self._log is None else self._log.entries

    @property
    def log_bytes(self) -> int:
        return 0 if self._log is None else self._log.size_bytes

    # ------------------------------------------------------------------ recovery

    async def recover(self) -> None:
        """Replay the pending-ack log (if this subscription ever had one)."""
        if await self._store.get(metadata_key(self._name)) is None:
            return
        log_ = await self._ledger()
        committed: list[TxnId] = []
        async for entries in log_.replay():
            for entry in entries:
                op = _decode_op(entry.payload)
                txn = TxnId(*op.txn)
                if op.op == "ack":
                    if txn not in self._ended:  # (one logged after its end: never held)
                        positions = [Position(*p) for p in op.positions]
                        self._reserve(txn, positions, cumulative=op.cumulative)
                    continue
                outcome = TxnAction(op.op).outcome
                self._ended[txn] = outcome
                if outcome is TxnState.COMMITTED:  # re-applied below: cursor acks repeat safely
                    committed.append(txn)
                else:
                    individual, _ = self._held_by(txn)
                    for position in individual:
                        self._individual.pop(position, None)
                    self._cumulative.pop(txn, None)
        for txn in committed:
            individual, upto = self._held_by(txn)
            await self._settle(txn, True, individual, upto)
            self._keep_unsaved(txn, individual)
        for txn in self.transactions():  # ended by its coordinator, or by the checks' sweep
            self._checks.recovered(txn, self)

    async def close(self) -> None:
        """Stop a compaction in flight, then close the log, writing its clean close.

        Raises:
            LedgerError, MetadataStoreError: the clean close could not be written.

        The compaction is cancelled: stopped at any step, the log replays to the same acks
        (the module docstring). Its ledger lets a metadata change in flight (the rollover's
        CAS) end first and takes up what it did, so the close's own write goes on from the
        record as it is; a cancel that abandoned the CAS had the close fenced by its own
        rollover, and the clean close lost. The wait is the store's answer to that one CAS,
        :data:`~segtxn.aio.CANCEL_GRACE_S` at most. The log is closed even if this close is
        itself cancelled meanwhile (a stop's time running out): left open, its writer task
        ran on and its file stayed locked ("held by another writer" on the next load). Its
        clean close then gets what is left of that cancel's grace (a silent store held it
        for ever: :func:`~segtxn.aio.run_to_end`), and so does the compaction when this close
        runs while its caller unwinds from a cancel (:func:`~segtxn.aio.cancel`): with a
        grace of its own, the close ended two graces after that cancel.
        """
        self._checks.forget(self)
        try:
            if self._compaction is not None:
                cancel(self._compaction)  # (sharing the grace of a cancel this unwinds from)
                await asyncio.gather(self._compaction, return_exceptions=True)
        finally:
            if self._log is not None:
                await self._log.close()
