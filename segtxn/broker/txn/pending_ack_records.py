"""Pending acknowledgments of ``segment://`` subscriptions, kept in op records.

PIP-31's PENDING_ACK state (its rules: :mod:`segtxn.broker.txn.pending_ack`), stored the
PIP-471 way: a transaction's acks on one subscription are one acks record
``/txn-op/<txn>/a/<segment>/<sub>/<chunk>`` (indexed ``acks-by-segment-sub``), rewritten as
acks arrive in the same atomic step as a check that the header is still OPEN (one rewrite
carries every ack that arrived while the previous one was in flight). When the header watch
reports the outcome, commit applies the acks to the cursor and abort releases the messages;
then the records are deleted — after a commit, only once a cursor save covers its acks (one
save for every commit of the last :data:`SAVE_LINGER_S`, not one each). A crash half-way
repeats the (idempotent) materialization on recovery, which rebuilds everything from the
index.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable

import msgspec

from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.spans import materialization_span
from segtxn.broker.txn.headers import HeaderCache
from segtxn.broker.txn.opdrafts import Draft, Owner
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.broker.txn.pending_ack import ReservingPendingAckStore
from segtxn.failures import retry_warning
from segtxn.ledger import LedgerError, ManagedCursor, Position
from segtxn.metastore import MetadataStore, MetadataStoreError
from segtxn.protocol import txnops
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T

log = logging.getLogger(__name__)

SAVE_LINGER_S = 0.25
"""How long the acks of committed transactions wait, applied in memory, for others to be
saved with them in one cursor write (their records are kept until that write)."""
SAVE_RETRY_S = 1.0
"""The pause before saving again while the store fails."""


_HOLD_RANK = {TxnState.ABORTED: 0, TxnState.OPEN: 1, TxnState.COMMITTED: 2}
"""Which record holds a position several hold, after a crash (:meth:`recover`)."""


def _state(header: T.TxnHeader | None) -> TxnState:
    """A transaction's state by its header; a vanished header counts as aborted."""
    return TxnState.ABORTED if header is None else header.state


class _Acks(Draft):
    """One chunk of a transaction's acks record on a subscription."""

    def __init__(self, txn: TxnId, segment: str, subscription: str, chunk: int) -> None:
        super().__init__(T.acks_key(txn, segment, subscription, chunk))
        self.segment, self.subscription, self.chunk = segment, subscription, chunk
        self.individual: set[Position] = set()
        self.cumulative: Position | None = None

    @property
    def full(self) -> bool:
        return len(self.individual) >= T.MAX_ACKS_PER_RECORD

    def add(self, positions: list[Position], *, cumulative: bool) -> None:
        if cumulative:
            upto = max(positions)
            self.cumulative = upto if self.cumulative is None else max(self.cumulative, upto)
        else:
            self.individual.update(positions)

    def snapshot(self) -> T.AcksRecord:
        ranges: list[T.AckRange] = []
        for ledger_id, group in itertools.groupby(sorted(self.individual), lambda p: p.ledger_id):
            entries = [p.entry_id for p in group]
            first = previous = entries[0]
            for entry in entries[1:]:
                if entry != previous + 1:
                    ranges.append(T.AckRange(ledger_id, first, previous))
                    first = entry
                previous = entry
            ranges.append(T.AckRange(ledger_id, first, previous))
        upto = None if self.cumulative is None else self.cumulative.as_pair()
        return T.AcksRecord(self.segment, self.subscription, ranges, upto)

    def landed(self, record: T.OpRecord) -> None:
        """Nothing to keep: the reservations are the in-memory truth."""

    @classmethod
    def recovered(cls, txn: TxnId, key: str, record: T.AcksRecord) -> _Acks:
        draft = cls(txn, record.segment, record.subscription, T.chunk_of_acks_key(key))
        for r in record.ranges:
            draft.individual.update(
                Position(r.ledger_id, e) for e in range(r.first_entry, r.last_entry + 1)
            )
        if record.cumulative is not None:
            draft.cumulative = Position(*record.cumulative)
        return draft


