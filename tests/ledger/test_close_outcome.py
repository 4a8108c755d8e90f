"""Every caller of :meth:`ManagedLedger.close` gets the same outcome.

A close promised a second caller (one that called while the first ran, or later) "the same
answer". When the first caller's close failed to record the clean close (another owner had
changed the record: ``LedgerFenced``), the first caller got that error, and the second got
False, as if the writer had stopped: a broker's stop racing a topic's unload took a fenced
ledger for one left for recovery. Every caller now gets the first one's outcome: the same
exception, or the same bool. A first caller cancelled part-way is its own task's outcome,
not the close's: the others get whether the ledger's end was recorded.

Real components: the in-memory store wrapped by the fault injector, whose ``hold`` parks
the close's compare-and-set before it reaches the store while "another owner" writes the
record; file-backed and in-memory logs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from segtxn.ledger import LedgerFenced, LedgerSettings, LogStorage, ManagedLedger
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.faults import FaultInjector
from tests.ledger.test_ledger_edges import faults

NAME = "persistent://t/n/closed-twice"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


async def test_a_close_made_while_a_failing_one_runs_gets_its_error(
    store: MetadataStore, storage: LogStorage
) -> None:
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    await ledger.append(b"a")
    held = faults(store).hold("txn", key_prefix=metadata_key(NAME), before=True)
    first = asyncio.create_task(ledger.close())
    await held.wait_for(1)  # its clean-close CAS is on its way
    second = asyncio.create_task(ledger.close())
    record = await store.get(metadata_key(NAME))
    assert record is not None
    await store.put(metadata_key(NAME), record.value, expected_version=record.version)
    held.release()  # the record moved on: another owner's

    with pytest.raises(LedgerFenced) as raised:
        await first
    outcome = (await asyncio.gather(second, return_exceptions=True))[0]
    assert outcome is raised.value, f"the second caller got {outcome!r}"
    with pytest.raises(LedgerFenced) as later:  # and so does a later one
        await ledger.close()
    assert later.value is raised.value


async def test_every_caller_of_a_clean_close_gets_true(
    store: MetadataStore, storage: LogStorage
) -> None:
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    await ledger.append(b"a")
    held = faults(store).hold("txn", key_prefix=metadata_key(NAME), before=True)
    first = asyncio.create_task(ledger.close())
    await held.wait_for(1)
    second = asyncio.create_task(ledger.close())
    held.release()
    assert await first is True
    assert await second is True
    assert await ledger.close() is True


async def test_a_cancelled_first_close_gives_the_others_whether_the_end_was_recorded(
    store: MetadataStore, storage: LogStorage
) -> None:
    """The first caller's task was cancelled while its clean close was in flight: the CAS
    still ends (a cancel waits for a metadata change's answer), so the end is recorded, and
    the second caller is told so; it is not cancelled itself."""
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    await ledger.append(b"a")
    held = faults(store).hold("txn", key_prefix=metadata_key(NAME))
    first = asyncio.create_task(ledger.close())
    await held.wait_for(1)  # applied; its answer parked
    second = asyncio.create_task(ledger.close())
    first.cancel()
    held.release()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second is True
    assert await ledger.close() is True
