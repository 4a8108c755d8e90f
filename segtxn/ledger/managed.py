"""The managed ledger: one durable, sealable entry stream per topic or segment.

A managed ledger is a chain of entry logs ("ledgers") plus one metadata record in the store,
``/managed-ledgers/<quoted name>`` (:data:`METADATA_PREFIX`), written only with
compare-and-set. The record lists the ledgers (closed ones with their entry counts), the
next ledger id, the sealed flag and the ledger's properties (PIP-373's
``__contains_txn_messages`` among them).

Appends go through a **group-commit** writer (:mod:`segtxn.ledger.writer`): concurrent
appends share one fsync; ``append`` returns once its batch is durable and marked
acknowledged. The append half (appends, rollovers, and the one serialised metadata CAS
that every change of the record goes through) is :mod:`segtxn.ledger.appends`; the read
half is :mod:`segtxn.ledger.reads`.

Each time a managed ledger is opened, the ledger its previous incarnation was appending to
is recovered, closed in the metadata, and a fresh ledger started: a ledger is only ever
appended to by one incarnation, and the metadata CAS fences a stale one (``LedgerFenced``).
What recovery keeps, truncates (with a WARNING) or refuses is the contract of
:mod:`segtxn.ledger.recovery`; the open logs, reads of damaged ones and deletions are
:mod:`segtxn.ledger.handles`; the questions about positions that the chain of ledgers
answers (the first retained entry, the entry after a position...) are
:mod:`segtxn.ledger.chain`, the part cursors depend on.

``terminate()`` seals the ledger: appends already accepted are completed, then one CAS sets
the sealed flag, so a crash leaves the ledger either sealed or not. Sealed ledgers still
serve reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping

import msgspec

from segtxn.ledger.appends import LedgerAppends
from segtxn.ledger.cursor import (
    CursorTurns,
    ManagedCursor,
    cursor_key,
    cursors_prefix,
    restore_cursors,
)
from segtxn.ledger.errors import LedgerClosed, WriteFailed, full_disk_is_retriable, report_once
from segtxn.ledger.fencing import TriedWrites
from segtxn.ledger.handles import LogHandles
from segtxn.ledger.identity import check_identities, delete_chain, own_prefix
from segtxn.ledger.logs import EntryLog, LogStorage, Placement
from segtxn.ledger.metadata import (
    METADATA_PREFIX,
    LedgerInfo,
    LedgerMetadata,
    LedgerSettings,
    closed,
    metadata_key,
    moved,
)
from segtxn.ledger.position import Position
from segtxn.ledger.reopen import open_chain, report_lost
from segtxn.ledger.retention import (
    ClosedLedger,
    RetentionPolicy,
    TrimResult,
    closed_ledgers,
    deletable,
)
from segtxn.ledger.writer import GroupCommit, WriteStats
from segtxn.metastore import MetadataStore, NotFound

log = logging.getLogger(__name__)

__all__ = [  # the metadata names are re-exported for modules that import them from here
    "METADATA_PREFIX",
    "LedgerMetadata",
    "LedgerSettings",
    "ManagedLedger",
    "WriteStats",
    "metadata_key",
]


class ManagedLedger(LedgerAppends):
    """Open with :meth:`open`; close with :meth:`close`. One owner process at a time.
    Its state and positions (``last_confirmed``, ``first_position()``...) come from
    :class:`LedgerChain`, its reads from :class:`LedgerReads` and its appends (and
    rollovers) from :class:`LedgerAppends`."""

    def __init__(
        self,
        *,
        name: str,
        store: MetadataStore,
        storage: LogStorage,
        settings: LedgerSettings,
        metadata: LedgerMetadata,
        version: int,
        logs: dict[int, EntryLog],
    ) -> None:
        self.name = name
        self._store = store
        self._storage = storage
        self.settings = settings
        self._meta = metadata
        self._version = version
        self._logs = LogHandles(name, storage, logs)
        self._current = logs[metadata.ledgers[-1].id] if not metadata.sealed else None
        self._changed = asyncio.Event()
        self._sealing = metadata.sealed
        self._closing = False
        self._closed = False
        self._close_ended = asyncio.Event()  # set once close() has released everything
        self._close_failure: BaseException | None = None  # (what close() raised: all get it)
        self._meta_lock = asyncio.Lock()  # one metadata CAS at a time: they chain versions
        self._tried = TriedWrites()
        self._let_go: list[LedgerInfo] = []
        self._write_lock = asyncio.Lock()  # a batch write, or a roll_over(): one at a time
        self._last = None
        self._last = self._compute_last()
        self.stats = WriteStats()
        self.cursors: dict[str, ManagedCursor] = {}
        self._cursor_turns = CursorTurns()
        self.on_write_failure: list[Callable[[WriteFailed], None]] = []
        """Called once when a write fails and the ledger stops taking appends (its owner
        reopens it, or, for a fenced one, lets it go)."""
        self._writer = GroupCommit(name, settings, self._write, self._write_failed)

    # ================================================================= opening

    @classmethod
    async def open(
        cls,
        name: str,
        store: MetadataStore,
        storage: LogStorage,
        settings: LedgerSettings | None = None,
    ) -> ManagedLedger:
        """Open (creating if needed) the managed ledger ``name`` and its cursors,
        recovering from a crash.

        Recovery (what is kept, truncated with a WARNING, or refused) is the contract of
        :mod:`segtxn.ledger.recovery`.

        Raises:
            LedgerMissing: a ledger the metadata names has no file (a wrong or empty data
                directory); nothing is recreated.
            LedgerMismatch: a ledger's file (any of them) is another's (its header's nonce
                is not the one recorded: a foreign volume, a wrong restore); nothing was
                changed.
            LedgerCorrupted: the last ledger is damaged where a crash cannot explain it.
            LedgerFenced: another process changed the metadata while this one opened it.
            StorageFull: the disk has no room for the ledger's next file (every reopen
                starts one); retriable, nothing changed.
        """
        settings = settings or LedgerSettings()
        with full_disk_is_retriable():
            opened = await open_chain(name, store, storage, settings)
        ledger = cls(
            name=name,
            store=store,
            storage=storage,
            settings=settings,
            metadata=opened.metadata,
            version=opened.version,
            logs=opened.logs,
        )
        try:
            listing = await store.list_prefix(cursors_prefix(name))
        except BaseException:  # failed or cancelled: its writer must not outlive it
            await ledger.close()
            raise
        ledger.cursors.update(
            restore_cursors(
                ledger,
                store,
                listing.records,
                max_persisted_ranges=ledger.settings.max_persisted_ranges,
            )
        )
        marks = {sub: cursor.mark_delete for sub, cursor in ledger.cursors.items()}
        report_lost(name, ledger._meta, marks)
        return ledger

    # ================================================================= sealing

    async def terminate(self) -> Position | None:
        """Seal the ledger: finish the appends already accepted, then refuse all others.

        Idempotent; returns the last position. Durable when it returns (one metadata CAS).
        """
        if self._meta.sealed:
            return self._last
        self._sealing = True
        await self._writer.idle.wait()
        if self._writer.failure is not None:
            raise WriteFailed(
                f"{self.name}: cannot seal after a failed write ({self._writer.failure}); "
                "reopen it",
                self._writer.failure,
            )
        async with self._write_lock:  # not beside a roll_over(): it changes the last ledger
            count = self._current.count if self._current is not None else 0
            size = self._current.size_bytes() if self._current is not None else 0

            def seal(meta: LedgerMetadata) -> LedgerMetadata | None:
                if meta.sealed:
                    return None  # a concurrent terminate() got there first
                closing = closed(meta.ledgers[-1], count, size, int(time.time() * 1000))
                ledgers = [*meta.ledgers[:-1], closing]
                return msgspec.structs.replace(meta, ledgers=ledgers, sealed=True)

            async def let_go(_: LedgerMetadata) -> None:  # run with the CAS (see _update)
                self._current = None

            await self._update(seal, landed=let_go)
        self._notify()
        return self._last

    # ================================================================= properties

    async def update_properties(
        self, updates: Mapping[str, str], removals: tuple[str, ...] = ()
    ) -> None:
        """Set and remove properties in one metadata CAS (durable when it returns)."""

        def change(meta: LedgerMetadata) -> LedgerMetadata:
            properties = {**meta.properties, **updates}
            for key in removals:
                properties.pop(key, None)
            return msgspec.structs.replace(meta, properties=properties)

        await self._update(change)

    # ================================================================= cursors

    async def open_cursor(self, name: str, *, start: str = "latest") -> ManagedCursor:
        """The cursor ``name``, created if missing with its first unacknowledged entry at
        the first retained entry (``start="earliest"``) or the next write (``"latest"``).
        A cursor whose delete failed is taken up again as its record holds it.

        An open and a :meth:`delete_cursor` of the same name run one after the other, in
        call order: the cursor ends open in memory with its record in the store, or
        neither (a cursor returned before a delete is closed by it).

        Raises:
            LedgerClosed: :meth:`close` began (it saves the cursors it holds, and would
                leave a later one behind).
        """
        if start not in ("earliest", "latest"):
            raise ValueError(f"start must be 'earliest' or 'latest', not {start!r}")
        async with self._cursor_turns.turn(name):
            if self._closing:
                raise LedgerClosed(f"{self.name} is closed")
            cursor = self.cursors.get(name)
            if cursor is not None and not cursor.closed:
                return cursor
            if start == "earliest":
                first = self.first_position() or self.next_write_position()
            else:
                first = self.next_write_position()
            mark = Position(first.ledger_id, first.entry_id - 1)
            cursor = await ManagedCursor.create(
                ledger=self,
                name=name,
                store=self._store,
                mark_delete=mark,
                max_persisted_ranges=self.settings.max_persisted_ranges,
            )
            self.cursors[name] = cursor
            return cursor

    async def delete_cursor(self, name: str) -> None:
        """Forget a cursor (idempotent): it no longer holds data back from trimming.

        It is forgotten only once its record is deleted: until then a restart restores it,
        so it keeps holding back what its saved state has not consumed. If the delete
        fails, the cursor is closed but still listed (a retry deletes it;
        :meth:`open_cursor` takes it up again). Runs after the opens and deletes of the
        same name called before it (:meth:`open_cursor`).

        Raises:
            MetadataStoreError: the store failed; the cursor is left as said above.
        """
        async with self._cursor_turns.turn(name):
            cursor = self.cursors.get(name)
            if cursor is not None:
                await cursor.close()
            with contextlib.suppress(NotFound):
                await self._store.delete(cursor_key(self.name, name))
            self.cursors.pop(name, None)

    # ================================================================= retention

    async def trim(self, policy: RetentionPolicy, *, now_s: float | None = None) -> TrimResult:
        """Delete the oldest closed ledgers that ``policy`` lets go (the rules, unconsumed
        data never among them: :mod:`segtxn.ledger.retention`). A ledger being read is
        deleted once its reads end; reads that start later skip it. A ledger whose file is
        not its own (another nonce: a foreign volume, a wrong restore) is never deleted:
        the trim stops before it, says so at ERROR (once per file, then at DEBUG), and
        the metadata keeps naming it
        (:mod:`segtxn.ledger.identity`).

        Each cursor holds data back from its mark in memory (what its dispatcher reads on
        from, lower after a seek back that is not saved yet) *and* from its persisted mark
        (:attr:`ManagedCursor.persisted_mark_delete`): a restart restores the cursor from
        the store, and the entries its saved state counts as unacknowledged are delivered
        again from there. An acknowledgment whose save failed or is still pending releases
        nothing, as Pulsar trims only behind each cursor's persisted mark-delete position.

        Returns what was removed (higher layers trim their own per-entry indexes by it),
        with the ledgers an earlier trim removed though it seemed to fail (its answer and
        the read-back were lost; its state was found landed since) or whose caller was
        cancelled once it landed.
        """
        now_ms = (time.time() if now_s is None else now_s) * 1000
        own = await self._own_files(self._deletable(self._meta, policy, now_ms))
        removable: list[ClosedLedger] = []
        infos: dict[int, LedgerInfo] = {}

        def drop(meta: LedgerMetadata) -> LedgerMetadata | None:
            # chosen under the metadata lock: concurrent trims never remove a ledger twice
            chosen = self._deletable(meta, policy, now_ms)
            removable[:] = itertools.takewhile(lambda c: c.id in own, chosen)
            gone = {i.id for i in removable}
            if not gone:
                return None
            infos.update((i.id, i) for i in meta.ledgers if i.id in gone)
            return msgspec.structs.replace(
                meta, ledgers=[i for i in meta.ledgers if i.id not in gone]
            )

        async def dropped(_: LedgerMetadata) -> None:  # run with the CAS (see _update);
            for ledger in removable:  # reported below, or by the next trim if cancelled
                self._let_go.append(infos[ledger.id])
                await self._logs.doom(infos[ledger.id])  # deleted now, or once reads end

        await self._update(drop, landed=dropped)
        let_go, self._let_go = self._let_go, []  # their files are deleted already
        if not let_go:
            return TrimResult([], 0, None)
        return TrimResult(
            sorted(i.id for i in let_go), sum(i.entries or 0 for i in let_go), self.first_position()
        )

    def _deletable(
        self, meta: LedgerMetadata, policy: RetentionPolicy, now_ms: float
    ) -> list[ClosedLedger]:
        marks = [min(c.mark_delete, c.persisted_mark_delete) for c in self.cursors.values()]
        return deletable(closed_ledgers(meta.ledgers, self._open_size), marks, policy, now_ms)

    async def _own_files(self, chosen: list[ClosedLedger]) -> set[int]:
        """The ids of the front of ``chosen`` whose files are their own: a trim deletes
        no further, so a foreign file (a wrong volume, a wrong restore) stays named by the
        metadata, refused when read and never deleted; said at ERROR the first time
        (:func:`report_once`: every round meets it until an operator acts)."""
        ids = {c.id for c in chosen}
        infos = [i for i in self._meta.ledgers if i.id in ids]
        own, foreign = await asyncio.to_thread(own_prefix, self.name, self._storage, infos)
        if foreign is not None:
            report_once(
                log,
                foreign,
                "%s: retention keeps ledger %d and the ledgers after it, as its file is "
                "not its own: %s",
                self.name,
                infos[len(own)].id,
                foreign,
            )
        return {i.id for i in own}

    async def move_ledger(self, ledger_id: int, was: Placement, now: Placement) -> bool:
        """Record that the closed ledger ``ledger_id`` is kept on ``now`` instead of
        ``was`` (:mod:`segtxn.ledger.replicas.repair` made complete, synced copies), in a
        metadata CAS made in turn with this owner's others; reads go to ``now`` from then
        on. False, changing nothing: it is no longer a closed ledger kept on ``was``.
        Returns once the old log is closed: reads in flight on it end on it first, waited
        for after the CAS, out of the metadata lock (under it, a slow read held the
        ledger's rollovers, trims and clean close as long as it lasted).

        Raises:
            LedgerClosed: this ledger object is closed.
            LedgerFenced: another process owns the ledger now.
        """
        if self._closing:
            raise LedgerClosed(f"{self.name} is closed")
        changed: list[LedgerMetadata] = []

        def move(meta: LedgerMetadata) -> LedgerMetadata | None:
            changed[:] = [] if (after := moved(meta, ledger_id, was, now)) is None else [after]
            return after

        closing: list[asyncio.Event] = []

        async def let_go(_: LedgerMetadata) -> None:  # run with the CAS (see _update)
            if (released := await self._logs.let_go(ledger_id)) is not None:
                closing.append(released)

        await self._update(move, landed=let_go)
        for released in closing:  # (not under the metadata lock: a slow read holds no change)
            await released.wait()
        return bool(changed)

    def _open_size(self, ledger_id: int) -> int:
        """The size of a ledger held open (0 if it is not)."""
        entry_log = self._logs.get(ledger_id)
        return entry_log.size_bytes() if entry_log is not None else 0

    # ================================================================= closing

    @property
    def is_closing(self) -> bool:
        """Whether :meth:`close` was called: this owner let the ledger go (a background
        job that holds it, such as a repair, stops using it)."""
        return self._closing

    async def close(self) -> bool:
        """Finish queued appends, record the clean close, save the cursors, stop the writer,
        release files. Idempotent: every call, the first, one made while it runs and a
        later one, returns once the ledger is closed, with the same outcome: the same
        bool, or the same exception raised again (a broker's stop racing a topic's unload
        must not take a fenced ledger for one left for recovery). A first call cancelled
        part-way is its own task's outcome, not the close's: the others are told whether
        the end was recorded (the metadata change it was making ends first: see
        :meth:`_update`).

        Returns whether the ledger's end is recorded (the clean close, or a seal before).
        False when its writer had stopped (a failed write, a rollover of unknown outcome,
        a fencing): the last ledger's count is then for recovery to judge, so none is
        recorded, and the next open recovers it as after a crash, keeping every
        acknowledged entry (:mod:`segtxn.ledger.recovery`). Said once at WARNING, naming
        the ledger and the failure, and never raised: the failure was raised to the
        appends and told to ``on_write_failure`` already, and those that close ledgers (a
        broker's stop, a topic's unload or delete) must go on closing the rest.

        Raises:
            LedgerFenced, MetadataStoreError: the clean close could not be recorded (the
                files are released all the same).
        """
        if self._closing:
            await self._close_ended.wait()
            return self._close_outcome()
        self._closing = True  # refuse new appends; finish the accepted ones
        try:
            try:
                await self._finish_and_record()
            finally:
                self._closed = True
                await self._writer.close()
                await self._logs.close()
                self._notify()
        except asyncio.CancelledError:
            raise  # (this caller's own: the others get whether the end was recorded)
        except BaseException as e:
            self._close_failure = e
            raise
        finally:
            self._close_ended.set()
        return self._close_outcome()

    async def _finish_and_record(self) -> None:
        """(The first :meth:`close`.) Let the accepted appends end, record the clean close
        (unless a seal recorded the end, or the writer stopped), and save the cursors."""
        await self._writer.idle.wait()
        if self._meta.sealed:
            pass  # its end was recorded by the seal
        elif self._writer.failure is not None:
            log.warning(
                "%s: closed without recording a clean close, as its writer stopped (%s); "
                "its next open recovers its last ledger as after a crash",
                self.name,
                self._writer.failure,
            )
        else:
            await self._record_clean_close()
        for cursor in list(self.cursors.values()):  # (a delete_cursor may run meanwhile)
            await cursor.close()

    def _close_outcome(self) -> bool:
        """(Once :meth:`close` ended.) What it gives every caller: the exception it raised,
        else whether the ledger's end is recorded in the metadata (sealed, or its last
        ledger closed with its count)."""
        if self._close_failure is not None:
            raise self._close_failure
        return self._meta.sealed or self._meta.ledgers[-1].entries is not None

    async def check_deletable(self) -> None:
        """Check, changing nothing, that :meth:`delete` would not refuse this ledger's files:
        a caller that must let go of what uses the ledger before deleting it (a topic hangs
        up on its clients) checks first, so a refusal leaves it all as it was.

        Raises:
            LedgerMismatch: as :meth:`delete`.
        """
        await asyncio.to_thread(check_identities, self.name, self._storage, self._meta.ledgers)

    async def delete(self) -> None:
        """Close the ledger and delete it: its logs, cursors and metadata. Irreversible.

        Raises:
            LedgerMismatch: a file under one of its ledgers' names is another's (a foreign
                volume): it is closed, and nothing was deleted.
        """
        await self.close()
        await delete_chain(self.name, self._storage, self._meta.ledgers, self._meta.next_ledger_id)
        await self._store.delete_range(cursors_prefix(self.name))
        with contextlib.suppress(NotFound):
            await self._store.delete(metadata_key(self.name))

    async def _record_clean_close(self) -> None:
        """Record the last ledger's entry count: after a clean close, recovery can tell
        a lost acknowledged entry (corruption) from a torn unacknowledged tail. Not beside
        a roll_over(): the count recorded for its new ledger would be the old one's, and
        the ledger could never be opened again."""
        async with self._write_lock:
            count = self._current.count if self._current is not None else 0
            size = self._current.size_bytes() if self._current is not None else 0

            def close_last(meta: LedgerMetadata) -> LedgerMetadata:
                last = closed(meta.ledgers[-1], count, size, int(time.time() * 1000))
                ledgers = [*meta.ledgers[:-1], last]
                return msgspec.structs.replace(meta, ledgers=ledgers)

            await self._update(close_last)
