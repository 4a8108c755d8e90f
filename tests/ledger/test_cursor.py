"""Cursors: mark-delete and individual acks, durability, seek/reset, sealed ledgers, retention."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from segtxn.ledger import LedgerSettings, LogStorage, ManagedLedger, Position, RetentionPolicy
from segtxn.ledger.metadata import METADATA_PREFIX
from segtxn.metastore import MetadataStore, StoreUnavailable
from segtxn.metastore.faults import FaultInjector
from tests.ledger.conftest import OpenLedger
from tests.waiting import wait_until

AT_ONCE = RetentionPolicy(retention_time_s=0)  # consumed ledgers go as soon as consumed


async def test_individual_acks_advance_the_mark(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = [await ledger.append(str(i).encode()) for i in range(6)]
    assert cursor.backlog() == 6
    await cursor.ack([p[1], p[2], p[4]])
    assert cursor.mark_delete < p[0] and not cursor.is_acked(p[0]) and cursor.is_acked(p[4])
    await cursor.ack([p[0]])
    assert cursor.mark_delete == p[2]  # 0,1,2 contiguous now
    assert list(cursor.acked_ranges) == [(p[4], p[4])]
    assert cursor.backlog() == 2
    await cursor.ack_cumulative(p[5])
    assert cursor.mark_delete == p[5] and len(cursor.acked_ranges) == 0 and cursor.backlog() == 0


async def test_cursor_state_survives_reopen(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = [await ledger.append(b"x") for _ in range(5)]
    await cursor.ack([p[0], p[3]])
    await ledger.close()
    again = await open_ledger()
    restored = again.cursors["sub"]
    assert restored.mark_delete == p[0]
    assert list(restored.acked_ranges) == [(p[3], p[3])]
    await restored.ack([p[1], p[2]])
    assert restored.mark_delete == p[3]


async def test_the_mark_crosses_ledger_boundaries(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=250)
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = [await ledger.append(b"y" * 100) for _ in range(9)]
    assert len({x.ledger_id for x in p}) >= 3
    await cursor.ack(list(reversed(p)))
    assert cursor.mark_delete == p[-1] and cursor.backlog() == 0


async def test_concurrent_acks_coalesce_store_writes(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = [await ledger.append(b"z") for _ in range(200)]
    before = await store.revision()
    await asyncio.gather(*(cursor.ack([x]) for x in p))
    writes = await store.revision() - before
    assert cursor.mark_delete == p[-1]
    assert writes < 50, f"200 acks cost {writes} store writes"


async def test_seek_and_reset(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    p = [await ledger.append(b"s") for _ in range(4)]
    latest = await ledger.open_cursor("late")  # starts after everything written so far
    assert latest.backlog() == 0
    earliest = await ledger.open_cursor("early", start="earliest")
    assert earliest.backlog() == 4
    await earliest.seek(p[2])
    assert earliest.backlog() == 2 and earliest.is_acked(p[1]) and not earliest.is_acked(p[2])
    await earliest.reset_to_latest()
    assert earliest.backlog() == 0
    await earliest.reset_to_earliest()
    assert earliest.backlog() == 4


async def test_cursors_move_on_a_sealed_ledger(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = [await ledger.append(b"t") for _ in range(3)]
    await ledger.terminate()
    await cursor.ack(p)
    assert cursor.mark_delete == p[-1]
    await ledger.close()
    reopened = await open_ledger()
    assert reopened.is_sealed and reopened.cursors["sub"].mark_delete == p[-1]


async def test_deleted_cursor_is_forgotten(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    await ledger.open_cursor("gone")
    await ledger.delete_cursor("gone")
    await ledger.delete_cursor("gone")  # idempotent
    await ledger.close()
    assert "gone" not in (await open_ledger()).cursors


async def test_retention_trims_only_consumed_closed_ledgers(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=250)
    slow = await ledger.open_cursor("slow", start="earliest")
    fast = await ledger.open_cursor("fast", start="earliest")
    p = [await ledger.append(b"r" * 100) for _ in range(12)]
    ledgers = sorted({x.ledger_id for x in p})
    await fast.ack_cumulative(p[-1])
    nothing = await ledger.trim(AT_ONCE)
    assert nothing.ledgers == []  # "slow" has consumed nothing
    await slow.ack_cumulative(p[5])
    trimmed = await ledger.trim(AT_ONCE)
    assert trimmed.ledgers and max(trimmed.ledgers) < p[6].ledger_id
    assert trimmed.first_retained is not None and trimmed.first_retained <= p[6]
    assert trimmed.entries == sum(1 for x in p if x.ledger_id in trimmed.ledgers)
    remaining = await ledger.read(Position(0, 0), max_entries=100)
    assert remaining[0].position == trimmed.first_retained
    assert set(ledgers) - set(trimmed.ledgers)
    # a time-based policy keeps even consumed data until it is old enough
    await slow.ack_cumulative(p[-1])
    kept = await ledger.trim(RetentionPolicy(retention_time_s=3600))
    assert kept.ledgers == []
    late = await ledger.trim(RetentionPolicy(retention_time_s=3600), now_s=10**10)
    assert late.ledgers


async def test_trim_waits_for_reads_in_flight(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=250)
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = [await ledger.append(b"q" * 100) for _ in range(9)]
    await cursor.ack_cumulative(p[-1])
    await ledger.close()
    ledger = await open_ledger(max_ledger_bytes=250)  # closed ledgers now open lazily
    first_ledger = p[0].ledger_id
    reading = asyncio.create_task(ledger.read(p[0], max_entries=2))
    await asyncio.sleep(0)  # the read has registered and gone to its thread
    trimmed = await ledger.trim(AT_ONCE)
    assert first_ledger in trimmed.ledgers
    entries = await reading
    assert [e.position for e in entries] == p[:2]  # served, not broken by the trim
    # ...and deleted by the read's end: every closed ledger was consumed, so none is left
    assert first_ledger not in ledger._logs and not ledger._logs.doomed
    assert await ledger.read(p[0]) == []


@contextlib.asynccontextmanager
async def _ledger_with_faults(
    store: MetadataStore, storage: LogStorage
) -> AsyncIterator[tuple[ManagedLedger, FaultInjector]]:
    """Ledger ``cur`` on ``store`` through a fault injector (closed after)."""
    faulty = MetadataStore(FaultInjector(store.engine), owns_engine=False)
    injector = faulty.engine
    assert isinstance(injector, FaultInjector)
    ledger = await ManagedLedger.open("cur", faulty, storage, LedgerSettings())
    try:
        yield ledger, injector
    finally:
        await ledger.close()


async def _mark_when_reopened(store: MetadataStore, storage: LogStorage) -> Position:
    """Cursor ``sub``'s mark-delete as ledger ``cur`` opened again (what its store holds)."""
    reopened = await ManagedLedger.open("cur", store, storage, LedgerSettings())
    try:
        return reopened.cursors["sub"].mark_delete
    finally:
        await reopened.close()


