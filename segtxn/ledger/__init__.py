"""Managed ledgers: durable, sealable entry streams, one per topic or range segment."""

from segtxn.ledger.cursor import ManagedCursor
from segtxn.ledger.errors import (
    EntryTooLarge,
    LedgerClosed,
    LedgerCorrupted,
    LedgerError,
    LedgerFenced,
    LedgerSealed,
)
from segtxn.ledger.files import FileLogStorage
from segtxn.ledger.logs import EntryLog, LogStorage
from segtxn.ledger.managed import METADATA_PREFIX, LedgerSettings, ManagedLedger
from segtxn.ledger.memory import MemoryLogStorage
from segtxn.ledger.position import Entry, Position
from segtxn.ledger.registry import open_log_storage
from segtxn.ledger.retention import RetentionPolicy, TrimResult

__all__ = [
    "METADATA_PREFIX",
    "Entry",
    "EntryLog",
    "EntryTooLarge",
    "FileLogStorage",
    "LedgerClosed",
    "LedgerCorrupted",
    "LedgerError",
    "LedgerFenced",
    "LedgerSealed",
    "LedgerSettings",
    "LogStorage",
    "ManagedCursor",
    "ManagedLedger",
    "MemoryLogStorage",
    "Position",
    "RetentionPolicy",
    "TrimResult",
    "open_log_storage",
]
