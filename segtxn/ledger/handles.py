"""The entry logs one managed ledger holds open, and the reads and deletions of them.

The ledger being appended to (and the one recovered at open) are held from the start;
closed ledgers are opened on their first read and kept. A read holds its ledger against
deletion: a trim that removes a ledger being read deletes its file when the last read
ends. A closed ledger found damaged serves the entries before the damage and then
``LedgerCorrupted`` naming the file; it is logged once, at ERROR, and a missing one fails
every read the same way without trying the disk again.

No log is ever closed under a read: a log closed under a read's thread left it reading a
closed descriptor (a bare ``OSError``), or worse, one the process had meanwhile given to
another file. Closing waits for the reads in flight to end before it closes the logs;
reads that start once closing has begun raise ``LedgerClosed``. Letting go of one ledger's
log (:meth:`LogHandles.let_go`, when it moved) is the same for that log: reads that start
afterwards open the ledger again, the ones in flight end on it, and the last of them
closes it.
"""

from __future__ import annotations

import asyncio
import logging

from segtxn.ledger.errors import (
    DeleteFailed,
    LedgerClosed,
    LedgerCorrupted,
    LedgerMismatch,
    again,
    report_once,
)
from segtxn.ledger.identity import delete_own
from segtxn.ledger.logs import EntryLog, LogStorage, open_in_thread
from segtxn.ledger.metadata import LedgerInfo

log = logging.getLogger(__name__)


