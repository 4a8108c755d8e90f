"""v4 (PIP-31) transactions on ``persistent://`` topics: markers in the topic's ledger.

:class:`MarkerTransactionBuffer` is PIP-31's ``TopicTransactionBuffer``. A transactional
message is an ordinary entry carrying its transaction id; ``END_TXN_ON_PARTITION`` (from
the v4 coordinator) appends a commit or abort **marker entry**. The buffer keeps, in
memory, the ongoing transactions (their first entry: ``max_read_position`` stays before
the earliest one) and the aborted set (what dispatchers must skip). Markers are never
delivered. Both indexes are **snapshotted** every ``snapshot_every`` markers to the
namespace's ``__transaction_buffer_snapshot`` log (:mod:`segtxn.broker.txn.snapshots`);
recovery loads the topic's latest snapshot and replays the ledger from the position it
covers: only a snapshot of this incarnation of the topic (not of one deleted before it under
its name, whose positions the new ledger reuses), and only while every entry after that
position is retained (:mod:`segtxn.broker.txn.snapshots` says why).

**PIP-373.** The topic's system property ``__contains_txn_messages`` is ``false``/absent
until its first transactional message, and set to ``true`` durably *before* that message is
appended (so before it is acknowledged). A topic whose property is ``false`` skips snapshot
loading and replay entirely. Upgrade cases: absent -> scan the ledger once to find out and
record the answer; a non-boolean value -> always rebuild, and never touch it; a user-set
boolean -> trusted like the system's own. Users cannot set or remove it (``NotAllowed``).

**A terminated topic cannot take a marker**: ending a transaction that wrote to it fails,
at once, with ``TopicTerminatedError``, and the transaction cannot complete. This is the
problem PIP-471 solves (a sealed segment materializes decisions without a write).

PIP-31's pending-ack store, ``MLPendingAckStore``, is :mod:`segtxn.broker.txn.pending_ack_log`.

**Only transactions their coordinator knows are open get in**
(:mod:`segtxn.broker.txn.v4checks`): both check a transaction with its coordinator before
its first send or ack here, and tell the checks what they hold and what ended, so one
abandoned past its timeout is ended by the broker: no client can pin a topic's read horizon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict

import msgspec

from segtxn.aio import SETTLE_S, settle
from segtxn.broker.entry import decode_entry, marker_entry
from segtxn.broker.ordering import Turn
from segtxn.broker.txn.snapshots import BufferSnapshot, SnapshotLogs
from segtxn.broker.txn.v4checks import V4TransactionChecks
from segtxn.broker.txn.visibility import OpenTransactions, TransactionBuffer
from segtxn.ledger import (
    LedgerError,
    LedgerSealed,
    ManagedLedger,
    Position,
    TrimResult,
)
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnAction, TxnId, TxnState

log = logging.getLogger(__name__)

CONTAINS_TXN = "__contains_txn_messages"
"""PIP-373's system topic property."""
ENDED_MEMORY = 100_000
"""Ended transactions remembered (refusing late writes, answering a repeated END at once)."""


def _pos(p: tuple[int, int] | list[int]) -> Position:
    return Position(p[0], p[1])


def _before(p: Position) -> Position:
    return Position(p.ledger_id, p.entry_id - 1)


def remember(ended: OrderedDict[TxnId, TxnState], txn: TxnId, outcome: TxnState) -> None:
    """Note an ended transaction, forgetting the oldest beyond ``ENDED_MEMORY``."""
    ended[txn] = outcome
    while len(ended) > ENDED_MEMORY:
        ended.popitem(last=False)


_encode = msgspec.json.Encoder().encode


