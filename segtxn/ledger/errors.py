"""The managed ledger's error tree."""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every managed-ledger error."""

    retriable: bool = False


class LedgerSealed(LedgerError):
    """The ledger is terminated (sealed): it accepts no more appends. Reads still work."""


class LedgerClosed(LedgerError):
    """The ledger object was closed by its owner."""


class LedgerCorrupted(LedgerError):
    """Stored data failed its checksum where a crash cannot explain it (not a torn tail).

    Nothing after the damage is served; an operator has to restore the data.
    """


class LedgerFenced(LedgerError):
    """Another writer changed this ledger's metadata: this one is no longer the owner."""


class EntryTooLarge(LedgerError):
    """An entry exceeds the ledger's maximum entry size."""
