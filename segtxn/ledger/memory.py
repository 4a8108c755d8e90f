"""In-memory entry logs: the same contract, held in the process (tests, ``memory://``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from segtxn.ledger.errors import LedgerClosed, LedgerCorrupted, LedgerFenced
from segtxn.ledger.logs import EntryLog, LogStorage


class MemoryEntryLog(EntryLog):
    """A handle on entries the storage keeps; only one handle per log is open at a time."""

    def __init__(self, ledger_id: int, entries: list[bytes], release: Callable[[], None]) -> None:
        self.ledger_id = ledger_id
        self._entries = entries
        self._release: Callable[[], None] | None = release

    @property
    def count(self) -> int:
        return len(self._entries)

    def size_bytes(self) -> int:
        return sum(len(e) for e in self._entries)

    def append_batch(self, payloads: Sequence[bytes]) -> None:
        if self._release is None:
            raise LedgerClosed(f"ledger {self.ledger_id} handle is closed")
        self._entries.extend(payloads)

    def read(self, first: int, last: int) -> list[bytes]:
        return self._entries[first : last + 1]

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


class MemoryLogStorage(LogStorage):
    """Logs outlive a ManagedLedger object (reopening finds them) but not the process."""

    def __init__(self) -> None:
        self._logs: dict[tuple[str, int], list[bytes]] = {}
        self._held: set[tuple[str, int]] = set()

    def _handle(self, key: tuple[str, int]) -> MemoryEntryLog:
        if key in self._held:
            raise LedgerFenced(f"ledger {key[1]} of {key[0]} is held by another writer")
        self._held.add(key)
        return MemoryEntryLog(key[1], self._logs[key], lambda: self._held.discard(key))

    def create(self, ledger_name: str, ledger_id: int) -> MemoryEntryLog:
        key = (ledger_name, ledger_id)
        if key in self._held:
            raise LedgerFenced(f"ledger {ledger_id} of {ledger_name} is held by another writer")
        self._logs[key] = []
        return self._handle(key)

    def open(
        self, ledger_name: str, ledger_id: int, *, tail_bytes: int, must_exist: bool = True
    ) -> MemoryEntryLog:
        key = (ledger_name, ledger_id)
        if key not in self._logs:
            if must_exist:
                raise LedgerCorrupted(f"ledger {ledger_id} of {ledger_name} is missing")
            return self.create(ledger_name, ledger_id)
        return self._handle(key)

    def delete(self, ledger_name: str, ledger_id: int) -> None:
        self._logs.pop((ledger_name, ledger_id), None)
