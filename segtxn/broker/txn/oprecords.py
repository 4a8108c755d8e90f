"""Writing op records: one per transaction and segment (or subscription), rewritten as it
grows, several per store step.

A participant keeps each op record's content in memory (a :class:`Draft`) and asks this
writer to make it durable with a check that the transaction's header is still at the
version it had while OPEN. While a step for a transaction is in flight, the drafts that
change meanwhile — from any segment or subscription on this broker — wait, and the next
step writes each of them once, with whatever it holds by then: a hundred appends in flight
together cost one or two store steps, not a hundred records (issue 16; bench/peer.py's
``store w/msg``). A step also waits, up to :data:`APPEND_WAIT_S`, for the runs of appends
of its transaction that this broker is writing when it begins (not for later ones:
:meth:`OpRecordWriter.appending`): a consume-transform-produce transaction's acks record is
ready at once, its writes records only once their entries are durable, and without the
wait the acks took a step of their own and the writes waited for it, two store round trips
on every transaction's path instead of one (bench/peer.py ``txn 1``). A step is all or
nothing, so a failed one fails every waiter in it, which is the outcome each would have had
alone (the header check is shared); a draft whose step failed is **failed for good**: its
record may hold less than its participant believes (or, after an ambiguous store error,
more), so nothing more is ever recorded in it and the transaction cannot commit what it
would have covered.

**Fenced by the segment's ledger.** A step also checks that the ledger of each segment it
writes for (its ``owner``) still has its metadata record at the version this broker last
wrote. Whoever opens a segment's ledger changes that record (recovery always does), and only
then reads the segment's op records to decide which of its transactional entries are
orphans; so a record written by a broker that lost the segment meanwhile (paused past its
session while another took it over) is refused rather than landing after that decision,
and an entry the new owner will never show cannot be acknowledged as part of a transaction
that commits. The header check alone let that happen (tests/broker/test_lost_registration.py).
A check that fails because of this broker's own change of the record (a rollover, a trim)
is tried again with the new version; one that cannot tell whose change it met (its own is in
doubt, and the store fails the read that would tell) is the store's trouble, not a fence.

Clean-up after outcomes goes through the same writer, batched across the broker
(:mod:`segtxn.broker.txn.opclean`).

**The one-step commit** (:meth:`OpRecordWriter.commit`): a client whose transaction's
operations all went to this broker asks it to commit, naming how many operations it made
and their digest (:mod:`segtxn.protocol.txnops`). Once the operations whose records this
writer queued for the transaction are exactly those, the step that writes the last of them
carries the header's compare-and-set to COMMITTED in place of its check: one store step
for the records and the decision, where the coordinator's END_TXN would be a second one
after it (issue 16; docs/design-notes.md). The step is all or nothing, so the decision
lands with every record it needs or not at all. A store error that leaves the step's fate
unknown is settled before anything is answered or orphaned: an abort from the OPEN version
(it lands: the step did not) or, refused, a read of the header (the COMMITTED header the step
wrote: it did; one of anyone else's: it did not).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import msgspec

from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.txn.commits import STOPPING, CommitAnswer, Commits, PendingCommit
from segtxn.broker.txn.headers import HeaderCache
from segtxn.broker.txn.opclean import OpRecordCleaner
from segtxn.broker.txn.opdrafts import AppendInFlight, Draft, Owner, Waiting, requeue
from segtxn.broker.txn.oprefusals import (
    fail_waiters,
    owner_refusal,
    refuse_stopped,
    stopping,
    store_failed,
)
from segtxn.failures import retry_warning
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import (
    BadVersion,
    Check,
    MetadataStore,
    MetadataStoreError,
    NotFound,
    Op,
    Put,
    StoreAccessDenied,
    StoreFull,
)
from segtxn.metastore import InvalidArgument as StoreInvalidArgument
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T

MAX_RECORDS_PER_STEP = 40
"""Each op record costs the store two physical writes (the record and its index entry);
40 leave room under the 128 a step may hold."""
SETTLE_RETRY_S = 0.5
"""How often a commit whose step's fate is unknown asks the store again."""
APPEND_WAIT_S = 0.02
"""How long a step waits for its transaction's appends in flight on this broker (so their
records join it): a little over a slow disk's sync, never a stall when appends keep coming."""
log = logging.getLogger(__name__)
MAX_STEP_BYTES = 512 * 1024
"""Encoded records per step (each is also copied into its index entry): a third of the
store's request limit."""
STEP_END_WAIT_S = 1.0
"""How long a closing writer lets its steps in flight end, their waiters then told the real
outcome, before it cancels them (a step is one store round trip; a commit's settling, while
the store fails, is cut then: CommitUnknown)."""


