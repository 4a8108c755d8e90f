"""In-memory entry logs: the same contract, held in the process (tests, ``memory://``)."""

from __future__ import annotations

from collections.abc import Sequence

from segtxn.ledger.logs import EntryLog, LogStorage


class MemoryEntryLog(EntryLog):
    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self._entries: list[bytes] = []
        self._bytes = 0

    @property
    def count(self) -> int:
        return len(self._entries)

    def size_bytes(self) -> int:
        return self._bytes

    def append_batch(self, payloads: Sequence[bytes]) -> None:
        self._entries.extend(payloads)
        self._bytes += sum(len(p) for p in payloads)

    def read(self, first: int, last: int) -> list[bytes]:
        return self._entries[first : last + 1]

    def close(self) -> None:
        return None


class MemoryLogStorage(LogStorage):
    """Logs outlive a ManagedLedger object (reopening finds them) but not the process."""

    def __init__(self) -> None:
        self._logs: dict[tuple[str, int], MemoryEntryLog] = {}

    def create(self, ledger_name: str, ledger_id: int) -> MemoryEntryLog:
        log = MemoryEntryLog(ledger_id)
        self._logs[ledger_name, ledger_id] = log
        return log

    def open(self, ledger_name: str, ledger_id: int, *, tail_bytes: int) -> MemoryEntryLog:
        log = self._logs.get((ledger_name, ledger_id))
        return log if log is not None else self.create(ledger_name, ledger_id)

    def delete(self, ledger_name: str, ledger_id: int) -> None:
        self._logs.pop((ledger_name, ledger_id), None)
