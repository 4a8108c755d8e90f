"""Snapshots of v4 transaction buffers: one log per namespace and broker, kept bounded.

A ``persistent://`` topic's :class:`~segtxn.broker.txn.markers.MarkerTransactionBuffer`
writes its indexes (ongoing transactions and their first entries, aborted ones and their
markers) every so many markers to its namespace's
``persistent://<t>/<ns>/__transaction_buffer_snapshot@<broker>`` log, so recovery replays
only the ledger after the latest one. Each broker keeps its own log, read once when first
opened (the latest position per topic is indexed); a topic that moved (a take-over or a
drain) finds no snapshot, or an older one, in its new broker's log, and replays more.

**A snapshot is of one incarnation of its topic.** A topic deleted and created again under
its name has a new ledger that numbers its entries from the start again, so the deleted
one's snapshot (its position past the new topic's entries, its aborted and open
transactions) would hide the new topic's entries from recovery, and with them its open
transactions and their uncommitted messages. Each snapshot records the store revision that
created its topic's ledger record (:attr:`BufferSnapshot.incarnation`), and recovery loads
only one of its own topic's incarnation, in any broker's log. A deletion also appends a
tombstone to this broker's log, so a compaction stops keeping the deleted topic's snapshot.
The log of a broker the topic moved away from gets no tombstone: its compaction drops what
no recovery can load (below).

**A snapshot is a base only while what follows it is retained.** A topic that moved to
another broker and back finds its old snapshot here, of the same incarnation, older than
what the other broker did: the ledger is the topic's only history, whoever wrote it, so the
replay from the snapshot's position applies the markers written there meanwhile (a
transaction the snapshot lists as ongoing committed or aborted; one begun and ended). That
holds while every entry after the position is still in the ledger. Retention trims whole
ledgers from the front, on whichever broker serves the topic: once it trimmed the one
holding the position, markers after it may be gone, and a transaction the snapshot lists as
ongoing whose marker went with them stayed open here for good (readers stop before its
first entry, until the v4 checks' sweep learned its outcome from its coordinator and wrote
a second marker; an hour and more while none answered). So recovery sets aside a snapshot
whose position's ledger was trimmed and replays the retained ledger whole, as for a topic
with no snapshot: a transaction whose entries and marker were all trimmed leaves nothing to
show or hide. The same holds on one broker (a snapshot, then a trim past its later
markers, then a restart).

**Only each topic's latest snapshot is needed**, so the log is a
:class:`~segtxn.ledger.compacted.CompactedLog`: once ``compact_entries`` snapshots were
written since its last compaction (and twice as many as the topics it holds), it is cut,
each topic's latest snapshot is copied past the cut, and the ledgers before the cut are
deleted. A crash at any step leaves a log whose replay indexes, per topic, a snapshot with
the same content as before (:mod:`segtxn.ledger.compacted` says why).

**A snapshot no recovery can load is not copied** (:meth:`SnapshotLog.compact`): one whose
incarnation is 0, or whose topic's ledger record is gone (deleted) or was created at another
revision (deleted and created again), as recovery checks. A record's creation revision never
comes back once the record is deleted, so such a snapshot stays unloadable for good, on
every broker; a topic that exists, of the snapshot's incarnation, keeps it whichever broker
serves it now (it may move back here: :mod:`segtxn.broker.txn.markers` loads it then).
Without this, a broker's log kept the last snapshot of every topic that moved away from it
and was deleted elsewhere, and grew without bound over topics created and deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import msgspec

from segtxn.broker.metrics import BrokerMetrics
from segtxn.ledger import (
    LedgerError,
    LedgerSettings,
    LogStorage,
    ManagedLedger,
    Position,
    WriteFailed,
)
from segtxn.ledger.compacted import CompactedLog
from segtxn.ledger.errors import LedgerClosed, close_after_cut
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, MetadataStoreError

SNAPSHOT_LOG = "__transaction_buffer_snapshot"
LOOKUPS = 16
"""Store reads a compaction makes at once, asking whether its topics' snapshots are current."""


