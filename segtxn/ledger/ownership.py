"""Whose change a write fenced by a ledger's metadata record met: the one check shared by
every such write (a cursor's save, a de-duplication snapshot's, an op-record step), and the
one place that tells the ledger when it is another owner's.

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

**Proof of another owner stops the ledger, whichever write found it** (the ledger's
``fenced``: it takes no more appends, and its owner is told once, as after an append that
met the fence: a broker unloads the topic and hangs up on its clients, who find the new
owner). Before, only a cursor's save told it: a de-duplication snapshot or an op record
that met the fence refused what it wrote and left the topic served by a broker that no
longer owned it, until an append or a save met the fence in its turn.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from segtxn.ledger.errors import LedgerError, LedgerFenced
from segtxn.ledger.fencing import OwnerChanged, OwnerUnknown
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

    def fenced(self, error: LedgerFenced) -> None: ...


async def changed_by_its_owner(owner: SettledOwner, version: int) -> bool:
    """After a write conditional on ``owner``'s metadata record at ``version`` was refused
    because the record changed: whether the change was the owner's own (True: try the write
    again on the owner's new version) or, the record settled and still at ``version``,
    another owner's (False: the write is fenced, and the owner was told first: ``fenced``,
    see the module docstring; once is enough, it ignores the next ones).

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
            settled = await owner.settled_metadata_version(strict=True)
        except (MetadataStoreError, LedgerError) as e:
            failure = e
            if not e.retriable:
                break
            continue
        if settled != version:
            return True
        owner.fenced(
            OwnerChanged(
                f"{owner.name} was opened by another owner (its metadata record moved on "
                f"from version {version}, not by this one)"
            )
        )
        return False
    raise OwnerUnknown(
        f"could not tell whether {owner.name} was opened by another owner or changed by "
        f"this one (its own change's outcome is unknown, and settling it failed: "
        f"{type(failure).__name__}: {failure}); nothing is fenced"
    ) from failure
