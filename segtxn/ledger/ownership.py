"""Whose change a write fenced by a ledger's metadata record met: the one check shared by
every such write (a cursor's save, a de-duplication snapshot's, an op-record step).

Those writes are conditional on the ledger's metadata record being at the version its owner
(this process) last wrote: another owner's open changes it, and from then on this one
writes nothing. When the condition fails, the change it met is either the owner's own (a
rollover, a trim meanwhile: the write is tried again on the new version) or another
owner's (a fence). Telling them apart may need a read of the record: the owner's own last
change may have landed with its answer and read-back lost
(:meth:`~segtxn.ledger.appends.LedgerAppends.settled_metadata_version`).

**Only proof is a fence**: the record settled and still at the version the write checked.
Any failure to settle it is :class:`~segtxn.ledger.fencing.OwnerUnknown`: a store that
does not answer (read again, :data:`OWNER_READS` times in all, so that a moment's trouble
costs no write), one that refuses the read (``StoreAccessDenied``) or is closed, or the
record found holding a rollover of the owner's own that it cannot take up (the ledger must
be reopened). Before, each caller had its own check: only ``StoreUnavailable`` was told
apart, every other failure left the version unchanged and was reported as a take-over that
never happened ("not served by this broker any more", ``OwnerChanged``, ``SnapshotFenced``);
and only the snapshot's check read again, so a cursor's save or a transactional send
failed on one failed read.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from segtxn.ledger.errors import LedgerError
from segtxn.ledger.fencing import OwnerUnknown
from segtxn.metastore import MetadataStoreError

OWNER_READS = 3
"""How many times the record is read to settle the owner's own change while the store does
not answer (a failure that is not retriable is not read again)."""
OWNER_READ_PAUSE_S = 0.2
"""The pause between those reads (a retry interval, not a wait for a condition)."""


class SettledOwner(Protocol):
    """The ledger a write is fenced by (a managed ledger)."""

    @property
    def name(self) -> str: ...

    async def settled_metadata_version(self, *, strict: bool = False) -> int: ...


async def changed_by_its_owner(owner: SettledOwner, version: int) -> bool:
    """After a write conditional on ``owner``'s metadata record at ``version`` was refused
    because the record changed: whether the change was the owner's own (True: try the write
    again on the owner's new version) or, the record settled and still at ``version``,
    another owner's (False: the write is fenced).

    Raises:
        OwnerUnknown: the owner's own change could not be settled (see the module
            docstring): nothing says another owner exists, and the write did not land.
            Its message says why, for the caller to quote.
    """
    failure: MetadataStoreError | LedgerError | None = None
    for attempt in range(OWNER_READS):
        if attempt:
            await asyncio.sleep(OWNER_READ_PAUSE_S)
        try:
            return await owner.settled_metadata_version(strict=True) != version
        except (MetadataStoreError, LedgerError) as e:
            failure = e
            if not e.retriable:
                break
    raise OwnerUnknown(
        f"could not tell whether {owner.name} was opened by another owner or changed by "
        f"this one (its own change's outcome is unknown, and settling it failed: "
        f"{type(failure).__name__}: {failure}); nothing is fenced"
    ) from failure
