"""Deleting a managed ledger that is open nowhere (:func:`segtxn.ledger.delete_unopened`: a
topic's pending-ack log, a deletion finished after a restart) removes the file a failed
create left at its next ledger id, and nothing that may be another's.

Every open of a managed ledger (and every rollover) creates the next ledger's file, at the
record's ``next_ledger_id``, before one compare-and-set names it. When that CAS fails (the
store away, another owner), the file stays behind, holding only its header, and the record
still says its id is next. A deletion deleted the ledgers the record names and left that
file, and with it the managed ledger's directory, for good. It is removed now, but only
when it is provably this ledger's and unused: at the id the record gives as next, holding no
entry, and held by nobody (a create in flight holds its file until its CAS answers).

Real components: file-backed and in-memory logs, the in-memory store wrapped by the fault
injector (the reopen's CAS fails, or is held while the deletion runs).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from segtxn.ledger import (
    FileLogStorage,
    LedgerError,
    LedgerSettings,
    LogStorage,
    ManagedLedger,
    delete_unopened,
)
from segtxn.ledger.metadata import METADATA_PREFIX, metadata_key
from segtxn.metastore import MetadataStore, MetadataStoreError, StoreUnavailable, open_store
from segtxn.metastore.faults import FaultInjector
from tests.ledger.test_ledger_edges import faults

NAME = "persistent://t/n/deleted-unopened"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


async def a_closed_ledger(store: MetadataStore, storage: LogStorage) -> None:
    """``NAME`` with entries in two ledgers, closed cleanly: its record's next id is 3."""
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    await ledger.append(b"a")
    await ledger.roll_over()
    await ledger.append(b"b")
    assert await ledger.close()


def leftover(storage: LogStorage) -> bool:
    """Whether anything of ``NAME`` is left in the storage (its directory, for files)."""
    if isinstance(storage, FileLogStorage):
        return storage.path(NAME, 1).parent.exists()
    return any(storage.exists(NAME, i) for i in range(1, 5))


async def test_a_deletion_removes_the_file_a_reopen_whose_metadata_change_failed_left(
    store: MetadataStore, storage: LogStorage
) -> None:
    await a_closed_ledger(store, storage)
    faults(store).fail("txn", key_prefix=METADATA_PREFIX)  # the reopen's CAS never lands
    with pytest.raises(StoreUnavailable):
        await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    assert storage.exists(NAME, 3), "the failed reopen made no file at the next ledger id"

    await delete_unopened(NAME, store, storage)

    assert not storage.exists(NAME, 3), "the failed create's file at the next ledger id is left"
    assert not leftover(storage)
    assert await store.get(metadata_key(NAME)) is None


async def test_a_deletion_leaves_the_next_ledger_s_file_while_a_create_holds_it(
    store: MetadataStore, storage: LogStorage
) -> None:
    """An owner's reopen has made its next ledger's file and waits for its CAS: the file
    is that owner's, in use, and the deletion (racing the load) must not take it."""
    await a_closed_ledger(store, storage)
    held = faults(store).hold("txn", key_prefix=METADATA_PREFIX, before=True)
    opening = asyncio.create_task(ManagedLedger.open(NAME, store, storage, LedgerSettings()))
    try:
        await held.wait_for(1)
        await delete_unopened(NAME, store, storage)
        assert storage.exists(NAME, 3), "the deletion took a file a create in flight holds"
    finally:
        held.release()
        with contextlib.suppress(LedgerError, MetadataStoreError):
            ledger = await opening
            await ledger.close()


async def test_a_deletion_leaves_a_file_with_entries_at_the_next_ledger_id(
    store: MetadataStore, storage: LogStorage
) -> None:
    """A file at the next ledger id that holds entries was never a failed create's (a new
    ledger holds none until the record names it): the metadata does not know it, and it
    is not this deletion's to destroy."""
    await a_closed_ledger(store, storage)
    stranger = await asyncio.to_thread(storage.create, NAME, 3)
    try:
        await asyncio.to_thread(stranger.append_batch, [b"not known to the record"])
    finally:
        stranger.close()

    await delete_unopened(NAME, store, storage)

    assert storage.exists(NAME, 3)
    assert not storage.exists(NAME, 1) and not storage.exists(NAME, 2)
    assert await store.get(metadata_key(NAME)) is None


async def test_a_managed_ledger_s_delete_removes_the_file_a_failed_rollover_left(
    store: MetadataStore, storage: LogStorage
) -> None:
    """The same file left by a rollover whose CAS did not land (the ledger goes on where it
    was) is removed by the open ledger's own delete."""
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    await ledger.append(b"a")
    faults(store).fail("txn", key_prefix=METADATA_PREFIX)
    with pytest.raises(StoreUnavailable):
        await ledger.roll_over()
    assert storage.exists(NAME, 2)
    await ledger.append(b"b")

    await ledger.delete()

    assert not leftover(storage), "the failed rollover's file is left"
