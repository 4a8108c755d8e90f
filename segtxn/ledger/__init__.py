"""Managed ledgers: durable, sealable entry streams, one per topic or range segment."""

from segtxn.ledger.cursor import ManagedCursor
from segtxn.ledger.errors import (
    CursorDamaged,
    EntryTooLarge,
    LedgerClosed,
    LedgerCorrupted,
    LedgerError,
    LedgerFenced,
    LedgerMismatch,
    LedgerMissing,
    LedgerSealed,
    NotEnoughReplicas,
    StorageFull,
    WriteFailed,
)
from segtxn.ledger.files import FileLogStorage
from segtxn.ledger.logs import Alteration, EntryLog, LogStorage, Recovered, Truncation
from segtxn.ledger.managed import ManagedLedger
from segtxn.ledger.memory import MemoryLogStorage
from segtxn.ledger.metadata import METADATA_PREFIX, LedgerSettings
from segtxn.ledger.position import Entry, Position
from segtxn.ledger.registry import open_log_storage
from segtxn.ledger.reopen import check_deletable, check_files, delete_unopened, movable
from segtxn.ledger.retention import RetentionPolicy, TrimResult

__all__ = [
    "METADATA_PREFIX",
    "Alteration",
    "CursorDamaged",
    "Entry",
    "EntryLog",
    "EntryTooLarge",
    "FileLogStorage",
    "LedgerClosed",
    "LedgerCorrupted",
    "LedgerError",
    "LedgerFenced",
    "LedgerMismatch",
    "LedgerMissing",
    "LedgerSealed",
    "LedgerSettings",
    "LogStorage",
    "ManagedCursor",
    "ManagedLedger",
    "MemoryLogStorage",
    "NotEnoughReplicas",
    "Position",
    "Recovered",
    "RetentionPolicy",
    "StorageFull",
    "TrimResult",
    "Truncation",
    "WriteFailed",
    "check_deletable",
    "check_files",
    "delete_unopened",
    "movable",
    "open_log_storage",
]
