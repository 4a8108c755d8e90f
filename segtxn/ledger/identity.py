"""Whether a ledger's file is that ledger's, before anything is decided from it or done to it.

Each file-backed ledger's header holds a random nonce, recorded in its ``LedgerInfo`` when
it is created (:mod:`segtxn.ledger.records`). Opening and recovering a ledger check it
(:mod:`segtxn.ledger.recovery`); this module checks it where nothing is opened: the
broker's start-up check (:func:`check_identities`), and every deletion (retention trims,
a managed ledger's delete, a sealed one's), which must never delete another's file found
under a ledger's name (another cluster's volume, a restored copy of another incarnation
of the topic): that file is left as it is, and the refusal names it, its ledger and both
nonces (``LedgerMismatch``). Ledgers recorded without a nonce (before it was kept, or
replicated ones) have nothing to check, and are deleted as they always were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from segtxn.ledger.errors import LedgerMismatch
from segtxn.ledger.logs import LogStorage
from segtxn.ledger.metadata import LedgerInfo


def check_identities(name: str, storage: LogStorage, ledgers: Sequence[LedgerInfo]) -> None:
    """Check that the file of each of ``ledgers`` (of the managed ledger ``name``) that
    recorded a nonce is that ledger's (:meth:`LogStorage.verify_identity`); files are
    only read. A missing file passes (``check_files`` refuses it where it matters).

    Raises:
        LedgerMismatch: the first foreign one (its ledger, its file, both nonces), saying
            how many of them are foreign, and which.
    """
    foreign: list[LedgerMismatch] = []
    for info in ledgers:
        try:
            storage.verify_identity(name, info.id, info.nonce)
        except LedgerMismatch as e:
            foreign.append(e)
    if not foreign:
        return
    first = foreign[0]
    paths = ", ".join(str(e.path) for e in foreign)
    raise LedgerMismatch(
        f"{first} ({len(foreign)} of its {len(ledgers)} ledger files are not its own: {paths})",
        path=str(first.path),
        recorded=first.recorded,
        found=first.found,
    )


def own_prefix(
    name: str, storage: LogStorage, ledgers: Sequence[LedgerInfo]
) -> tuple[list[LedgerInfo], LedgerMismatch | None]:
    """The longest prefix of ``ledgers`` whose files are their own (what a trim, which
    deletes from the front only, may delete), and why the ledger after it is not (None:
    every one is)."""
    for n, info in enumerate(ledgers):
        try:
            storage.verify_identity(name, info.id, info.nonce)
        except LedgerMismatch as e:
            return list(ledgers[:n]), e
    return list(ledgers), None


def delete_own(name: str, storage: LogStorage, info: LedgerInfo) -> None:
    """Delete the ledger's log (idempotent), unless its file is another's.

    Raises:
        LedgerMismatch: the file is left as it is.
    """
    storage.verify_identity(name, info.id, info.nonce)
    storage.delete(name, info.id, info.placement)


async def delete_chain(
    name: str, storage: LogStorage, ledgers: Sequence[LedgerInfo], next_ledger_id: int
) -> None:
    """Delete the logs of the managed ledger ``name`` (its ``ledgers``, oldest first, what
    a trim a crash cut short left below them, and what a create whose metadata change
    failed left at ``next_ledger_id``), once every file is found to be its own: on a
    foreign volume nothing is deleted.

    The log at ``next_ledger_id`` is deleted only unused (no entry) and held by nobody
    (:meth:`LogStorage.delete_unused`): the record says that id is the next to be made,
    so a log there is this managed ledger's (ids are never reused) or an owner's create
    in flight, which holds it, and whose change fails once the record is deleted.

    Raises:
        LedgerMismatch: as :func:`check_identities`; nothing was deleted.
    """
    await asyncio.to_thread(check_identities, name, storage, ledgers)
    if ledgers:
        await asyncio.to_thread(storage.delete_leftovers, name, ledgers[0].id)
    for info in ledgers:
        await asyncio.to_thread(delete_own, name, storage, info)
    await asyncio.to_thread(storage.delete_unused, name, next_ledger_id)
