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

What is done to the closed ledgers while it is open (retention's trims, repair's placement
moves) is :mod:`segtxn.ledger.upkeep`; its close (one outcome for every caller) and
deletion are :mod:`segtxn.ledger.closing`. This module opens it (with its cursors), seals
it and changes its properties: ``terminate()`` seals the ledger: appends already accepted
are completed, then one CAS sets the sealed flag, so a crash leaves the ledger either
sealed or not. Sealed ledgers still serve reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import msgspec

from segtxn.ledger.closing import LedgerClosing
from segtxn.ledger.cursor import (
    CursorTurns,
    ManagedCursor,
    cursor_key,
    cursors_prefix,
    restore_cursors,
)
from segtxn.ledger.errors import (
    LedgerClosed,
    WriteFailed,
    close_after_cut,
    full_disk_is_retriable,
)
from segtxn.ledger.fencing import TriedWrites
from segtxn.ledger.handles import LogHandles
from segtxn.ledger.logs import EntryLog, LogStorage
from segtxn.ledger.metadata import (
    METADATA_PREFIX,
    LedgerInfo,
    LedgerMetadata,
    LedgerSettings,
    closed,
    metadata_key,
)
from segtxn.ledger.position import Position
from segtxn.ledger.reopen import open_chain, report_lost
from segtxn.ledger.upkeep import LedgerUpkeep
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


class ManagedLedger(LedgerUpkeep, LedgerClosing):
    """Open with :meth:`open`; close with :meth:`close`. One owner process at a time.
    Its state and positions (``last_confirmed``, ``first_position()``...) come from
    :class:`LedgerChain`, its reads from :class:`LedgerReads`, its appends (and
    rollovers) from :class:`LedgerAppends`, its trims and placement moves from
    :class:`LedgerUpkeep`, and its close and deletion from :class:`LedgerClosing`; this
    class opens it, seals it, and holds its properties and cursors."""

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
        self._close_ended = asyncio.Event()
        self._close_failure = None
        self._meta_lock = asyncio.Lock()  # one metadata CAS at a time: they chain versions
        self._tried = TriedWrites()
        self._let_go: list[LedgerInfo] = []
        self._write_lock = asyncio.Lock()  # a batch write, or a roll_over(): one at a time
        self._last = None
        self._last = self._compute_last()
        self.stats = WriteStats()
        self.cursors = {}
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
            CursorDamaged: a cursor's record in the store does not read (its key named).
            MetadataStoreError: the store failed.

        Whatever fails (or cancels the open) once the ledger is opened, reading its
        cursors among it, closes the ledger before it propagates: its writer and files
        must not outlive a failed open (the next open would meet them).
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
            await ledger._restore_cursors()
        except BaseException:  # failed or cancelled: its writer must not outlive it
            await close_after_cut(ledger.close(), name)  # (raising what cut it, not this)
            raise
        return ledger

    async def _restore_cursors(self) -> None:
        """(:meth:`open`, the ledger opened.) Restore its cursors from the store, and say
        which of them had consumed entries its files no longer hold.

        Raises:
            CursorDamaged: a cursor's record does not read.
            MetadataStoreError: the store failed.
        """
        listing = await self._store.list_prefix(cursors_prefix(self.name))
        self.cursors.update(
            restore_cursors(
                self,
                self._store,
                listing.records,
                max_persisted_ranges=self.settings.max_persisted_ranges,
            )
        )
        marks = {sub: cursor.mark_delete for sub, cursor in self.cursors.items()}
        report_lost(self.name, self._meta, marks)

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