class MarkerTransactionBuffer(TransactionBuffer):
    """PIP-31's TopicTransactionBuffer (see the module docstring)."""

    def __init__(
        self,
        topic: str,
        tenant: str,
        namespace: str,
        ledger: ManagedLedger,
        *,
        snapshots: SnapshotLogs,
        checks: V4TransactionChecks,
        store: MetadataStore,
        snapshot_every: int = 100,
    ) -> None:
        super().__init__()
        self._store = store
        self._incarnation = 0
        """The store revision that created the ledger's record (0: not read yet)."""
        self.topic = topic
        self._checks = checks
        self._where = (tenant, namespace)
        self._ledger = ledger
        self._snapshots = snapshots
        self._snapshot_every = snapshot_every
        self._ongoing = OpenTransactions()
        self._aborted: dict[TxnId, Position] = {}
        self._ended: OrderedDict[TxnId, TxnState] = OrderedDict()
        self._floors: list[Position] = []
        self._locks: dict[TxnId, asyncio.Lock] = {}
        """Per transaction: an append queues its entry, and ``end`` its marker, holding it."""
        self._writing: dict[TxnId, set[asyncio.Future[Position]]] = {}
        """Entries queued and not yet durable, per transaction (``end`` waits for them)."""
        self._flag_lock = asyncio.Lock()
        self._markers_since_snapshot = 0
        self._snapshotting: asyncio.Task[None] | None = None
        self.contains_txn = False
        self.recovery = {"snapshot": 0, "replayed": 0, "skipped": 0}
        """What the last recovery did (for tests and the benchmark)."""

    def __str__(self) -> str:
        return self.topic

    # ------------------------------------------------------------------ horizon

    @property
    def max_read_position(self) -> Position | None:
        last = self._ledger.last_confirmed
        if last is None:
            return None
        horizon = min(last, *self._floors) if self._floors else last
        if self._ongoing:
            horizon = min(horizon, _before(min(self._ongoing.values())))
        return horizon

    def oldest_open_age_s(self) -> float | None:
        return self._ongoing.oldest_age_s()

    def visible(self, txn: TxnId | None, position: Position) -> bool:
        return txn is None or (txn not in self._aborted and txn not in self._ongoing)

    @property
    def ongoing(self) -> set[TxnId]:
        return set(self._ongoing)

    # ------------------------------------------------------------------ writes

    async def append(self, txn: TxnId, payload: bytes, turn: Turn) -> Position:
        """Queue the entry in the producer's turn, under the transaction's lock (so it is
        queued before the transaction's marker, or refused); wait for the write outside
        it, so a transaction's sends share group commits.

        Raises:
            ServerError(TransactionConflict): the transaction ended here already.
            ServerError(TransactionNotFound / InvalidTxnStatus / ServiceNotReady): its
                coordinator does not confirm it open with this topic in it (asked once).
        """
        if txn in self._ended:
            raise ServerError(
                ErrorName.TRANSACTION_CONFLICT, f"{txn} ended ({self._ended[txn]}): no more writes"
            )
        await self._checks.admit_write(txn, self.topic, self)
        await self._mark_contains()
        await turn.wait()  # before the lock: a later send may be waiting for it
        async with self._locks.setdefault(txn, asyncio.Lock()):
            if txn in self._ended:  # ended while this write waited
                raise ServerError(ErrorName.TRANSACTION_CONFLICT, f"{txn} ended meanwhile")
            floor = self._ledger.last_confirmed or Position(0, -1)
            self._floors.append(floor)
            try:
                written = await turn.enqueue(self._ledger, payload)
            except BaseException:
                self._floors.remove(floor)
                self._changed()
                raise
            writing = self._writing.setdefault(txn, set())
            writing.add(written)
        try:
            position = await asyncio.shield(written)  # end() may be waiting for it too
            self._note_write(txn, position)
            return position
        finally:
            writing.discard(written)
            if not writing and self._writing.get(txn) is writing:
                del self._writing[txn]
            self._floors.remove(floor)
            self._changed()

    def _note_write(self, txn: TxnId, position: Position) -> None:
        """A durable entry of ``txn``: the transaction is ongoing from its first one (unless
        it has ended meanwhile: its marker was written after this entry)."""
        if txn in self._ended:
            return
        first = self._ongoing.get(txn)
        if first is None or position < first:
            self._ongoing[txn] = position

    async def _mark_contains(self) -> None:
        """PIP-373: the property is durable before the first transactional message is."""
        if self.contains_txn:
            return
        async with self._flag_lock:
            value = self._ledger.properties.get(CONTAINS_TXN)
            if value in (None, "false"):
                await self._ledger.update_properties({CONTAINS_TXN: "true"}, ())
            self.contains_txn = True

    async def end(self, txn: TxnId, action: TxnAction) -> bool:
        """END_TXN_ON_PARTITION: append the marker (if the transaction wrote here). Returns
        whether this call ended it: False when it had ended so already (a repeated END, or
        its coordinator's and the v4 checks' sweep crossing: the sweep then says nothing of
        having ended it).

        Raises:
            ServerError(TopicTerminatedError): the topic is sealed; it cannot take the marker.
            ServerError(InvalidTxnStatus): it already ended the other way.
            LedgerError: the marker was not written (the same END again writes it); left
                to the caller, which names it (the endpoint) or tries again (the sweep).
        """
        outcome = action.outcome
        async with self._locks.setdefault(txn, asyncio.Lock()):
            ended = self._ended.get(txn)
            if ended is not None:
                if ended is not outcome:
                    raise ServerError(
                        ErrorName.INVALID_TXN_STATUS, f"{txn} already {ended} on {self.topic}"
                    )
                return False
            for written in list(self._writing.pop(txn, ())):  # queued before the marker
                with contextlib.suppress(Exception):  # a failed write stored nothing
                    self._note_write(txn, await asyncio.shield(written))
            if txn in self._ongoing:
                at = await self._write_marker(txn, action)
                self._markers_since_snapshot += 1
                log.debug("txn %s: %s marker on %s at %s", txn, action.value, self.topic, at)
            remember(self._ended, txn, outcome)
            self._checks.ended(txn, self)
            self._locks.pop(txn, None)
        self._changed()
        if self._markers_since_snapshot >= self._snapshot_every and self._snapshotting is None:
            self._snapshotting = asyncio.create_task(
                self._snapshot(), name=f"txn-buffer-snapshot-{self.topic}"
            )
        return True

    async def _write_marker(self, txn: TxnId, action: TxnAction) -> Position:
        """Append ``txn``'s marker and apply it; returns where it is. A floor at the last
        entry before it is held meanwhile, as :meth:`append` does for an entry: a snapshot
        taken once the marker is durable but before it is applied (another transaction's
        marker may start one then) lists ``txn`` as ongoing, so its position must stay
        before the marker, for a recovery from it to replay the marker. Past it, the
        restarted buffer found ``txn`` open for good, and the v4 checks' sweep wrote a
        second marker: an abort, aborting a committed transaction that consumers had read,
        if its coordinator had forgotten it.

        Raises:
            ServerError(TopicTerminatedError): as :meth:`end`.
        """
        floor = self._ledger.last_confirmed or Position(0, -1)
        self._floors.append(floor)
        try:
            at = await self._ledger.append(
                marker_entry((txn.most, txn.least), action.value, int(time.time() * 1000))
            )
        except LedgerSealed as e:
            log.warning("txn %s: %s is terminated: no %s marker", txn, self.topic, action)
            raise ServerError(
                ErrorName.TOPIC_TERMINATED,
                f"{self.topic} is terminated: it cannot take the {action.value} marker "
                f"of {txn}, so the transaction cannot complete (v4 needs a marker in "
                "every partition it wrote to)",
            ) from e
        else:
            self._apply_end(txn, action.outcome, at)
            return at
        finally:
            self._floors.remove(floor)

    def _apply_end(self, txn: TxnId, outcome: TxnState, marker: Position) -> None:
        self._ongoing.pop(txn, None)
        if outcome is TxnState.ABORTED:
            self._aborted[txn] = marker

    # ------------------------------------------------------------------ snapshots

    async def _snapshot(self) -> None:
        """:meth:`snapshot` in the background. A failure the ledger or the store gives (a
        snapshot log whose writer stopped, and is opened again on its next use; a store
        that failed) is a WARNING without a traceback: replay covers it; any other is a
        bug, logged with its traceback."""
        try:
            await self.snapshot()
        except (LedgerError, MetadataStoreError) as e:
            log.warning(
                "%s: transaction buffer snapshot failed (replay covers it): %s", self.topic, e
            )
        except Exception:
            log.exception("%s: transaction buffer snapshot failed (replay covers it)", self.topic)
        finally:
            self._snapshotting = None

    async def snapshot(self) -> None:
        """Write both indexes as they stand: they reflect every entry up to the last
        confirmed one that no append in flight (an entry's or a marker's) precedes."""
        incarnation = await self.incarnation()
        last = self._ledger.last_confirmed
        if last is None:
            return
        at = min(last, *self._floors) if self._floors else last
        self._markers_since_snapshot = 0
        snapshot = BufferSnapshot(
            self.topic,
            (at.ledger_id, at.entry_id),
            {str(t): (p.ledger_id, p.entry_id) for t, p in self._ongoing.items()},
            {str(t): (p.ledger_id, p.entry_id) for t, p in self._aborted.items()},
            incarnation,
        )
        await self._snapshots.write(*self._where, snapshot)

    # ------------------------------------------------------------------ recovery

    async def recover(self) -> None:
        value = self._ledger.properties.get(CONTAINS_TXN)
        if value == "false":
            self.recovery["skipped"] = 1
            return  # PIP-373: nothing transactional here, nothing to load or replay
        if value is None:  # upgrade: never recorded; find out by reading the ledger
            found = await self._replay(self._ledger.first_position())
            self.contains_txn = found
            await self._ledger.update_properties({CONTAINS_TXN: str(found).lower()}, ())
            return
        self.contains_txn = True  # "true", or a non-boolean value: always rebuild
        start = self._ledger.first_position()
        snapshot = await self._snapshots.latest(*self._where, self.topic)
        if snapshot is not None and (
            not snapshot.incarnation or snapshot.incarnation != await self.incarnation()
        ):  # a deleted topic's (its positions are not this one's), or one that cannot tell
            log.info("%s: its snapshot is not of this topic; replaying it whole", self.topic)
            snapshot = None
        if snapshot is not None and not self._replayable_after(_pos(snapshot.position)):
            log.info(
                "%s: entries after its snapshot at %s were trimmed; replaying it whole",
                self.topic,
                snapshot.position,
            )
            snapshot = None
        if snapshot is not None:
            self.recovery["snapshot"] = 1
            for text, first in snapshot.ongoing.items():
                self._ongoing[TxnId.parse(text)] = _pos(first)
            for text, marker in snapshot.aborted.items():
                self._aborted[TxnId.parse(text)] = _pos(marker)
            start = self._ledger.position_after(_pos(snapshot.position))
        await self._replay(start)
        for txn in self._ongoing:  # ended by its coordinator, or by the checks' sweep
            self._checks.recovered(txn, self)

    def _replayable_after(self, position: Position) -> bool:
        """Whether every entry after ``position`` is still in the ledger: its ledger is
        retained (retention trims whole ledgers from the front, so all that follows it is
        too). Otherwise markers written after a snapshot at ``position`` may be gone with
        the ledgers trimmed since (by this broker, or by another that served the topic
        meanwhile): the snapshot's ongoing transactions would stay open for good, and
        readers stop before the first one (see :mod:`segtxn.broker.txn.snapshots`)."""
        retained = self._ledger.ledger_ids
        return bool(retained) and position.ledger_id >= retained[0]

    async def incarnation(self) -> int:
        """The store revision that created the topic's ledger record: what tells this topic
        from one deleted before it under its name (0: the record is gone, being deleted).

        Raises:
            MetadataStoreError: the store cannot be read.
        """
        if not self._incarnation:
            record = await self._store.get(metadata_key(self._ledger.name))
            self._incarnation = 0 if record is None else record.created_version
        return self._incarnation

    async def _replay(self, start: Position | None) -> bool:
        """Apply entries from ``start`` on; returns whether any was transactional.

        A marker ends only a transaction open at that point of the replay (listed by the
        snapshot, or with an entry since): :meth:`end` writes one only then, so any other is
        a second marker of a transaction ended already, or one whose entries were trimmed.
        The first marker decides, as :meth:`end` refuses a second END: a second marker (the
        v4 checks' sweep wrote one, before :meth:`_write_marker` kept snapshots before
        markers, for a transaction a snapshot showed open after its marker) changes
        nothing, so an abort after a commit never hides what consumers have read."""
        found = False
        while start is not None:
            entries = await self._ledger.read(start, max_entries=1000, max_bytes=64 << 20)
            if not entries:
                break
            for entry in entries:
                self.recovery["replayed"] += 1
                message = decode_entry(entry.payload)
                if message.txn is None:
                    continue
                found = True
                txn = TxnId(*message.txn)
                if message.marker is not None:
                    if txn not in self._ongoing:
                        continue  # not its first marker, or its entries are gone: see above
                    outcome = TxnAction(message.marker).outcome
                    self._apply_end(txn, outcome, entry.position)
                    remember(self._ended, txn, outcome)
                elif txn not in self._ended:
                    self._ongoing.setdefault(txn, entry.position)
            start = self._ledger.position_after(entries[-1].position)
        return found

    async def trimmed(self, result: TrimResult) -> None:
        if not result.ledgers:
            return
        first = Position(max(result.ledgers) + 1, -1)
        for txn in [t for t, marker in self._aborted.items() if marker < first]:
            del self._aborted[txn]

    async def deleted(self) -> None:
        """Tombstone the topic's snapshots in this broker's log (a failure is logged: a
        topic created again under the name never loads them anyway)."""
        if not self.contains_txn:
            return  # never snapshotted
        try:
            await self._snapshots.forget(*self._where, self.topic)
        except (LedgerError, MetadataStoreError) as e:
            log.warning("%s: its snapshots were not tombstoned: %s", self.topic, e)

    async def close(self) -> None:
        """Stop being a participant of the v4 checks, and let a snapshot in flight end,
        :data:`~segtxn.aio.SETTLE_S` at most: past it, it is cancelled (a recovery replays
        from the previous one). Awaited without a bound, a snapshot whose write the store
        never answered held the topic's close, and a broker's stop, for ever."""
        self._checks.forget(self)
        if self._snapshotting is not None and not await settle(self._snapshotting, SETTLE_S):
            log.warning(
                "%s: transaction buffer snapshot not written within %.0f s; cancelled "
                "(a recovery replays from the previous one)", self.topic, SETTLE_S,
            )  # fmt: skip
