"""The very first ledger of a managed ledger whose metadata record could not be created.

A first open makes ledger 1's log, then creates the record that names it (expecting no
record). When the store refused that record (another owner created it first), the log
stayed: ledger 1's file (and its directory) on a broker that never owned the ledger, known
to no record, so no deletion ever removed it. It is removed now, when the store refused the
record (nothing names it, nor ever will), only if it holds nothing but its header and
nobody holds it.

Kept, as before, when the record's outcome is unknown (the store did not answer): it may
still land, naming the log. Then a later open reuses the file, and it rewrote the header
with a new nonce, so a record landing late named the old one: the next open refused its
own ledger ("LedgerMismatch"). A reused file keeps its header's nonce now, and a refused
create never removes a file it reused (the earlier create's record may name it).

Real components: file-backed and in-memory logs, the in-memory store wrapped by the fault
injector (a create's write held before it reaches the store, or failed to its caller and
applied later, as an etcd proposal still queued when the client gave up).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.ledger import (
    FileLogStorage,
    LedgerFenced,
    LedgerSettings,
    LogStorage,
    ManagedLedger,
    Position,
)
from segtxn.ledger.memory import MemoryLogStorage
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, StoreUnavailable, open_store
from segtxn.metastore.faults import FaultInjector
from tests.ledger.test_ledger_edges import faults

NAME = "persistent://t/n/first-create"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


def another_broker_s(storage: LogStorage, tmp_path: Path) -> LogStorage:
    """Storage of the same kind as ``storage``, on another broker."""
    if isinstance(storage, FileLogStorage):
        return FileLogStorage(tmp_path / "another-broker")
    return MemoryLogStorage()


async def test_a_first_create_the_store_refused_removes_its_file(
    store: MetadataStore, storage: LogStorage, tmp_path: Path
) -> None:
    held = faults(store).hold("txn", key_prefix=metadata_key(NAME), before=True)
    opening = asyncio.create_task(ManagedLedger.open(NAME, store, storage, LedgerSettings()))
    await held.wait_for(1)  # ledger 1's log made, its record on its way
    assert storage.exists(NAME, 1)
    winner = await ManagedLedger.open(NAME, store, another_broker_s(storage, tmp_path))
    await winner.close()
    held.release()
    with pytest.raises(LedgerFenced, match="created concurrently"):
        await opening

    assert not storage.exists(NAME, 1), "the refused create's file is left"
    if isinstance(storage, FileLogStorage):
        assert not storage.path(NAME, 1).parent.exists(), "its directory is left"


async def test_a_first_create_that_lands_late_names_the_file_a_later_create_reused(
    store: MetadataStore, storage: LogStorage
) -> None:
    late = faults(store).apply_late(key_prefix=metadata_key(NAME))
    with pytest.raises(StoreUnavailable):  # its answer lost: the write may still land
        await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    assert storage.exists(NAME, 1), "a create of unknown outcome removed its file"

    held = faults(store).hold("txn", key_prefix=metadata_key(NAME), before=True)
    retry = asyncio.create_task(ManagedLedger.open(NAME, store, storage, LedgerSettings()))
    await held.wait_for(1)  # the retry reused ledger 1's file; its record on its way
    await late.applied()  # the first create's record lands
    held.release()
    with pytest.raises(LedgerFenced):  # refused: the record exists (the first create's)
        await retry

    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    try:
        assert ledger.ledger_ids == [1, 2]
        written = await ledger.append(b"after")
        assert [e.payload for e in await ledger.read(Position(1, 0))] == [b"after"]
        assert written == Position(2, 0)
    finally:
        assert await ledger.close()
