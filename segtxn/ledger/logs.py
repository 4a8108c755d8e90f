"""Entry logs: the physical ledgers a managed ledger is made of.

An :class:`EntryLog` is one append-only ledger: entries numbered 0, 1, 2, ... written in
batches that are durable when ``append_batch`` returns. :class:`LogStorage` creates, opens
(recovering from a crash) and deletes them. A replicated implementation (BookKeeper-style
ensembles) would slot in here; the managed ledger above does not care where bytes live.

Methods are blocking: the managed ledger calls them from a worker thread, one at a time per
log (appends are serialized by the group-commit writer; reads may run concurrently with an
append and only ever see whole, synced entries).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence


class EntryLog(ABC):
    ledger_id: int

    @property
    @abstractmethod
    def count(self) -> int:
        """Number of entries (the next entry id)."""

    @abstractmethod
    def append_batch(self, payloads: Sequence[bytes]) -> None:
        """Append entries ``count .. count+len-1``; durable when this returns."""

    @abstractmethod
    def read(self, first: int, last: int) -> list[bytes]:
        """Entries ``first..last`` inclusive (all must exist).

        Raises:
            LedgerCorrupted: an entry fails its checksum.
        """

    @abstractmethod
    def size_bytes(self) -> int: ...

    @abstractmethod
    def close(self) -> None:
        """Release the log (and the exclusive hold on it). Idempotent."""


class LogStorage(ABC):
    """Where the entry logs of every managed ledger on this broker live."""

    @abstractmethod
    def create(self, ledger_name: str, ledger_id: int) -> EntryLog:
        """A new, empty log (an empty leftover file from a crash is reused).

        Raises:
            LedgerFenced: another handle (in this or another process) holds the log.
            LedgerCorrupted: a file with data already exists under this id (its metadata
                was lost); it is never overwritten.
        """

    @abstractmethod
    def open(
        self, ledger_name: str, ledger_id: int, *, tail_bytes: int, must_exist: bool = True
    ) -> EntryLog:
        """Open an existing log exclusively, recovering from a crash.

        Whatever the log holds is made durable first (a crashed writer may have left
        unsynced pages). A torn or corrupt record within the last ``tail_bytes`` (the most
        one crashed, unacknowledged batch can span on disk) is truncated away with
        everything after it; damage before that raises ``LedgerCorrupted``. A missing log
        is created empty unless ``must_exist``.

        Raises:
            LedgerCorrupted: damage a crash cannot explain, or a missing log that must exist.
            LedgerFenced: another handle holds the log.
        """

    @abstractmethod
    def delete(self, ledger_name: str, ledger_id: int) -> None:
        """Remove a log (idempotent)."""