class LogHandles:
    def __init__(self, name: str, storage: LogStorage, logs: dict[int, EntryLog]) -> None:
        self._name = name
        self._storage = storage
        self._logs = logs
        self._reading: dict[int, int] = {}  # ledger id -> reads in flight
        self._doomed: dict[int, LedgerInfo] = {}  # trimmed ledgers to delete once read
        self._unreadable: dict[int, LedgerCorrupted] = {}  # missing closed ledgers
        self._opening = asyncio.Lock()  # one open per closed ledger (its file is locked)
        self._using: dict[EntryLog, int] = {}  # log -> reads in flight on it
        self._letting_go: dict[EntryLog, asyncio.Event] = {}  # forgotten, closed when unused
        self._busy = 0  # reads in flight, each until its deletion of a doomed ledger ended
        self._idle = asyncio.Event()  # set while none is
        self._idle.set()
        self.closing = False
        """Set once :meth:`close` began: reads are refused, the ones in flight end first."""

    def add(self, entry_log: EntryLog) -> None:
        self._logs[entry_log.ledger_id] = entry_log

    def get(self, ledger_id: int) -> EntryLog | None:
        return self._logs.get(ledger_id)

    def __contains__(self, ledger_id: object) -> bool:
        """Whether the ledger is held open."""
        return ledger_id in self._logs

    @property
    def doomed(self) -> frozenset[int]:
        """Trimmed ledgers whose files wait for the reads in flight on them to end."""
        return frozenset(self._doomed)

    @property
    def letting_go(self) -> frozenset[int]:
        """Ledgers whose logs :meth:`let_go` let go of, waiting for the reads in flight on
        them to end before they are closed."""
        return frozenset(entry_log.ledger_id for entry_log in self._letting_go)

    async def read(
        self, info: LedgerInfo, first: int, last: int, max_bytes: int | None = None
    ) -> list[bytes]:
        """Entries ``first..last`` of a ledger (fewer if a damaged one ends before, or
        when the entries from ``first`` on hold more than about ``max_bytes``).

        Raises:
            LedgerCorrupted: ``first`` is damaged, or the ledger's file is missing.
            LedgerClosed: :meth:`close` began.
        """
        if self.closing:
            raise LedgerClosed(f"{self._name} is closed")
        ledger_id = info.id
        self._reading[ledger_id] = self._reading.get(ledger_id, 0) + 1
        self._busy += 1
        self._idle.clear()
        try:
            entry_log = self._logs.get(ledger_id)
            if entry_log is None:  # a closed ledger, opened on first read
                entry_log = await self._open_closed(info)
            return await self._read_on(entry_log, first, last, max_bytes)
        finally:
            self._reading[ledger_id] -= 1
            try:
                if not self._reading[ledger_id]:
                    del self._reading[ledger_id]
                    if ledger_id in self._doomed:
                        await self.delete(ledger_id)
            finally:
                self._busy -= 1
                if not self._busy:
                    self._idle.set()

    async def _read_on(
        self, entry_log: EntryLog, first: int, last: int, max_bytes: int | None
    ) -> list[bytes]:
        """Read from ``entry_log``, holding it open: if :meth:`let_go` let go of it
        meanwhile, the last read on it closes it."""
        self._using[entry_log] = self._using.get(entry_log, 0) + 1
        try:
            if max_bytes is not None:
                last = entry_log.last_within(first, last, max_bytes)
            return await entry_log.read_async(first, last)
        finally:
            self._using[entry_log] -= 1
            if not self._using[entry_log]:
                del self._using[entry_log]
                released = self._letting_go.pop(entry_log, None)
                if released is not None:
                    try:
                        await asyncio.to_thread(entry_log.close)
                    finally:
                        released.set()

    async def _open_closed(self, info: LedgerInfo) -> EntryLog:
        async with self._opening:
            entry_log = self._logs.get(info.id)
            if entry_log is not None:  # a concurrent read opened it
                return entry_log
            unreadable = self._unreadable.get(info.id)
            if unreadable is not None:  # refused as it was the first time, not opened again
                raise again(unreadable)
            try:
                entry_log = await open_in_thread(
                    self._storage.open,
                    self._name,
                    info.id,
                    log_format=info.format,
                    entries=info.entries or 0,
                    size_bytes=info.size_bytes,
                    placement=info.placement,
                    nonce=info.nonce,
                )
            except LedgerCorrupted as e:
                log.error("%s: ledger %d cannot be read: %s", self._name, info.id, e)
                self._unreadable[info.id] = e
                raise
            if entry_log.damage is not None:
                log.error(
                    "%s: ledger %d is damaged; its first %d entries are served, the rest "
                    "refused: %s",
                    self._name,
                    info.id,
                    entry_log.count,
                    entry_log.damage,
                )
            elif entry_log.alteration is not None:  # nothing lost: served, and said
                log.warning("%s: %s", self._name, entry_log.alteration)
            self._logs[info.id] = entry_log
            return entry_log

    async def let_go(self, ledger_id: int) -> asyncio.Event | None:
        """Let go of a closed ledger's log, if open: its next read opens it again from its
        metadata (its placement changed). Reads in flight on it end on it, with their
        entries, and the last of them closes it: returns an event set then (None: closed
        now, or not open). The wait is the caller's, apart from this: a managed ledger lets
        go with its metadata change, under its metadata lock, and a slow read waited for
        there held every other change of that ledger (rollovers, trims, clean close) as
        long as it lasted."""
        entry_log = self._logs.pop(ledger_id, None)
        if entry_log is None:
            return None
        if entry_log not in self._using:
            await asyncio.to_thread(entry_log.close)
            return None
        return self._letting_go.setdefault(entry_log, asyncio.Event())

    async def doom(self, info: LedgerInfo) -> None:
        """Delete a trimmed ledger's file now, or when the reads in flight on it end."""
        self._doomed[info.id] = info
        if info.id not in self._reading:
            await self.delete(info.id)

    async def delete(self, ledger_id: int) -> None:
        """Close a doomed ledger's log and delete its file, unless the file is another's
        (its nonce is not the one recorded: a foreign volume, a wrong restore): that one
        is left as it is, and said at ERROR once per file (the trim that dropped it checked it,
        so only a file replaced since gets here). A file that cannot be removed (permission
        denied, an I/O error) is left and said the same way: the trim has landed, and raising
        here stopped it before the ledgers after this one were deleted and reported, and
        failed a read that had ended well (its deletion runs when the read ends)."""
        info = self._doomed.pop(ledger_id)
        self._unreadable.pop(ledger_id, None)
        entry_log = self._logs.pop(ledger_id, None)
        if entry_log is not None:
            await asyncio.to_thread(entry_log.close)
        try:
            await asyncio.to_thread(delete_own, self._name, self._storage, info)
        except LedgerMismatch as e:
            report_once(
                log, e, "%s: trimmed ledger %d: its file is left: %s", self._name, ledger_id, e
            )
        except DeleteFailed as e:  # the trim landed: its other ledgers go on being deleted
            report_once(
                log, e, "%s: trimmed ledger %d: its file is left on disk (remove it once "
                "the cause is fixed): %s", self._name, ledger_id, e,
            )  # fmt: skip

    async def close(self) -> None:
        """Refuse new reads, wait for the ones in flight (each reads what it asked for, a
        bounded piece), then close every log: none is closed under a read."""
        self.closing = True
        await self._idle.wait()
        for entry_log in list(self._logs.values()):
            await asyncio.to_thread(entry_log.close)