class OpRecordWriter:
    def __init__(
        self,
        store: MetadataStore,
        metrics: BrokerMetrics,
        headers: HeaderCache | None = None,
        held_back: Callable[[], bool] | None = None,
    ) -> None:
        """``headers``: the broker's header cache (the one-step commit's counts of a
        transaction are dropped when it tells the transaction is over). ``held_back``: see
        :meth:`Commits.wait_counted`; :meth:`hurry` when it becomes true."""
        self._store = store
        self._metrics = metrics
        self._queues: dict[TxnId, dict[str, Waiting]] = {}
        self._flushers: dict[TxnId, asyncio.Task[None]] = {}
        self._settling: set[asyncio.Task[Any]] = set()
        """Tasks that act on a write's answer through the store (:meth:`settled_by`)."""
        self._appends: dict[TxnId, set[AppendInFlight]] = {}
        """Runs of appends in flight per transaction (:meth:`appending`)."""
        self._commits = Commits(headers, held_back)
        self.hurry = self._commits.hurry
        self._cleaner = OpRecordCleaner(store)
        self._closed = False
        """Set by :meth:`close`: no step begins from then on, and a write is refused."""
        self.steps_in_flight = 0
        """Steps sent to the store and not yet answered (a gauge: a store that has stopped
        answering shows here first)."""

    def appending(self, txn: TxnId) -> AppendInFlight:
        """Say that appends of ``txn`` are being written here and their record will follow:
        steps of ``txn`` wait (a little) for it. End it with :meth:`write` or its ``end``."""
        return AppendInFlight(self._appends, txn)

    async def _appends_written(self, txn: TxnId) -> None:
        """Wait until the runs of appends of ``txn`` in flight here now have ended (not
        those that start meanwhile: a transaction that keeps sending must not hold its
        records back), :data:`APPEND_WAIT_S` at most."""
        runs = self._appends.get(txn)
        if runs:
            await asyncio.wait([run.ended for run in runs], timeout=APPEND_WAIT_S)

    async def write(
        self,
        txn: TxnId,
        version: int,
        draft: Draft,
        appended: AppendInFlight | None = None,
        *,
        owner: Owner | None = None,
        ops: Collection[str] = (),
    ) -> None:
        """Return once a step that began after this call wrote ``draft`` (with everything
        it held then), checked against the header at ``version`` and, with ``owner`` (the
        ledger of the segment the record is for), against that ledger's metadata record at
        the version this broker last wrote. ``appended``: the run of appends this record
        covers, ended once the draft is queued. ``ops``: the names of the operations the
        record now covers (:mod:`segtxn.protocol.txnops`), for the one-step commit.

        Raises:
            ServerError(TransactionConflict): the transaction ended meanwhile, or
                ``owner``'s ledger was opened by another broker (the segment is not served
                here any more).
            ServerError(ServiceNotReady, PersistenceError, ...): the store failed (the
                record may hold it or not), or could not be read to tell whether ``owner``'s
                ledger was opened by another broker (:mod:`~segtxn.broker.txn.oprefusals`).
            ServerError: ``draft`` failed earlier (its error's name); ServiceNotReady, the
                writer is closed or closing (the broker is stopping: :meth:`close`).
        """
        try:
            if self._closed:
                raise stopping()
            draft.refuse_if_failed()
            queue = self._queues.setdefault(txn, {})
            waiting = queue.get(draft.key)
            if waiting is None:
                waiting = queue[draft.key] = Waiting(draft, version, owner)
            done = asyncio.get_running_loop().create_future()
            waiting.waiters.append(done)
            if ops:
                self._commits.count(txn, ops)
        finally:
            if appended is not None:
                appended.end()
        self._start_flusher(txn)
        # Its own future, unshielded: a shield cost every waiter one more loop turn after its
        # step (design note 21); a cancelled caller cancels only it, which the step skips.
        await done

    def settled_by(self, task: asyncio.Task[Any]) -> None:
        """``task`` acts on the answer of a :meth:`write` through the store (a transaction
        buffer orphaning the entries a refused record was to cover): :meth:`close`, which
        refuses every waiter, returns once such tasks have ended, so that the broker's
        store (closed after this writer) outlives the writes they make."""
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def covered(self, txn: TxnId, ops: Collection[str]) -> None:
        """Operations ``ops`` of ``txn`` are covered by a record that landed already (no
        step needed): they count for the one-step commit all the same, and a commit they
        complete is carried by a step of its own (no write would start one)."""
        self._commits.count(txn, ops)
        if self._commits.matched(txn):
            self._start_flusher(txn)

    def refused(self, txn: TxnId, why: str) -> None:
        """An operation of ``txn`` was refused here (a send or an ack, before or after its
        record): a one-step commit of it is "not here" at once, not after a wait for an
        operation that will never be recorded. (v4 transactions have no op records.)"""
        if txn.is_v5:
            self._commits.refused(txn, why)

    def _start_flusher(self, txn: TxnId) -> None:
        if txn not in self._flushers and not self._closed:
            self._flushers[txn] = asyncio.create_task(self._flush(txn), name=f"op-records-{txn}")

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has begun (diagnostics, tests)."""
        return self._closed

    def waiting(self, txn: TxnId) -> int:
        """Callers waiting for a step of ``txn`` that has not begun (diagnostics, tests)."""
        return sum(len(w.waiters) for w in self._queues.get(txn, {}).values())

    # ------------------------------------------------------------------ one-step commit

    async def commit(
        self,
        txn: TxnId,
        ops: int,
        digest: int,
        *,
        header: T.TxnHeader,
        version: int,
        trace: str | None = None,
    ) -> CommitAnswer:
        """Commit OPEN ``txn`` (its ``header`` at ``version``) in the op-record step that
        writes the last records of its operations here, once those are exactly the ``ops``
        operations whose :func:`~segtxn.protocol.txnops.digest` is ``digest``; or, if they
        are all written already, in a step of its own. Answers "not here" (nothing decided)
        when that cannot be so: none of the missing operations arrived for
        :data:`~segtxn.broker.txn.commits.COMMIT_WAIT_S` (see
        :mod:`segtxn.broker.txn.commits`); at once once the writer is closed (the broker is
        stopping: no step would carry it). Asked after the close, it was registered all the
        same and answered only when that wait ended, the client's END_TXN held for nothing.
        """
        if self._closed:
            return CommitAnswer(None, STOPPING)
        pending = self._commits.ask(txn, ops, digest, header=header, version=version, trace=trace)
        if self._commits.matched(txn):
            self._start_flusher(txn)  # (a running flusher takes it with its next step)
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    async with asyncio.timeout(max(pending.expires - loop.time(), 0)):
                        return await asyncio.shield(pending.answer)
                except TimeoutError:
                    if pending.expires > loop.time():
                        continue  # more of its operations arrived meanwhile
                    why = f"the {ops} operations of {txn} were not all recorded here in time"
                    self._commits.withdraw(pending, why)
                    return await asyncio.shield(pending.answer)
        except asyncio.CancelledError:  # its caller left (a dropped request): not waited for
            self._commits.withdraw(pending, "its client went away")
            raise

    async def _flush(self, txn: TxnId) -> None:
        """Run the steps of ``txn`` while drafts are queued (or a commit is due), one at a
        time, until the writer closes. Ended (the writer closed, or this task cancelled by
        :meth:`close` as a step was in flight), it refuses every waiter left unanswered, the
        cut step's and the queued drafts' (:func:`~segtxn.broker.txn.oprefusals.refuse_stopped`)."""
        chosen: list[Waiting] = []
        try:
            while not self._closed and (self._queues.get(txn) or self._commits.matched(txn)):
                await self._appends_written(txn)
                await self._commits.wait_counted(txn)
                if self._closed:
                    break
                chosen = []
                await self._step(txn, self._queues.setdefault(txn, {}), chosen)
        finally:
            self._flushers.pop(txn, None)
            refuse_stopped([*chosen, *self._queues.pop(txn, {}).values()])

    def _take(self, txn: TxnId, queue: dict[str, Waiting], chosen: list[Waiting]) -> None:
        """Move the drafts of the next step from ``queue`` to ``chosen``, each with its
        snapshot and Put (failed drafts: their waiters fail at once)."""
        size = 0
        for key in list(queue):
            waiting = queue[key]
            if waiting.draft.failed is not None:
                del queue[key]
                fail_waiters(waiting.waiters, waiting.draft.failed)
                continue
            record = waiting.draft.snapshot()
            value = T.encode(record)
            if chosen and (
                len(chosen) >= MAX_RECORDS_PER_STEP or size + 2 * len(value) > MAX_STEP_BYTES
            ):
                break
            put = Put(key, value, partition_key=txn.key, indexes=T.op_indexes(record))
            waiting.snapshot, waiting.put = record, put
            size += 2 * len(value)
            chosen.append(queue.pop(key))

    async def _step(self, txn: TxnId, queue: dict[str, Waiting], chosen: list[Waiting]) -> None:
        """Write some of ``queue``'s drafts (moving them from it to ``chosen``, empty) in one
        store step; the last step of a transaction whose commit waits here carries its
        compare-and-set."""
        error: ServerError | None = None
        owners: dict[str, tuple[Owner, int]] = {}
        commit: PendingCommit | None = None
        ended = False
        try:
            self._take(txn, queue, chosen)
            commit = None if queue else self._commits.due(txn)
            if not chosen and commit is None:
                return
            for waiting in chosen:
                if waiting.owner is not None:
                    key = metadata_key(waiting.owner.name)
                    owners[key] = (waiting.owner, waiting.owner.metadata_version)
            checks = [Check(key, version) for key, (_, version) in owners.items()]
            puts = [w.put for w in chosen if w.put is not None]
            header: Op = (
                commit.cas() if commit is not None else Check(T.header_key(txn), chosen[0].version)
            )
            self.steps_in_flight += 1
            try:
                await self._store.commit([header, *checks, *puts])
            finally:
                self.steps_in_flight -= 1
        except (BadVersion, NotFound) as e:
            owned = owners.get(e.key)
            if owned is None:
                error = ServerError(ErrorName.TRANSACTION_CONFLICT, f"{txn} ended meanwhile")
                error.__cause__ = e
                ended = True
            else:
                error = await owner_refusal(txn, *owned, e)
                if error is None:
                    requeue(queue, chosen)  # its own rollover or trim meanwhile: again
                    if commit is not None:
                        self._commits.again(commit)
                    return
        except MetadataStoreError as e:
            error = store_failed(e)
            if commit is not None and not isinstance(e, NOT_APPLIED) and await self._settle(commit):
                error = None  # the step landed: its decision and every record in it
        except Exception as e:  # a bug: fail every waiter rather than leave them hanging
            log.exception("op records of %s: step failed", txn)
            error = ServerError(ErrorName.UNKNOWN, f"could not record the op: {e}")
            error.__cause__ = e
            if commit is not None and await self._settle(commit):
                error = None
            else:
                chosen += queue.values()
                queue.clear()
        if error is not None:
            self._commits.failed(txn, error.message)
            if commit is not None:
                self._commits.answer(commit, CommitAnswer(None, error.message))
            if ended:
                self._commits.forget(txn)
        elif commit is not None:
            assert commit.final is not None
            self._commits.answer(commit, CommitAnswer(commit.final))
        for waiting in chosen:
            if error is not None:
                waiting.draft.failed = error
                fail_waiters(waiting.waiters, error)
                continue
            assert waiting.snapshot is not None
            waiting.draft.landed(waiting.snapshot)
            kind = "write" if isinstance(waiting.snapshot, T.WritesRecord) else "ack"
            self._metrics.txn_op_writes.add(1, {"kind": kind})
            for done in waiting.waiters:
                if not done.done():
                    done.set_result(None)

    async def _settle(self, commit: PendingCommit) -> bool:
        """The fate of a step carrying ``commit`` is unknown (the store failed as it was
        made): find it before anything is answered. An abort from the OPEN version lands
        only if the step did not; refused, the header says: the very header the step
        wrote means it landed, every record in it too. A COMMITTED header of anyone else's
        (an END_TXN the client sent while its operations were still in flight) does not:
        the step's records are not in that transaction, so its sends must fail. Tried
        again while the store fails: an answer either way would be a guess, and a wrong
        one loses committed data or commits what the client believes failed."""
        key = T.header_key(commit.txn)
        aborted = msgspec.structs.replace(
            commit.header, state=TxnState.ABORTED, finalized_ms=int(time.time() * 1000)
        )
        while True:
            try:
                try:
                    await self._store.put(
                        key,
                        T.encode(aborted),
                        expected_version=commit.version,
                        partition_key=commit.txn.key,
                        indexes=T.header_indexes(aborted),
                    )
                    return False
                except (BadVersion, NotFound):
                    record = await self._store.get(key)
                    if record is None:
                        return False
                    return T.decode_header(record.value) == commit.final
            except MetadataStoreError as e:
                retry_warning(
                    log,
                    e,
                    "txn %s: its commit's store step failed with an unknown outcome (%s); "
                    "finding out",
                    commit.txn,
                    e,
                )
                await asyncio.sleep(SETTLE_RETRY_S)  # a retry interval, not a wait for a condition

    # ------------------------------------------------------------------ clean-up

    async def clean(self, puts: list[Put], deletes: list[str]) -> None:
        """Write ``puts``, then delete the records ``deletes`` (one already gone is not an
        error), batched with other clean-up of this broker: in one atomic step when they
        fit, else the puts first.

        Raises:
            MetadataStoreError: the store failed (nothing, or the puts only, were done).
        """
        await self._cleaner.clean(puts, deletes)

    def discard(self, deletes: list[str]) -> None:
        """Delete the records ``deletes`` soon, retrying while the store fails (nobody
        waits: a subscription's next materialization must not wait for the last one's)."""
        self._cleaner.discard(deletes)

    async def close(self) -> None:
        """Stop (the broker's stop, once its topics are closed), answering every caller that
        waits: no step begins from now on (a write is refused at once, ServiceNotReady); a
        step in flight gets :data:`STEP_END_WAIT_S` to end, its waiters then told its real
        outcome, and is cancelled after that; every waiter not answered by then, the cut
        step's and each of a draft queued for a later step, is refused as ServiceNotReady
        "the broker is stopping" (its draft failed for good: a cut step may have landed or
        not). A one-step commit still waiting is answered "not here", one whose step was
        cut :class:`~segtxn.broker.txn.commits.CommitUnknown` (:meth:`Commits.close`).
        Idempotent; cancelled, it cuts the steps at once and answers all the same, and
        closes its clean-up (left running past the stop, it wrote to a closed store). It
        returns once the tasks acting on those answers (:meth:`settled_by`) have ended: one
        still orphaning a refused send's entry as the broker's stop went on was cut by the
        store's close, its send's publish task left waiting past the stop.

        It cancelled the steps in flight at once and dropped the queued drafts, answering
        neither: their callers (a transactional send's publish task, an acknowledgment's)
        waited for ever, past the broker's stop."""
        self._closed = True
        try:
            try:
                if self._flushers:
                    await asyncio.wait(list(self._flushers.values()), timeout=STEP_END_WAIT_S)
            finally:
                tasks = list(self._flushers.values())
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self._commits.close()
            while self._settling:  # (one refused meanwhile, at once, may start another)
                await asyncio.wait(list(self._settling))
        finally:  # (cancelled, the stop's time up: the settling tasks are not waited for)
            await self._cleaner.close()


NOT_APPLIED = (StoreFull, StoreAccessDenied, StoreInvalidArgument)
"""The step was refused, not applied: its commit needs no settling (which would be refused
alike, and its answer wait, until an operator frees the store or grants the permission)."""
