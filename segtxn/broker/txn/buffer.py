"""PIP-471's transaction buffer for ``segment://`` topics (the interface a dispatcher
sees: :mod:`segtxn.broker.txn.visibility`).

A transactional send is one ledger append, then the transaction's writes record here
(``/txn-op/<txn>/w/<segment>``, indexed ``writes-by-segment``) must cover it; outcomes come
from the header cache. Beyond the PIP (docs/architecture.md, docs/design-notes.md):

- **Append, then record** (the PIP's order). Invariant: *an entry is visible only if a
  writes record covering it landed while its transaction was OPEN, and the transaction
  committed.* The record holds a range ``first..last``: an append at or before the ``last``
  of a record that already landed is covered without a store write (it was appended before
  that record's header check); any other is covered by the next rewrite of the record,
  which carries every append that completed meanwhile. If the rewrite fails (the
  transaction ended meanwhile, or the store failed) the entry is an **orphan**: it is
  recorded at ``/txn-orphans/<segment>/<position>`` before the send fails, and never
  shown; the record is never extended again. After a crash between the two steps, recovery
  scans the unresolved tail (from the durable watermark) and records every transactional
  entry outside its transaction's range as an orphan. Until an append's record is settled,
  the read horizon stays before it.
- **Outcomes outlive headers.** An abort is recorded at ``/txn-aborted/<segment>/<txn>``
  when it is materialized; the **resolved watermark** (``/txn-buffer/<segment>``) is the
  horizon up to which every entry is decided. A writes record is deleted only once the
  durable watermark has passed all of its transaction's entries here, so after header GC an
  entry is visible iff it is not an orphan and its transaction is not in the aborted index.
  Clean-up batches: the abort index entries and the watermark go in one store step, the
  records' deletes in another.
- **No polling**: dispatchers wait on ``changed``, set whenever the horizon may have moved.

Its parts: the records it keeps in the store and their shapes
(:mod:`segtxn.broker.txn.buffer_records`), reading them back at a load
(:mod:`segtxn.broker.txn.buffer_recovery`), the orphans (:mod:`segtxn.broker.txn.orphans`),
and the writes records' rewrites (:mod:`segtxn.broker.txn.oprecords`); here, what an append,
a decision and the clean-up do with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import msgspec

from segtxn.aio import settling
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.ordering import Turn
from segtxn.broker.spans import materialization_span
from segtxn.broker.txn.buffer_records import (
    AbortedTxn,
    BufferState,
    WritesDraft,
    as_position,
    before,
)
from segtxn.broker.txn.buffer_recovery import aborted_prefix, read_recorded, state_key
from segtxn.broker.txn.headers import HeaderCache
from segtxn.broker.txn.opdrafts import AppendInFlight
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.broker.txn.orphans import Orphans
from segtxn.broker.txn.visibility import OpenTransactions, TransactionBuffer
from segtxn.failures import retry_warning
from segtxn.ledger import LedgerError, ManagedLedger, Position, TrimResult
from segtxn.metastore import MetadataStore, MetadataStoreError, NotFound, Put
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T

log = logging.getLogger(__name__)


def _settled(outcome: asyncio.Future[Position] | BaseException) -> Position | BaseException:
    """A queued write's position, or what it failed with."""
    if not isinstance(outcome, asyncio.Future):
        return outcome
    if outcome.cancelled():
        return LedgerError("the write was cancelled")
    return outcome.exception() or outcome.result()