def snapshot_log(tenant: str, namespace: str, broker_id: str) -> str:
    """The name of the namespace's snapshot log on broker ``broker_id``."""
    return f"persistent://{tenant}/{namespace}/{SNAPSHOT_LOG}@{broker_id}"


log = logging.getLogger(__name__)
T = TypeVar("T")


class BufferSnapshot(msgspec.Struct, frozen=True):
    topic: str
    position: tuple[int, int]
    """Every entry up to here is reflected below."""
    ongoing: dict[str, tuple[int, int]]
    """Transaction (``most:least``) -> its first entry."""
    aborted: dict[str, tuple[int, int]]
    """Transaction -> its abort marker."""
    incarnation: int = 0
    """The store revision that created the topic's ledger record (its
    ``created_version``): another for a topic created again under the name. 0 in snapshots
    written before this was kept, and when the record could not be found: never loaded."""


class _Tombstone(msgspec.Struct, frozen=True):
    """The topic was deleted: forget its snapshots."""

    topic: str
    deleted: bool = True


class _Topic(msgspec.Struct):
    """Decodes just the topic of a snapshot or a tombstone (and a snapshot's incarnation)."""

    topic: str
    deleted: bool = False
    incarnation: int = 0


_encode = msgspec.json.Encoder().encode
_decode_snapshot = msgspec.json.Decoder(BufferSnapshot).decode
_decode_topic = msgspec.json.Decoder(_Topic).decode


