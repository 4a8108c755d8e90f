"""In-memory entry logs: the same contract, held in the process (tests, ``memory://``).

Nothing here is torn or damaged by a crash (a crash loses it all): recovery truncates
nothing, and a log the metadata names but this process does not hold is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from segtxn.ledger.errors import LedgerClosed, LedgerCorrupted, LedgerFenced, LedgerMissing
from segtxn.ledger.logs import LOCAL, EntryLog, LogStorage, Placement, Recovered, check_local


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

    def where(self, ledger_name: str, ledger_id: int) -> str:
        return f"memory://{ledger_name}/{ledger_id}"

    def exists(self, ledger_name: str, ledger_id: int) -> bool:
        return (ledger_name, ledger_id) in self._logs

    def _handle(self, key: tuple[str, int]) -> MemoryEntryLog:
        if key in self._held:
            raise LedgerFenced(f"ledger {key[1]} of {key[0]} is held by another writer")
        if key not in self._logs:
            where = self.where(*key)
            raise LedgerMissing(
                f"{where}: the metadata names this ledger; it is missing", paths=(where,)
            )
        self._held.add(key)
        return MemoryEntryLog(key[1], self._logs[key], lambda: self._held.discard(key))

    def create(self, ledger_name: str, ledger_id: int) -> MemoryEntryLog:
        key = (ledger_name, ledger_id)
        if key in self._held:
            raise LedgerFenced(f"ledger {ledger_id} of {ledger_name} is held by another writer")
        if self._logs.get(key):
            raise LedgerCorrupted(
                f"{self.where(*key)} already holds entries that the ledger metadata does not "
                "know; refusing to overwrite it"
            )
        reused = key in self._logs
        self._logs[key] = []
        created = self._handle(key)
        created.reused = reused
        return created

    def recover(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        tail_bytes: int,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> Recovered:
        check_local(placement, self.where(ledger_name, ledger_id))
        return Recovered(self._handle((ledger_name, ledger_id)), None)

    def open(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        entries: int,
        size_bytes: int | None = None,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> MemoryEntryLog:
        check_local(placement, self.where(ledger_name, ledger_id))
        return self._handle((ledger_name, ledger_id))

    def delete(self, ledger_name: str, ledger_id: int, placement: Placement = LOCAL) -> None:
        self._logs.pop((ledger_name, ledger_id), None)

    def delete_unused(self, ledger_name: str, ledger_id: int) -> bool:
        key = (ledger_name, ledger_id)
        if key in self._held or key not in self._logs or self._logs[key]:
            return False
        del self._logs[key]
        return True
