"""Reading a managed ledger: its durable entries, and waiting for more.

The read half of :class:`~segtxn.ledger.managed.ManagedLedger` (which extends this):
entries come from the ledgers its metadata still names, through its open logs
(:class:`~segtxn.ledger.handles.LogHandles`); a reader never sees an entry whose sync is
pending, and parks until the next one is durable instead of polling.
"""

from __future__ import annotations

import asyncio

from segtxn.ledger.chain import LedgerChain
from segtxn.ledger.errors import LedgerClosed, LedgerSealed, WriteFailed
from segtxn.ledger.handles import LogHandles
from segtxn.ledger.position import Entry, Position
from segtxn.ledger.writer import GroupCommit

DISK_SLACK = 64 * 1024
"""What a read bounded by bytes reads from disk is at most twice its bound plus this (entry
headers and batch marks: room for a thousand tiny entries), so that every entry the bound
takes is read; reading ``max_entries`` entries first read gigabytes for a bound of 64 MiB."""


class LedgerReads(LedgerChain):
    """Reads over the chain of ledgers (see the module docstring). The managed ledger that
    extends it keeps these attributes current."""

    _logs: LogHandles
    _changed: asyncio.Event
    """Set (and replaced) whenever an entry becomes durable or the ledger's state changes."""
    _writer: GroupCommit
    _closed: bool

    async def read(
        self, start: Position, *, max_entries: int = 100, max_bytes: int = 5 * 1024 * 1024
    ) -> list[Entry]:
        """Durable entries at or after ``start``, in order, at most ``max_entries`` (and
        about ``max_bytes``: at least one entry is returned if any exists). Positions before
        the first retained entry start at the first retained entry. A ledger that is
        damaged (:mod:`segtxn.ledger.handles`) ends the entries returned before the damage.

        Raises:
            LedgerCorrupted: the entry at ``start`` (or the first one read) is damaged, or
                its ledger's file is missing; the message names the file.
            LedgerClosed: the ledger object is closed.
            ValueError: ``max_entries`` below 1 or ``max_bytes`` below 0.
        """
        if max_entries < 1 or max_bytes < 0:
            raise ValueError(
                f"max_entries must be >= 1 and max_bytes >= 0, not {max_entries}, {max_bytes}"
            )
        if self._closed:
            raise LedgerClosed(f"{self.name} is closed")
        out: list[Entry] = []
        size = 0
        for info in list(self._meta.ledgers):
            if info.id < start.ledger_id or not self._retains(info.id):
                continue  # before the start, or trimmed while this read went on
            count = self._count(info)
            first = max(0, start.entry_id) if info.id == start.ledger_id else 0
            if first >= count:
                continue
            last = min(count - 1, first + max_entries - len(out) - 1)
            on_disk = 2 * (max_bytes - size) + DISK_SLACK  # what the byte bound may take
            payloads = await self._logs.read(info, first, last, on_disk)
            for i, payload in enumerate(payloads):
                if out and size + len(payload) > max_bytes:
                    return out
                out.append(Entry(Position(info.id, first + i), payload))
                size += len(payload)
            if len(out) >= max_entries or len(payloads) <= last - first:
                return out  # (fewer: a damaged ledger; reading on from there raises)
        return out

    def _retains(self, ledger_id: int) -> bool:
        """Whether the metadata still names the ledger. A trim drops ledgers from the
        metadata before it deletes a file, and only files no read holds: a read that
        checks this and registers its read (:class:`LogHandles`) without yielding never
        meets a deleted file (the doomed set is not enough: a ledger leaves it once its
        file is gone)."""
        return any(info.id == ledger_id for info in self._meta.ledgers)

    async def wait_for_entries(self, after: Position | None) -> None:
        """Return once an entry after ``after`` (any entry, for None) is durable.

        Raises:
            LedgerSealed: the ledger is sealed and holds nothing after ``after``.
            LedgerClosed: the ledger was closed while waiting.
        """
        while True:
            changed = self._changed
            if self._last is not None and (after is None or self._last > after):
                return
            if self._meta.sealed:
                raise LedgerSealed(f"{self.name} is sealed at {self._last}")
            if self._writer.failure is not None:
                raise WriteFailed(
                    f"{self.name} failed a write; no more entries will come",
                    self._writer.failure,
                )
            if self._closed:
                raise LedgerClosed(f"{self.name} is closed")
            await changed.wait()