class MetadataPendingAckStore(ReservingPendingAckStore):
    def __init__(
        self,
        segment: str,
        subscription: str,
        *,
        cursor: ManagedCursor,
        ledger: Owner,
        store: MetadataStore,
        headers: HeaderCache,
        release: Callable[[list[Position]], None],
        metrics: BrokerMetrics,
        ops: OpRecordWriter,
    ) -> None:
        super().__init__(cursor, release)
        self._ledger = ledger
        """The segment's ledger: acks records are written only while it is this broker's."""
        self.segment = segment
        self.subscription = subscription
        self._store = store
        self._headers = headers
        self._metrics = metrics
        self._ops = ops
        self._records: dict[TxnId, list[_Acks]] = {}
        """Each transaction's acks record here, chunk by chunk (the last one grows)."""
        self._checking: dict[TxnId, int] = {}
        """Acks of each transaction between listening to its header and their draft."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._after_save: list[tuple[str, Position | None]] = []
        """Records of committed transactions whose acks the cursor has not saved yet, each
        with the last position it acknowledges individually (None: none)."""
        self._saver: asyncio.Task[None] | None = None
        self._save_now = asyncio.Event()
        self._queued: set[TxnId] = set()
        """Transactions with a materialization task that has not looked at their holds."""

    async def ack(
        self,
        txn: TxnId,
        positions: list[Position],
        *,
        cumulative: bool,
        guard: Callable[[], None] | None = None,
    ) -> None:
        """Raises ServerError(TransactionNotFound / TransactionConflict)."""
        self._headers.listen(txn, self._on_header, materializes=True)
        self._checking[txn] = self._checking.get(txn, 0) + 1
        try:
            header, version = await self._headers.get(txn)
            if header is None:
                raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}")
            if header.state is not TxnState.OPEN:
                raise ServerError(ErrorName.TRANSACTION_CONFLICT, f"{txn} is {header.state}")
            if guard is not None:
                guard()
            self._check(txn, positions, cumulative=cumulative)
        except BaseException:
            # An ack that passed these checks has a draft (made with no await after
            # them): with none, and no other ack of it being checked, nothing of the
            # transaction is here to materialize (in scoped mode its point watch goes).
            if self._checking[txn] == 1 and txn not in self._records:
                self._headers.forget(txn, self._on_header)
            raise
        finally:
            if self._checking[txn] == 1:
                del self._checking[txn]
            else:
                self._checking[txn] -= 1
        draft = self._draft(txn)
        # Checked and reserved with no await in between: a concurrent ack of the same
        # position by another transaction sees the reservation and conflicts.
        undo = self._reserve(txn, positions, cumulative=cumulative)
        draft.add(positions, cumulative=cumulative)
        try:
            await self._ops.write(
                txn,
                version,
                draft,
                owner=self._ledger,
                ops=[
                    txnops.ack_op(self.segment, self.subscription, p.as_pair(), cumulative)
                    for p in positions
                ],
            )
        except BaseException:
            # A failed draft is never written again (a record written before the failure
            # is deleted when the transaction's aborted outcome is materialized).
            self._unreserve(txn, undo, cumulative=cumulative)
            raise
        cached = self._headers.cached(txn)
        if cached is not None and cached.state.final:  # decided while we were writing
            self._on_header(txn, cached)

    def _draft(self, txn: TxnId) -> _Acks:
        """The chunk new acks of ``txn`` go to (a new one when the last is full).

        Raises ServerError: an earlier ack of ``txn`` here could not be recorded.
        """
        chunks = self._records.setdefault(txn, [])
        for chunk in chunks:
            chunk.refuse_if_failed()
        if not chunks or chunks[-1].full:
            chunks.append(_Acks(txn, self.segment, self.subscription, len(chunks)))
        return chunks[-1]

    # ------------------------------------------------------------------ outcomes

    def _on_header(self, txn: TxnId, header: T.TxnHeader | None) -> None:
        """Materialize a final outcome of ``txn``: in a task, unless one queued already
        will see everything held now (it looks under the lock), or nothing is held or
        recorded for ``txn`` here. An ack of ``txn`` cannot be held later: its header is
        final, and an ack reserves only after finding it OPEN, with no await between. The
        outcome arrives twice on a one-step commit (the watch, and the ack whose step
        carried the commit): one task, not two, per transaction (issue 16)."""
        if header is not None and not header.state.final:
            return
        if txn in self._queued:
            return
        if txn not in self._records and not self._holds_any(txn):
            return
        self._queued.add(txn)
        task = asyncio.create_task(
            self._materialize(txn, header), name=f"pending-ack-{self.segment}-{txn}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _materialize(self, txn: TxnId, header: T.TxnHeader | None) -> None:
        async with self._lock:
            self._queued.discard(txn)  # holds from now on: another task
            individual, upto = self._held_by(txn)
            if not individual and upto is None and txn not in self._records:
                return
            committed = header is not None and header.state is TxnState.COMMITTED
            outcome = TxnState.COMMITTED if committed else TxnState.ABORTED
            with materialization_span(
                self.segment, txn, outcome, header, subscription=self.subscription
            ):
                await self._apply(txn, committed, outcome, individual, upto)

    async def _apply(
        self,
        txn: TxnId,
        committed: bool,
        outcome: TxnState,
        individual: list[Position],
        upto: Position | None,
    ) -> None:
        """Apply an outcome to the subscription (under the lock, in its span)."""
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
            # A commit's acks are made durable by the cursor's next save, which its
            # records wait for: until then they are what a recovery applies again.
            await self._settle(txn, committed, individual, upto, wait=False)
            chunks = self._records.pop(txn, [])
            if committed:
                self._after_save.extend((c.key, max(c.individual, default=None)) for c in chunks)
                self._save_soon()
            else:
                self._ops.discard([c.key for c in chunks])
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

    def _save_soon(self) -> None:
        if self._saver is None:
            self._saver = asyncio.create_task(
                self._save_then_discard(), name=f"pending-ack-save-{self.segment}"
            )

    async def _save_then_discard(self) -> None:
        """After :data:`SAVE_LINGER_S` (or at close), save the cursor once for every commit
        materialized meanwhile, then delete their records: one cursor write for them all
        instead of one each. While the store fails the save is tried again; if the cursor is
        closed or the segment has another owner, the records stay, and the next load of the
        segment applies them again (materializing is idempotent)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SAVE_LINGER_S):
                await self._save_now.wait()
        self._saver = None
        records, self._after_save = self._after_save, []
        while True:
            try:
                await self._cursor.flush()
                break
            except (MetadataStoreError, LedgerError) as e:
                again = isinstance(e, MetadataStoreError) and not self._save_now.is_set()
                retry_warning(
                    log,
                    e,
                    "%s subscription %s: saving the cursor after commits failed (%s); %s",
                    self.segment,
                    self.subscription,
                    e,
                    "trying again" if again else "their acks are applied again on the next load",
                )
                if not again:
                    return
                await asyncio.sleep(SAVE_RETRY_S)
        # A record whose acks the save left out (past the cursor's max_persisted_ranges)
        # stays: it is what a recovery applies again, or the commit's acks would be lost
        # and their messages delivered again. The save after the next commit looks again.
        saved = [key for key, last in records if last is None or self._cursor.saved(last)]
        self._after_save.extend(r for r in records if r[0] not in saved)
        self._ops.discard(saved)
        self._release([])  # the dispatcher ends a sealed segment only once its cursor is saved

    # ------------------------------------------------------------------ recovery

    async def recover(self) -> None:
        started = time.perf_counter()
        ops = await self._store.index_range(T.IDX_ACKS, (self.segment, self.subscription))
        self._metrics.txn_index_query.record(time.perf_counter() - started)
        for entry in sorted(ops.entries, key=lambda e: e.key):  # each one's chunks in order
            txn = T.txn_of_op_key(entry.key)
            try:
                record = T.decode_op(entry.value)
            except msgspec.DecodeError as e:
                log.error("%s: op record %s unreadable (%s): ignored", self.segment, entry.key, e)
                continue
            if not isinstance(record, T.AcksRecord):
                continue
            self._records.setdefault(txn, []).append(_Acks.recovered(txn, entry.key, record))
        headers: dict[TxnId, T.TxnHeader | None] = {}
        for txn in self._records:
            self._headers.listen(txn, self._on_header, materializes=True)
            headers[txn], _ = await self._headers.get(txn)
        # Several records may hold one position: an aborted transaction's record is deleted
        # only after its abort released the position, and a later transaction may have
        # acknowledged it meanwhile (and committed). The position is the one of the
        # transaction that took it last: a committed one's over any other, an open one's
        # over an aborted one's. Taken by key order instead, a later aborted record could
        # take back a committed acknowledgment, and its release deliver the message again.
        for txn in sorted(self._records, key=lambda t: _HOLD_RANK[_state(headers[t])]):
            for draft in self._records[txn]:
                for position in draft.individual:
                    self._individual[position] = txn
                if draft.cumulative is not None:
                    before = self._cumulative.get(txn, draft.cumulative)
                    self._cumulative[txn] = max(before, draft.cumulative)
        for txn, header in sorted(headers.items(), key=lambda h: -_HOLD_RANK[_state(h[1])]):
            if header is None or header.state.final:  # commits first, then aborts
                await self._materialize(txn, header)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._saver is not None:  # save and clean up now, not on the next load
            self._save_now.set()
            await asyncio.gather(self._saver, return_exceptions=True)
        for txn in list(self._records):
            self._headers.forget(txn, self._on_header)