async def test_an_unknown_cursor_write_outcome_is_resolved(
    store: MetadataStore, storage: LogStorage
) -> None:
    async with _ledger_with_faults(store, storage) as (ledger, injector):
        cursor = await ledger.open_cursor("sub", start="earliest")
        p = [await ledger.append(b"u") for _ in range(3)]
        injector.fail("txn", key_prefix="/managed-cursors/", after_apply=True)
        await cursor.ack([p[0]])  # the reply was lost, but the write landed: not fenced
        await cursor.ack([p[1], p[2]])
        assert injector.injected == 1 and cursor.mark_delete == p[2]


async def test_a_create_whose_answer_was_lost_is_taken_on_the_retry(
    store: MetadataStore, storage: LogStorage
) -> None:
    """The store applies a cursor's create but its answer is lost (etcd restarting under
    it): the caller sees the error, and the retry takes the cursor the store holds rather
    than failing on "already exists" for good (a new segment's subscription stayed missing
    that way in a soak run, seed 77000, and its consumers got nothing from it)."""
    async with _ledger_with_faults(store, storage) as (ledger, injector):
        p = [await ledger.append(b"u") for _ in range(3)]
        injector.fail("txn", key_prefix="/managed-cursors/", after_apply=True)
        with pytest.raises(StoreUnavailable):
            await ledger.open_cursor("sub", start="earliest")
        assert "sub" not in ledger.cursors
        cursor = await ledger.open_cursor("sub", start="latest")
        assert cursor.mark_delete == Position(p[0].ledger_id, p[0].entry_id - 1)  # as created
        await cursor.ack([p[0], p[1]])  # at the store's version: not refused as a conflict
        assert cursor.mark_delete == p[1]
    assert await _mark_when_reopened(store, storage) == p[1]


async def test_a_save_during_the_ledgers_own_rollover_is_tried_again(
    store: MetadataStore, storage: LogStorage
) -> None:
    """A cursor's save is conditional on the ledger's metadata record at the version this
    process last wrote. Its own rollover changed the record, and the save reached the store
    before that rollover's answer came back: the save must wait the rollover out and try
    again with the new version, not take it for another owner's change (a fenced cursor:
    the acknowledgment failed, and the subscription was let go)."""
    async with _ledger_with_faults(store, storage) as (ledger, injector):
        cursor = await ledger.open_cursor("sub", start="earliest")
        p = [await ledger.append(b"r") for _ in range(2)]
        held = injector.hold("txn", key_prefix=METADATA_PREFIX, times=1)  # applied, answer held
        rolling = asyncio.create_task(ledger.roll_over())
        await held.wait_for(1)
        saves = injector.count("txn", key_prefix="/managed-cursors/")
        acking = asyncio.create_task(cursor.ack([p[0], p[1]]))
        await wait_until(lambda: saves.calls >= 1, what="the save reached the store")
        assert not acking.done()  # it waits for the rollover, rather than failing at once
        held.release()
        await rolling
        await acking
        assert cursor.mark_delete == p[1]
    assert await _mark_when_reopened(store, storage) == p[1]
