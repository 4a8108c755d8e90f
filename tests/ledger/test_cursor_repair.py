"""Repairing a cursor record that does not read, from the store alone
(:mod:`segtxn.ledger.cursor_repair`).

A damaged cursor record refuses its ledger's every open (``CursorDamaged``), and nothing
but a hand edit of the store got it open again. The repair rewrites the record so that the
cursor starts at the first retained entry (or at a given one), by compare-and-set on the
damaged version: it refuses a record that reads, a missing one, and one rewritten between
its read and its write.

Real components: the memory store and etcd (fault-injecting engine), file and memory logs.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import pytest

from segtxn.ledger import LedgerSettings, LogStorage, ManagedLedger, Position
from segtxn.ledger.cursor import cursor_key
from segtxn.ledger.cursor_repair import (
    CursorChanged,
    CursorNotFound,
    CursorReadable,
    LedgerNotFound,
    TargetBeyondEnd,
    repair_cursor,
)
from segtxn.ledger.errors import CursorDamaged
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector

NAME = "persistent://t/n/repair"
SMALL = LedgerSettings(max_ledger_bytes=256)
GARBAGE = b"\x00{not a cursor"


@pytest.fixture(params=["memory", "etcd"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[MetadataStore]:
    """The memory store, then a namespace of the session's etcd (tests/ledger's own store
    is the memory one only), through a fault injector."""
    url = "memory://"
    if request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd_server")
        url = server.url(f"/cursor-repair-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    async with open_store(url, wrap=FaultInjector) as opened:
        yield opened


@pytest.fixture
def faults(store: MetadataStore) -> FaultInjector:
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    return engine


async def _written(store: MetadataStore, storage: LogStorage, n: int) -> list[Position]:
    """``n`` entries over several ledgers, all acknowledged by the cursor ``sub``; the
    ledger closed after."""
    ledger = await ManagedLedger.open(NAME, store, storage, SMALL)
    cursor = await ledger.open_cursor("sub", start="earliest")
    positions = [await ledger.append(b"entry-%03d" % i * 10) for i in range(n)]
    await cursor.ack_cumulative(positions[-1])
    await ledger.close()
    return positions


async def test_a_damaged_cursor_restarts_at_the_first_retained_entry(
    store: MetadataStore, storage: LogStorage
) -> None:
    positions = await _written(store, storage, 12)
    assert len({p.ledger_id for p in positions}) > 1, "wanted several ledgers"
    key = cursor_key(NAME, "sub")
    await store.put(key, GARBAGE)
    with pytest.raises(CursorDamaged):
        await ManagedLedger.open(NAME, store, storage, SMALL)

    repaired = await repair_cursor(store, NAME, "sub")

    assert repaired.key == key and repaired.replaced == GARBAGE
    assert repaired.next_position == positions[0]
    assert repaired.reason == "JSON is malformed: invalid character (byte 0)"
    ledger = await ManagedLedger.open(NAME, store, storage, SMALL)
    try:
        cursor = ledger.cursors["sub"]
        assert not any(cursor.is_acked(p) for p in positions), "acknowledged entries lost"
        assert cursor.backlog() == len(positions)
    finally:
        await ledger.close()


async def test_a_given_position_is_where_it_restarts_and_none_past_the_end(
    store: MetadataStore, storage: LogStorage
) -> None:
    positions = await _written(store, storage, 12)
    await store.put(cursor_key(NAME, "sub"), GARBAGE)
    last = positions[-1]
    with pytest.raises(TargetBeyondEnd, match="beyond the end"):
        await repair_cursor(store, NAME, "sub", start=Position(last.ledger_id + 5, 0))
    assert (await store.get(cursor_key(NAME, "sub"))).value == GARBAGE  # type: ignore[union-attr]

    await repair_cursor(store, NAME, "sub", start=positions[5])

    ledger = await ManagedLedger.open(NAME, store, storage, SMALL)
    try:
        cursor = ledger.cursors["sub"]
        assert [cursor.is_acked(p) for p in positions] == [True] * 5 + [False] * 7
    finally:
        await ledger.close()


async def test_a_readable_record_a_missing_one_and_a_missing_ledger_are_refused(
    store: MetadataStore, storage: LogStorage
) -> None:
    with pytest.raises(LedgerNotFound):
        await repair_cursor(store, NAME, "sub")
    await _written(store, storage, 3)
    key = cursor_key(NAME, "sub")
    before = await store.get(key)

    with pytest.raises(CursorReadable, match="reset the subscription"):
        await repair_cursor(store, NAME, "sub")
    with pytest.raises(CursorNotFound, match="no subscription 'other'"):
        await repair_cursor(store, NAME, "other")

    assert await store.get(key) == before, "a readable record was rewritten"
    assert await store.get(cursor_key(NAME, "other")) is None, "a cursor was made"


async def test_a_record_rewritten_between_the_read_and_the_write_is_not_overwritten(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector
) -> None:
    """The repair's read of the damaged record is held; meanwhile the record is written
    again (another repair, or a hand edit): the repair's write is refused, and the record
    keeps what was written meanwhile."""
    await _written(store, storage, 3)
    key = cursor_key(NAME, "sub")
    await store.put(key, GARBAGE)
    held = faults.hold("range", key_prefix=key)
    repairing = asyncio.create_task(repair_cursor(store, NAME, "sub"))
    await held.wait_for(1)  # it has read the damaged record
    await store.put(key, b"meanwhile")
    held.release()

    with pytest.raises(CursorChanged, match="changed while it was being repaired"):
        await repairing
    record = await store.get(key)
    assert record is not None and record.value == b"meanwhile"