class SnapshotLog:
    """One namespace's ``__transaction_buffer_snapshot`` log on this broker: every
    snapshot is appended; the latest per topic is indexed at open (the log is read once),
    and the log is compacted to those (see the module docstring)."""

    def __init__(
        self,
        log_: CompactedLog,
        store: MetadataStore,
        compact_entries: int,
        metrics: BrokerMetrics | None,
    ) -> None:
        self._log = log_
        self._store = store
        self._compact_entries = compact_entries
        self._metrics = metrics
        self._latest: dict[str, Position] = {}
        self._compaction = asyncio.Lock()
        """Held by :meth:`compact` from its first step, the store reads judging its
        snapshots: a write finds a compaction under way (and starts none) from then on."""

    @classmethod
    async def open(
        cls,
        name: str,
        store: MetadataStore,
        storage: LogStorage,
        settings: LedgerSettings,
        *,
        compact_entries: int,
        metrics: BrokerMetrics | None = None,
    ) -> SnapshotLog:
        opened = await CompactedLog.open(name, store, storage, settings)
        log_ = cls(opened, store, compact_entries, metrics)
        try:
            async for entries in log_._log.replay():
                for entry in entries:
                    about = _decode_topic(entry.payload)
                    if about.deleted:
                        log_._latest.pop(about.topic, None)
                    else:
                        log_._latest[about.topic] = entry.position
        except BaseException:  # failed or stopped mid-way: nothing else would close it
            await close_after_cut(log_.close(), name)  # (raising what cut it, not this)
            raise
        return log_

    async def write(self, snapshot: BufferSnapshot) -> None:
        """Append ``snapshot`` (the topic's latest once durable); compact the log first if
        it has grown enough (a failed compaction is logged: the log is as correct as
        before, and the next write tries again).

        Raises:
            LedgerError: the snapshot could not be written.
        """
        if not self._compaction.locked() and self._log.due(
            self._compact_entries, len(self._latest)
        ):
            try:
                await self.compact()
            except (LedgerError, MetadataStoreError) as e:
                log.warning("%s: compaction failed (retried later): %s", self._log.ledger.name, e)
        await self._log.append(_encode(snapshot), lambda at: self._index(snapshot.topic, at))

    def _index(self, topic: str, at: Position) -> None:
        self._latest[topic] = at

    async def forget(self, topic: str) -> None:
        """The topic was deleted: append a tombstone (if it has a snapshot here), after
        which it has none, so the next compaction drops its snapshots.

        Raises:
            LedgerError: the tombstone could not be written (the snapshot stays, and is
                never loaded for a topic created again: see the module docstring).
        """
        if topic in self._latest:
            await self._log.append(_encode(_Tombstone(topic)), lambda _: self._unindex(topic))

    def _unindex(self, topic: str) -> None:
        self._latest.pop(topic, None)

    async def latest(self, topic: str) -> BufferSnapshot | None:
        """The topic's latest snapshot (None: it has none)."""
        while True:
            at = self._latest.get(topic)
            if at is None:
                return None
            entries = await self._log.ledger.read(at, max_entries=1)
            if entries and entries[0].position == at:
                return _decode_snapshot(entries[0].payload)
            if self._latest.get(topic) == at:  # not moved by a compaction: it is gone
                log.warning("%s: %s's snapshot at %s is gone", self._log.ledger.name, topic, at)
                return None  # (recovery then replays the topic's whole ledger)
            # a compaction copied it and trimmed the original meanwhile: read the copy

    async def compact(self) -> None:
        """Keep only each topic's latest snapshot, and of those only the ones a recovery
        can load (one compaction at a time). The rule, recovery's own
        (:meth:`segtxn.broker.txn.markers.MarkerTransactionBuffer.recover`): a snapshot is
        dropped if its incarnation is 0, or if its topic's ledger record is gone or was
        created at another revision than the snapshot's incarnation. It is judged before
        the log is held alone (one store read per topic, :data:`LOOKUPS` at once, so the
        snapshots written meanwhile wait for none of them): a judgement cannot go stale,
        since a record's creation revision never comes back, and a topic snapshotted again
        meanwhile has its new snapshot kept (only the snapshot judged is dropped).

        The judging is part of the compaction (:attr:`_compaction` held): the log's own
        lock is taken only after it, and a snapshot written while the store answered found
        no compaction under way, judged every topic again and compacted the log a second
        time as soon as the first ended (a roll-over and a copy of every snapshot for
        nothing, its own snapshot waiting for it all).

        Raises:
            LedgerError, MetadataStoreError: a step failed (the log stays correct).
        """
        async with self._compaction:
            await self._compact()

    async def _compact(self) -> None:
        """:meth:`compact`'s body, under its lock."""
        unloadable = await self._unloadable()
        topics: list[str] = []

        async def keep() -> Sequence[bytes]:
            topics[:] = [t for t, at in self._latest.items() if unloadable.get(t) != at]
            payloads = []
            for topic in topics:
                at = self._latest[topic]
                entries = await self._log.ledger.read(at, max_entries=1)
                if not entries or entries[0].position != at:
                    raise LedgerError(f"{self._log.ledger.name}: {topic}'s snapshot is gone")
                payloads.append(entries[0].payload)
            return payloads

        def relogged(positions: list[Position]) -> None:
            self._latest = dict(zip(topics, positions, strict=True))  # the others dropped

        await self._log.compact(keep, relogged=relogged)
        if self._metrics is not None:
            self._metrics.txn_v4_log_compactions.add(1, {"log": "snapshot"})

    async def _unloadable(self) -> dict[str, Position]:
        """The topics whose latest snapshot no recovery can load (:meth:`compact`), and
        where that snapshot is.

        Raises:
            LedgerError, MetadataStoreError: a read failed.
        """
        unloadable: dict[str, Position] = {}
        judging = iter(list(self._latest.items()))

        async def judge() -> None:  # LOOKUPS of these share the topics
            for topic, at in judging:
                entries = await self._log.ledger.read(at, max_entries=1)
                if not entries or entries[0].position != at:
                    continue  # moved by a compaction meanwhile: judged by the next one
                incarnation = _decode_topic(entries[0].payload).incarnation
                if incarnation:
                    record = await self._store.get(metadata_key(topic))
                    if record is not None and record.created_version == incarnation:
                        continue
                unloadable[topic] = at

        try:
            async with asyncio.TaskGroup() as group:  # (the others cancelled on a failure)
                for _ in range(LOOKUPS):
                    group.create_task(judge())
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None  # raised as it came, for the callers
        return unloadable

    @property
    def ledger(self) -> ManagedLedger:
        """The log's managed ledger (the broker's repairer keeps its closed ledgers
        copied)."""
        return self._log.ledger

    @property
    def entries(self) -> int:
        """Snapshots the log holds after its cursor (what the next open replays)."""
        return self._log.entries

    @property
    def size_bytes(self) -> int:
        return self._log.size_bytes

    async def close(self) -> None:
        await self._log.close()


