"""Managed ledgers: durable, sealable entry streams, one per topic or range segment."""

from segtxn.ledger.errors import (
    EntryTooLarge,
    LedgerClosed,
    LedgerCorrupted,
    LedgerError,
    LedgerFenced,
    LedgerSealed,
    NoSuchEntry,
)
from segtxn.ledger.files import FileLogStorage
from segtxn.ledger.logs import EntryLog, LogStorage
from segtxn.ledger.managed import METADATA_PREFIX, LedgerSettings, ManagedLedger
from segtxn.ledger.memory import MemoryLogStorage
from segtxn.ledger.position import Entry, Position

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
    "ManagedLedger",
    "MemoryLogStorage",
    "NoSuchEntry",
    "Position",
]