class MetadataTransactionBuffer(TransactionBuffer):
    """PIP-471's transaction buffer for one ``segment://`` (see the module docstring)."""

    def __init__(
        self,
        segment: str,
        ledger: ManagedLedger,
        *,
        store: MetadataStore,
        headers: HeaderCache,
        metrics: BrokerMetrics,
        ops: OpRecordWriter,
    ) -> None:
        super().__init__()
        self.segment = segment
        self._metrics = metrics
        self._ops = ops
        self._ledger = ledger
        self._store = store
        self._headers = headers
        self._state_key = state_key(segment)
        self._aborted_prefix = aborted_prefix(segment)
        self._writes: dict[TxnId, list[Position]] = {}
        """Entries here of transactions whose writes records still exist (after recovery:
        the first and last of each range)."""
        self._records: dict[TxnId, WritesDraft] = {}
        self._appending: dict[TxnId, int] = {}
        """Appends in flight per transaction: its record is not cleaned while one may still
        extend what it covers."""
        self._open_first = OpenTransactions()
        self._floors: list[Position] = []
        """For each append in flight: the last entry before it (the horizon stays there)."""
        self._aborted: dict[TxnId, AbortedTxn] = {}
        self._orphans = Orphans(segment, store)
        self._watermark: Position | None = None
        """The durable resolved watermark."""
        self._cleanable: dict[TxnId, Position] = {}
        """Decided transactions -> their last entry here; cleaned once the watermark passes."""
        self._cleaner_wake = asyncio.Event()
        self._cleaner: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ horizon

    @property
    def max_read_position(self) -> Position | None:
        last = self._ledger.last_confirmed
        if last is None:
            return None
        horizon = last
        if self._floors:
            horizon = min(horizon, *self._floors)
        unsettled = self._orphans.floor()
        if unsettled is not None:
            horizon = min(horizon, unsettled)
        if self._open_first:
            horizon = min(horizon, before(min(self._open_first.values())))
        return horizon

    def oldest_open_age_s(self) -> float | None:
        return self._open_first.oldest_age_s()

    def is_orphan(self, position: Position) -> bool:
        return position in self._orphans

    def visible(self, txn: TxnId | None, position: Position) -> bool:
        if txn is None:
            return True
        if position in self._orphans:
            return False
        if txn in self._cleanable:  # decided here: that stands, whatever its header does next
            return txn not in self._aborted
        if txn in self._writes:
            header = self._headers.cached(txn)
            return header is not None and header.state is TxnState.COMMITTED
        return txn not in self._aborted

    # ------------------------------------------------------------------ appends

    async def append(self, txn: TxnId, payload: bytes, turn: Turn) -> Position:
        """Read the header (concurrently with the producer's earlier sends), then, in the
        producer's turn, one ledger append; then the writes record must cover it (a
        rewrite guarded by the header's version, unless a landed one covers it already).

        Raises:
            ServerError(TransactionNotFound): no such transaction.
            ServerError(TransactionConflict): the transaction is no longer open (also when
                it ends between the append and the record: the entry is then an orphan).
            ServerError(PersistenceError / TopicTerminatedError)
        """
        outcome = (await self.append_together(txn, [(payload, turn)]))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def append_together(
        self, txn: TxnId, entries: list[tuple[bytes, Turn]], *, ops: Sequence[str] = ()
    ) -> list[Position | BaseException]:
        """Entries of ``txn`` that arrived together: one header read, each appended in its
        turn, their writes awaited together, then one rewrite of the writes record covers
        them all (see :meth:`append` for each one's errors). A send at a time made each wait
        for the previous one's wake-up, and a batch of a hundred cost a hundred turns of the
        event loop (issue 16).

        A cancel before any entry is queued gives them all up (raised). Once one is queued,
        a cancel gives up only those not yet queued (refused, ServiceNotReady) and waits for
        the queued ones to be recorded or orphaned, then returns every outcome: the caller's
        de-duplication must learn what was stored (a resend is a duplicate, not a second
        copy), and then ends as cancelled (``asyncio.current_task().cancelling()``)."""
        self._headers.listen(txn, self._on_header, materializes=True)
        self._appending[txn] = self._appending.get(txn, 0) + 1
        try:
            return await self._append_together(txn, entries, ops)
        finally:
            for _, turn in entries:
                turn.release()
            if self._appending[txn] == 1:
                del self._appending[txn]
                if txn not in self._writes:  # nothing of it here: its outcome changes
                    self._headers.forget(txn, self._on_header)  # nothing (nor its watch)
            else:
                self._appending[txn] -= 1

    async def _append_together(
        self, txn: TxnId, entries: list[tuple[bytes, Turn]], ops: Sequence[str]
    ) -> list[Position | BaseException]:
        header, version = await self._headers.get(txn)  # a store read on a cache miss
        if header is None:
            missing = ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}")
            return [missing] * len(entries)
        outcomes: list[asyncio.Future[Position] | BaseException] = []
        floor: Position | None = None
        appended = self._ops.appending(txn)  # its steps wait for these writes' record
        try:
            try:
                for payload, turn in entries:
                    await turn.wait()  # the read may end in any order; the appends may not
                    header = self._headers.cached(txn) or header  # it may have ended meanwhile
                    if header.state is not TxnState.OPEN:
                        turn.release()
                        outcomes.append(
                            ServerError(
                                ErrorName.TRANSACTION_CONFLICT,
                                f"{txn} is {header.state}: no more writes",
                            )
                        )
                        continue
                    if floor is None:
                        floor = self._ledger.last_confirmed or Position(0, -1)
                        self._floors.append(floor)
                    try:
                        outcomes.append(await turn.enqueue(self._ledger, payload))
                    except (LedgerError, ServerError) as e:
                        outcomes.append(e)
            except asyncio.CancelledError:
                if not any(isinstance(o, asyncio.Future) for o in outcomes):
                    raise  # nothing queued: all given up
                stopped = ServerError(ErrorName.SERVICE_NOT_READY, "stopped before it was stored")
                outcomes += [stopped] * (len(entries) - len(outcomes))
            # Queued entries are recorded or orphaned whatever becomes of this task: in a
            # task of their own, waited for through any cancel (the floor stays till then).
            # Its outcome comes through ``finished``: a loop turn sooner than through a shield
            # (the client's commit() waits for these receipts: ``settling``, issue 16).
            loop = asyncio.get_running_loop()
            finished: asyncio.Future[list[Position | BaseException]] = loop.create_future()
            finishing = loop.create_task(
                settling(finished, self._finish(txn, version, outcomes, appended, ops)),
                name=f"txn-append-{txn}",
            )
            self._ops.settled_by(finishing)  # (it may orphan them: the store must outlive it)
            try:
                return await finished
            except asyncio.CancelledError:  # (``finished`` is cancelled with it; not the task)
                if finishing.done():
                    raise
            while True:
                try:
                    return await asyncio.shield(finishing)
                except asyncio.CancelledError:
                    if finishing.done():
                        raise
        finally:
            appended.end()  # (ended already by its record, unless this ends before one)
            if floor is not None:
                self._floors.remove(floor)
                self._changed()

    async def _finish(
        self,
        txn: TxnId,
        version: int,
        outcomes: list[asyncio.Future[Position] | BaseException],
        appended: AppendInFlight,
        ops: Sequence[str],
    ) -> list[Position | BaseException]:
        """Await the queued writes, then have one record cover them (or orphan them all);
        ``appended`` ends once that record is queued (or nothing is to be recorded).
        ``ops``: each outcome's operation name (empty: none given)."""
        try:
            written = [o for o in outcomes if isinstance(o, asyncio.Future)]
            if written:
                await asyncio.wait(written)
            positions = [_settled(o) for o in outcomes]
            stored = [p for p in positions if isinstance(p, Position)]
            if not stored:
                return positions
            names = [op for op, p in zip(ops, positions, strict=False) if isinstance(p, Position)]
            try:
                await self._record(txn, version, stored, appended, names)
            except ServerError as e:
                try:
                    await self._orphans.add_all(txn, stored)
                finally:
                    if self._orphans.unsettled:  # the clean-up records them
                        self._cleaner_wake.set()
                return [e if isinstance(p, Position) else p for p in positions]
        finally:
            appended.end()
        self._track(txn, stored)
        return positions

    async def _record(
        self,
        txn: TxnId,
        version: int,
        positions: list[Position],
        appended: AppendInFlight,
        ops: Sequence[str],
    ) -> None:
        """Make the writes record cover ``positions``: nothing to write when a landed one
        does (they were appended before that record's header check passed); otherwise a
        rewrite with a check that the header is still at ``version`` (the late-write race
        is settled there), shared with every append waiting for it.

        Raises ServerError: see :meth:`OpRecordWriter.write`.
        """
        draft = self._records.get(txn)
        if draft is None:
            draft = self._records[txn] = WritesDraft(txn, self.segment, positions[0])
        if all(draft.covers(position) for position in positions):
            draft.refuse_if_failed()
            self._ops.covered(txn, ops)
            return
        for position in positions:
            draft.extend(position)
        try:
            await self._ops.write(txn, version, draft, appended, owner=self._ledger, ops=ops)
        except ServerError:
            if txn not in self._writes and draft.durable is None:
                self._records.pop(txn, None)  # nothing of it here: nothing to clean up
            raise

    def _track(self, txn: TxnId, positions: list[Position]) -> None:
        self._writes.setdefault(txn, []).extend(positions)
        header = self._headers.cached(txn)
        if header is not None and header.state.final:
            self._materialize(txn, header)  # decided while we were recording: once for all
        else:  # the lowest entry holds the horizon: runs of one transaction may land in any
            # order (two producers, or a run that waited for its producer's turn)
            first = min(positions)
            held = self._open_first.get(txn)
            if held is None or first < held:
                self._open_first[txn] = first

    # ------------------------------------------------------------------ outcomes

    def _on_header(self, txn: TxnId, header: T.TxnHeader | None) -> None:
        """A final header decides ``txn`` here once. Later news of it changes nothing: a
        decided header never changes, but it can be deleted before this segment cleaned up
        (the coordinator's GC with ``abandon_after_s``), and taking that for an abort hid
        committed data already delivered."""
        if header is not None and not header.state.final:
            return
        if txn in self._writes and txn not in self._cleanable:
            self._materialize(txn, header)

    def _materialize(self, txn: TxnId, header: T.TxnHeader | None) -> None:
        """Apply a decision locally (no ledger write: a sealed segment does this too)."""
        positions = self._writes.get(txn, [])
        if not positions:
            return
        self._open_first.pop(txn, None)
        state = header.state if header is not None else TxnState.ABORTED
        with materialization_span(self.segment, txn, state, header, entries=len(positions)):
            self._apply(txn, header, state, positions)

    def _apply(
        self, txn: TxnId, header: T.TxnHeader | None, state: TxnState, positions: list[Position]
    ) -> None:
        """Make the outcome count here: visible, or hidden with its range recorded."""
        self._metrics.txn_materialized.add(1, {"outcome": state.value, "part": "writes"})
        if header is not None and header.finalized_ms is not None and state is TxnState.COMMITTED:
            # the two clocks may disagree a little: never a negative latency
            visible_s = max(0.0, time.time() - header.finalized_ms / 1000)
            self._metrics.txn_commit_to_visible.record(visible_s)
        if header is None:
            log.error(
                "%s: header of %s vanished with op records left: hiding it", self.segment, txn
            )
        log.debug(
            "txn %s: %s materialized on %s (%d entries, %s..%s)",
            txn,
            state.value,
            self.segment,
            len(positions),
            min(positions),
            max(positions),
        )
        if state is TxnState.ABORTED:
            self._aborted[txn] = AbortedTxn(
                (min(positions).ledger_id, min(positions).entry_id),
                (max(positions).ledger_id, max(positions).entry_id),
            )
        self._cleanable[txn] = max(positions)
        self._cleaner_wake.set()
        self._changed()

    # ------------------------------------------------------------------ clean-up

    async def _clean(self) -> None:
        """Persist the watermark, then delete op records it has passed; settle orphans."""
        while True:
            await self._cleaner_wake.wait()
            self._cleaner_wake.clear()
            try:
                if await self._orphans.settle():
                    self._changed()
                await self._clean_once()
            except MetadataStoreError as e:
                retry_warning(log, e, "%s: clean-up failed (%s); retrying", self.segment, e)
                await asyncio.sleep(1.0)  # the store is failing: retry at a gentle pace
                self._cleaner_wake.set()

    async def _clean_once(self) -> None:
        horizon = self.max_read_position
        if horizon is None:
            return
        ready = {
            txn: last
            for txn, last in self._cleanable.items()
            if last <= horizon and txn not in self._appending
        }
        if not ready:
            return
        # Aborts and the watermark before the deletes (in the same step when they fit):
        # an abort index entry must outlive the writes record it stands for.
        puts = [
            Put(self._aborted_prefix + txn.key, msgspec.json.encode(aborted))
            for txn in ready
            if (aborted := self._aborted.get(txn)) is not None
        ]
        watermark = max(ready.values())
        if self._watermark is None or watermark > self._watermark:
            state = BufferState((watermark.ledger_id, watermark.entry_id))
            puts.append(Put(self._state_key, msgspec.json.encode(state)))
        await self._ops.clean(puts, [self._records[t].key for t in ready if t in self._records])
        self._watermark = watermark if self._watermark is None else max(self._watermark, watermark)
        for txn in ready:
            self._records.pop(txn, None)
            self._writes.pop(txn, None)
            self._headers.forget(txn, self._on_header)
            del self._cleanable[txn]

    # ------------------------------------------------------------------ recovery

    async def recover(self) -> None:
        """Rebuild from the store (no log replay: :func:`read_recorded`): the aborted index,
        orphans, the op records of this segment, their headers; then classify the
        unresolved tail."""
        recorded = await read_recorded(self._store, self.segment, self._metrics)
        self._watermark = recorded.watermark
        self._aborted.update(recorded.aborted)
        await self._orphans.load()
        for txn, draft in recorded.records.items():
            self._records[txn] = draft
            self._writes[txn] = [draft.first, draft.last]
        await self._orphans.find(self._ledger, self._watermark, self._covers)
        for txn, positions in self._writes.items():
            self._headers.listen(txn, self._on_header, materializes=True)
            header, _ = await self._headers.get(txn)
            if header is not None and header.state is TxnState.OPEN:
                self._open_first[txn] = min(positions)
        for txn in list(self._writes):
            header = self._headers.cached(txn)
            if txn not in self._open_first:
                self._materialize(txn, header)
        self._cleaner = asyncio.create_task(self._clean(), name=f"txn-clean-{self.segment}")
        self._cleaner_wake.set()

    def _covers(self, txn: TxnId, position: Position) -> bool:
        draft = self._records.get(txn)
        return draft is not None and draft.covers(position)

    async def trimmed(self, result: TrimResult) -> None:
        """Forget aborts and orphans whose entries were all in the trimmed ledgers (the
        oldest ones: every position in a ledger up to the last trimmed one is gone)."""
        if not result.ledgers:
            return
        first = Position(max(result.ledgers) + 1, -1)  # before anything retained
        for txn, aborted in list(self._aborted.items()):
            if as_position(aborted.last) < first and txn not in self._writes:
                del self._aborted[txn]
                with contextlib.suppress(NotFound):
                    await self._store.delete(self._aborted_prefix + txn.key)
        await self._orphans.trimmed(first)

    async def close(self) -> None:
        if self._cleaner is not None:
            self._cleaner.cancel()
            await asyncio.gather(self._cleaner, return_exceptions=True)
        for txn in list(self._writes):
            self._headers.forget(txn, self._on_header)