class SnapshotLogs:
    """The snapshot logs of the namespaces this broker serves, opened on first use. A
    topic's snapshots are written and read in this broker's log only (one that moved here
    replays more: see the module docstring)."""

    def __init__(
        self,
        broker_id: str,
        store: MetadataStore,
        storage: LogStorage,
        settings: LedgerSettings,
        *,
        compact_entries: int = 1000,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        """``compact_entries``: compact a log once this many snapshots were written since
        its last compaction (and twice as many as its topics); 0: never."""
        self._broker_id = broker_id
        self._store = store
        self._storage = storage
        self._settings = settings
        self._compact_entries = compact_entries
        self._metrics = metrics
        self._logs: dict[str, asyncio.Task[SnapshotLog]] = {}
        self._opened: dict[str, SnapshotLog] = {}
        """The log each task of :attr:`_logs` opened (or is handing back): the one a stop
        of its writer lets go of."""
        self._letting_go: dict[str, asyncio.Task[None]] = {}
        """The closes of logs whose writer stopped: the next open of the name waits for
        its own (a ledger has one writer at a time: its files are locked until it is
        closed)."""
        self._closed = False

    def get(self, tenant: str, namespace: str) -> asyncio.Task[SnapshotLog]:
        """The namespace's log (the task opening it, or that opened it). A log whose writer
        stopped for a reason reopening may cure is let go of (:meth:`_stopped`), and the
        next call opens it again. After :meth:`close`, LedgerClosed (it would stay open)."""
        if self._closed:
            raise LedgerClosed("the broker's transaction-buffer snapshot logs are closed")
        name = snapshot_log(tenant, namespace, self._broker_id)
        task = self._logs.get(name)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.ensure_future(self._open(name))
            self._logs[name] = task
        return task

    async def _open(self, name: str) -> SnapshotLog:
        """Open ``name`` once the close of its stopped predecessor, if any, has ended."""
        closing = self._letting_go.get(name)
        if closing is not None:
            await asyncio.shield(closing)  # (it raises nothing: see _let_go)
        log_ = await SnapshotLog.open(
            name,
            self._store,
            self._storage,
            self._settings,
            compact_entries=self._compact_entries,
            metrics=self._metrics,
        )
        self._opened[name] = log_
        log_.ledger.watch_write_failure(lambda failure: self._stopped(name, log_, failure))
        return log_

    def _stopped(self, name: str, log_: SnapshotLog, failure: WriteFailed) -> None:
        """``log_``'s writer stopped: if reopening may cure it (a fence met by a compaction,
        a rollover whose outcome the store left unknown, a full disk, too few replicas),
        it is let go of (closed in the background) and the next :meth:`get` opens it again.
        Damage is not: the log stays, refusing snapshots, as a damaged topic stays.

        Why: kept, the stopped log refused every later snapshot of every topic of its
        namespace (each logged at ERROR), and their recoveries replayed ever more of their
        ledgers, until the broker restarted. Unloading the topics would not do: loaded
        again, they write to the same log."""
        if not failure.retriable or self._closed or self._opened.get(name) is not log_:
            return
        del self._opened[name]
        self._logs.pop(name, None)  # (the task that opened log_: see _opened)
        log.warning("%s: %s; it is closed, and opened again on its next use", name, failure)
        closing = asyncio.create_task(self._let_go(name, log_), name=f"let-go-{name}")
        self._letting_go[name] = closing

    async def _let_go(self, name: str, log_: SnapshotLog) -> None:
        """Close the stopped ``log_`` (its clean close is not written: its next open
        recovers it); a failure is logged, not raised: nobody awaits this but the next
        open, which opens the log whatever happened."""
        try:
            await log_.close()
        except Exception as e:
            _close_failed(name, "closing it after its writer stopped", e)
        finally:
            if self._letting_go.get(name) is asyncio.current_task():
                del self._letting_go[name]

    async def forget(self, tenant: str, namespace: str, topic: str) -> None:
        """:meth:`SnapshotLog.forget` in the namespace's log (opened if need be).

        Raises:
            LedgerError, MetadataStoreError: the log could not be opened or written.
        """
        await self._in_log(tenant, namespace, lambda log_: log_.forget(topic))

    async def write(self, tenant: str, namespace: str, snapshot: BufferSnapshot) -> None:
        """:meth:`SnapshotLog.write` in the namespace's log (opened if need be).

        Raises:
            LedgerError, MetadataStoreError: the log could not be opened or written.
        """
        await self._in_log(tenant, namespace, lambda log_: log_.write(snapshot))

    async def latest(self, tenant: str, namespace: str, topic: str) -> BufferSnapshot | None:
        """:meth:`SnapshotLog.latest` in the namespace's log (opened if need be).

        Raises:
            LedgerError, MetadataStoreError: the log could not be opened or read.
        """
        return await self._in_log(tenant, namespace, lambda log_: log_.latest(topic))

    async def _in_log(
        self, tenant: str, namespace: str, use: Callable[[SnapshotLog], Awaitable[T]]
    ) -> T:
        """``use`` the namespace's log; once more on the log opened again if the one it had
        was let go of under it (:meth:`_stopped`: its writer stopped, and the close that
        lets the next open have its files found it in use: ``LedgerClosed``)."""
        log_ = await self.get(tenant, namespace)
        try:
            return await use(log_)
        except LedgerClosed:
            name = snapshot_log(tenant, namespace, self._broker_id)
            if self._closed or self._opened.get(name) is log_:
                raise  # closed with the broker, or not let go of: nothing newer to use
        return await use(await self.get(tenant, namespace))

    def opened(self) -> list[SnapshotLog]:
        """The logs open now (for metrics)."""
        return [
            t.result()
            for t in self._logs.values()
            if t.done() and not t.cancelled() and t.exception() is None
        ]

    async def close(self) -> None:
        """Cancel the logs being opened and close every log opened: each one, whatever
        closing another raised (logged once, at WARNING, or at ERROR with its traceback if
        it is neither the ledger's nor the store's), since each must let go of its ledger.
        A close that stopped at the first failure left the logs after it open, their
        ledgers' writer tasks running, and the next open of one of them in this process was
        refused ("... is held by another writer").

        Raises:
            Exception: the first failure, once every log is closed.
        """
        self._closed = True
        tasks = list(self._logs.values())
        self._logs.clear()
        self._opened.clear()
        for task in tasks:
            task.cancel()  # (no-op for those opened or failed)
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._letting_go.values())  # (each logs its own failure)
        failure: Exception | None = None
        for task in tasks:
            if task.cancelled() or task.exception() is not None:
                continue
            log_ = task.result()
            try:
                await log_.close()
            except Exception as e:
                _close_failed(log_.ledger.name, "closing it", e)
                failure = failure or e
        if failure is not None:
            raise failure


def _close_failed(name: str, what: str, error: Exception) -> None:
    """Log a snapshot log's failed close: at WARNING when the ledger or the store said so,
    at ERROR with the traceback otherwise (a bug)."""
    said = isinstance(error, LedgerError | MetadataStoreError)
    log.log(
        logging.WARNING if said else logging.ERROR,
        "%s: %s failed: %s: %s", name, what, type(error).__name__, error,
        exc_info=not said,
    )  # fmt: skip
