"""Positions over a managed ledger's chain of ledgers: which entries it holds, and where.

A managed ledger is a chain of ledgers (entry logs), oldest first, as its metadata record
lists them (:mod:`segtxn.ledger.metadata`): closed ones with their entry counts, and the one
being appended to. :class:`LedgerChain` answers the questions about positions that this
list and the last durable entry decide — the first retained entry, whether a position holds
an entry, the entry after a position, how many lie after it, where the next append goes —
without touching a file or the store.

It is the part of a :class:`~segtxn.ledger.managed.ManagedLedger` (which extends it) that a
:class:`~segtxn.ledger.cursor.ManagedCursor` needs: a cursor depends on this, not on the
managed ledger that owns it. Only durable entries count: a reader never sees an entry whose
sync is pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from segtxn.ledger.errors import LedgerFenced
from segtxn.ledger.logs import EntryLog
from segtxn.ledger.metadata import LedgerInfo, LedgerMetadata
from segtxn.ledger.position import Position


class LedgerChain:
    """Positions over the chain of ledgers (see the module docstring). The managed ledger
    that extends it keeps these attributes current."""

    name: str
    _meta: LedgerMetadata
    """The metadata record as last written (or read at open)."""
    _version: int
    """That record's version: writes of the ledger's other records (cursors) are
    conditional on it, so a replaced owner cannot make them."""
    _last: Position | None
    """The last durable entry."""
    _current: EntryLog | None
    """The ledger being appended to (None once sealed)."""
    _meta_lock: asyncio.Lock
    """Held while this process changes the metadata record (one CAS at a time)."""

    @property
    def metadata_version(self) -> int:
        return self._version

    async def settled_metadata_version(self, *, strict: bool = False) -> int:
        """The metadata record's version once no change of this process's own is in
        flight: a write conditional on the record (a cursor's, an op record's) that failed
        while this process was changing it can tell that change from another owner's.
        (``strict``: see :meth:`~segtxn.ledger.appends.LedgerAppends.settled_metadata_version`;
        a chain alone has no change in doubt.)"""
        async with self._meta_lock:
            return self._version

    def fenced(self, error: LedgerFenced) -> None:
        """A write conditional on the metadata record (a cursor's save, a de-duplication
        snapshot, an op record) found it changed by another owner (``error``;
        :func:`~segtxn.ledger.ownership.changed_by_its_owner` proved it, and tells it):
        this process owns the ledger no more. Or a cursor's save found the cursor's record
        written by someone else (:class:`~segtxn.ledger.errors.CursorOverwritten`): only an
        open reads it again. A chain alone (a sealed ledger read without opening it) has
        nothing to stop; a managed ledger stops taking appends and tells its owner
        (:meth:`~segtxn.ledger.appends.LedgerAppends.fenced`)."""

    @property
    def is_sealed(self) -> bool:
        return self._meta.sealed

    @property
    def last_confirmed(self) -> Position | None:
        """The last durable entry, or None if the ledger holds none."""
        return self._last

    @property
    def properties(self) -> Mapping[str, str]:
        return dict(self._meta.properties)

    @property
    def ledger_ids(self) -> list[int]:
        """The ids of the retained ledgers, oldest first (every id below the first was
        trimmed: ids only grow)."""
        return [info.id for info in self._meta.ledgers]

    @property
    def ledgers(self) -> Sequence[LedgerInfo]:
        """The retained ledgers' metadata, oldest first: closed ones have ``entries``
        (the last one is open, unless the managed ledger is sealed)."""
        return tuple(self._meta.ledgers)

    def retained_bytes(self) -> int:
        """Bytes on disk of the retained ledgers (a closed ledger recorded before sizes
        were kept counts as 0)."""
        closed = [info for info in self._meta.ledgers if info.entries is not None]
        open_bytes = self._current.size_bytes() if self._current is not None else 0
        return sum(info.size_bytes or 0 for info in closed) + open_bytes

    def first_position(self) -> Position | None:
        """The first retained entry, or None if the ledger holds none."""
        for info in self._meta.ledgers:
            count = self._count(info)
            if count:
                return Position(info.id, 0)
        return None

    def _count(self, info: LedgerInfo) -> int:
        """Durable entries of a ledger: readers never see an entry whose sync is pending."""
        if info.entries is not None:
            return info.entries
        if self._last is not None and self._last.ledger_id == info.id:
            return self._last.entry_id + 1
        return 0

    def contains(self, position: Position) -> bool:
        """True if ``position`` is a durable entry of this ledger that is still retained."""
        for info in self._meta.ledgers:
            if info.id == position.ledger_id:
                return 0 <= position.entry_id < self._count(info)
        return False

    def position_after(self, position: Position) -> Position | None:
        """The entry that follows ``position`` in this ledger, or None if it is not
        written (yet). ``position`` need not exist (a mark before a ledger's first entry is
        ``(ledger, -1)``; a trimmed ledger is skipped)."""
        for info in self._meta.ledgers:
            if info.id < position.ledger_id:
                continue
            count = self._count(info)
            following = position.entry_id + 1 if info.id == position.ledger_id else 0
            if following < count:
                return Position(info.id, following)
        return None

    def next_write_position(self) -> Position:
        """Where the next append would go (just after the last entry, once sealed)."""
        if self._current is not None:
            return Position(self._current.ledger_id, self._current.count)
        if self._last is not None:
            return Position(self._last.ledger_id, self._last.entry_id + 1)
        return Position(self._meta.ledgers[-1].id, 0)

    def count_after(self, position: Position) -> int:
        """How many durable entries lie after ``position``."""
        total = 0
        for info in self._meta.ledgers:
            count = self._count(info)
            if info.id > position.ledger_id:
                total += count
            elif info.id == position.ledger_id:
                total += max(0, count - position.entry_id - 1)
        return total

    def _compute_last(self) -> Position | None:
        for info in reversed(self._meta.ledgers):
            count = self._count(info)
            if count:
                return Position(info.id, count - 1)
        return None
