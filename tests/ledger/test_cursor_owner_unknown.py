"""A cursor's save that met a change of its ledger's metadata record is fenced only on proof
that another owner made it; every other failure of the check is ``OwnerUnknown``.

A save is conditional on the ledger's metadata record (another owner's open changes it).
When the check fails while the ledger's own change of that record is in doubt (it landed,
its answer and read-back lost), only settling that change tells whose change it met. Before,
only a store that did not answer (``StoreUnavailable``) was told as such: a read refused
(``StoreAccessDenied``), a closed store (``StoreClosed``), or a take-up finding a rollover of
the ledger's own (``LedgerFenced``: reopen it) left the version unchanged, and the save was
refused as ``OwnerChanged``, "another owner has the ledger", while none had it.

And a read that fails once (a moment's trouble) is read again, as the de-duplication
snapshot's check does (:mod:`segtxn.ledger.ownership`): the save lands.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from segtxn.ledger import (
    LedgerError,
    LedgerFenced,
    LedgerSettings,
    LogStorage,
    ManagedLedger,
    Position,
    WriteFailed,
)
from segtxn.ledger.fencing import OwnerChanged, OwnerUnknown
from segtxn.ledger.metadata import METADATA_PREFIX, metadata_key
from segtxn.ledger.ownership import OWNER_READS
from segtxn.metastore import (
    MetadataStore,
    MetadataStoreError,
    StoreAccessDenied,
    StoreClosed,
    StoreUnavailable,
    open_store,
)
from segtxn.metastore.faults import FaultInjector

NAME = "persistent://t/n/cursor-owner-unknown"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


def faults(store: MetadataStore) -> FaultInjector:
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    return engine


@pytest.fixture
async def ledger(store: MetadataStore, storage: LogStorage) -> AsyncIterator[ManagedLedger]:
    """``NAME`` with its cursor ``sub`` at the start and two entries; closed after the test
    (faults cleared) unless the test closed it."""
    opened = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    await opened.open_cursor("sub", start="earliest")
    yield opened
    faults(store).clear()
    if not opened.is_closing:
        with contextlib.suppress(LedgerError, MetadataStoreError):
            await opened.close()


async def two_entries(ledger: ManagedLedger) -> list[Position]:
    return [await ledger.append(b"e%d" % i) for i in range(2)]


def lose_the_next_answer_and_read_back(store: MetadataStore) -> None:
    """The ledger's next change of its record lands; its answer and read-back are lost."""
    injected = faults(store)
    injected.fail("txn", key_prefix=METADATA_PREFIX, after_apply=True)
    injected.fail("range", key_prefix=METADATA_PREFIX, times=1)


@pytest.mark.parametrize(
    "refusal",
    [StoreAccessDenied("injected: permission denied"), StoreClosed("injected: store closed")],
    ids=["access-denied", "closed"],
)
async def test_a_refused_read_of_the_owner_is_not_a_fence(
    store: MetadataStore, ledger: ManagedLedger, refusal: MetadataStoreError
) -> None:
    p = await two_entries(ledger)
    cursor = ledger.cursors["sub"]
    lose_the_next_answer_and_read_back(store)
    with pytest.raises(StoreUnavailable):
        await ledger.update_properties({"k": "v"})
    faults(store).fail("range", key_prefix=METADATA_PREFIX, times=None, error=refusal)
    told: list[WriteFailed] = []
    ledger.on_write_failure.append(told.append)
    with pytest.raises(MetadataStoreError) as unknown:
        await cursor.ack([p[0], p[1]])
    faults(store).clear()
    assert not told  # nothing is fenced: the ledger takes appends as before
    assert isinstance(unknown.value, OwnerUnknown), repr(unknown.value)
    assert not isinstance(unknown.value, LedgerFenced)
    said = str(unknown.value)
    assert "could not tell whether" in said and str(refusal) in said, said
    await cursor.flush()  # the store answers: the save lands, the ledger's change taken up
    assert cursor.durable and cursor.persisted_mark_delete == p[1]
    assert ledger.properties == {"k": "v"}
    await ledger.close()


async def test_a_rollover_of_its_own_found_by_the_check_is_not_a_fence(
    store: MetadataStore, ledger: ManagedLedger
) -> None:
    """The record holds the ledger's own rollover (it landed unseen): the ledger must be
    reopened, but nothing says another owner has it: the save is ``OwnerUnknown``."""
    p = await two_entries(ledger)
    cursor = ledger.cursors["sub"]
    lose_the_next_answer_and_read_back(store)
    with pytest.raises(StoreUnavailable):
        await ledger.roll_over()
    with pytest.raises(MetadataStoreError) as unknown:
        await cursor.ack([p[0]])
    assert isinstance(unknown.value, OwnerUnknown), repr(unknown.value)
    assert not isinstance(unknown.value, LedgerFenced)
    assert "rollover of its own" in str(unknown.value), str(unknown.value)


async def test_another_owners_change_is_still_a_fence(
    store: MetadataStore, ledger: ManagedLedger
) -> None:
    p = await two_entries(ledger)
    cursor = ledger.cursors["sub"]
    key = metadata_key(NAME)
    record = await store.get(key)
    assert record is not None
    await store.put(key, record.value, expected_version=record.version)  # "recovered"
    with pytest.raises(OwnerChanged):
        await cursor.ack([p[0]])
    with pytest.raises(LedgerFenced):
        await ledger.close()


async def test_a_fenced_save_stops_the_ledgers_appends_and_tells_its_owner_once(
    store: MetadataStore, ledger: ManagedLedger
) -> None:
    """Another owner's change met by a save stops the ledger as a fenced write does: its
    appends are refused (retriable: the ledger is served where it is owned now), and its
    owner is told once, however many saves meet the fence (a broker unloads the topic)."""
    p = await two_entries(ledger)
    told: list[WriteFailed] = []
    ledger.on_write_failure.append(told.append)
    cursor = ledger.cursors["sub"]
    key = metadata_key(NAME)
    record = await store.get(key)
    assert record is not None
    await store.put(key, record.value, expected_version=record.version)  # "recovered"
    for position in p:
        with pytest.raises(OwnerChanged) as fenced:
            await cursor.ack([position])
        assert "another owner opened the ledger" in str(fenced.value), str(fenced.value)
    assert len(told) == 1 and isinstance(told[0].cause, OwnerChanged), told
    assert told[0].retriable
    with pytest.raises(WriteFailed) as refused:
        await ledger.append(b"after")
    assert refused.value.retriable
    assert len(told) == 1


async def test_a_read_of_the_owner_failing_briefly_does_not_fail_the_save(
    store: MetadataStore, ledger: ManagedLedger
) -> None:
    """The read that settles the ledger's own change fails ``OWNER_READS - 1`` times and
    then answers: the save lands (it failed with OwnerUnknown on the first failed read)."""
    p = await two_entries(ledger)
    cursor = ledger.cursors["sub"]
    lose_the_next_answer_and_read_back(store)
    with pytest.raises(StoreUnavailable):
        await ledger.update_properties({"k": "v"})
    reads = faults(store).count("range", key_prefix=METADATA_PREFIX)
    faults(store).fail("range", key_prefix=METADATA_PREFIX, times=OWNER_READS - 1)
    await cursor.ack([p[0], p[1]])
    assert reads.calls == OWNER_READS, reads
    assert cursor.durable and cursor.persisted_mark_delete == p[1]
    assert ledger.properties == {"k": "v"}
    await ledger.close()


async def test_a_read_of_the_owner_failing_throughout_is_owner_unknown_after_bounded_reads(
    store: MetadataStore, ledger: ManagedLedger
) -> None:
    p = await two_entries(ledger)
    cursor = ledger.cursors["sub"]
    lose_the_next_answer_and_read_back(store)
    with pytest.raises(StoreUnavailable):
        await ledger.update_properties({"k": "v"})
    reads = faults(store).count("range", key_prefix=METADATA_PREFIX)
    faults(store).fail("range", key_prefix=METADATA_PREFIX, times=None)
    with pytest.raises(OwnerUnknown):
        await cursor.ack([p[0]])
    faults(store).clear()
    assert reads.calls == OWNER_READS, reads
    await ledger.close()
