"""De-duplication forgets producer names idle past its expiry (issue 22: every name that
ever produced to a topic stayed in memory and in its snapshot for good, and clients make
new names at each start: the snapshot would outgrow one store write)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import pytest

from segtxn.broker.dedup import Deduplication
from segtxn.broker.dedup_snapshots import PREFIX, DedupSnapshot
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.ledger import LedgerSettings, ManagedLedger, MemoryLogStorage
from segtxn.metastore import MetadataStore, open_store

TOPIC = "persistent://t/n/dedup"
HOUR_MS = 3600 * 1000


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://") as s:
        yield s


async def ledger_with(store: MetadataStore, sends: list[tuple[str, int, int]]) -> ManagedLedger:
    """A ledger holding one message per (producer, seq, publish time ms)."""
    ledger = await ManagedLedger.open(TOPIC, store, MemoryLogStorage(), LedgerSettings())
    for producer, seq, at_ms in sends:
        await ledger.append(encode_entry(StoredMessage(producer, seq, at_ms, b"x")))
    return ledger


async def snapshot_of(store: MetadataStore) -> DedupSnapshot:
    record = await store.get(PREFIX + "persistent%3A%2F%2Ft%2Fn%2Fdedup")
    assert record is not None
    return msgspec.json.decode(record.value, type=DedupSnapshot)


async def test_idle_names_are_forgotten_at_a_snapshot_unless_connected_or_busy(
    store: MetadataStore,
) -> None:
    now = int(time.time() * 1000)
    old = now - 30 * HOUR_MS
    ledger = await ledger_with(
        store, [("gone", 5, old), ("connected", 3, old), ("busy", 2, old), ("fresh", 9, now)]
    )
    dedup = Deduplication(TOPIC, store, 1000, expiry_s=24 * 3600)
    dedup.connected = {"connected", "busy"}
    await dedup.recover(ledger)  # (a recovery expires too: "gone" is already forgotten)
    assert set(dedup.producers) == {"connected", "busy", "fresh"}
    dedup.state("busy").in_flight[3] = asyncio.get_running_loop().create_future()
    dedup.connected = set()  # both left; "busy" still has a send in flight
    await dedup.snapshot()
    snapshot = await snapshot_of(store)
    assert snapshot.producers == {"busy": 2, "fresh": 9}  # "connected" went once it left
    assert snapshot.seen["fresh"] >= now
    dedup.state("busy").in_flight.clear()
    assert dedup.expire() == 1 and set(dedup.producers) == {"fresh"}
    await ledger.close()


async def test_a_name_stays_known_until_its_expiry_and_a_resend_before_it_is_a_duplicate(
    store: MetadataStore,
) -> None:
    now = int(time.time() * 1000)
    ledger = await ledger_with(store, [("p", 7, now - 23 * HOUR_MS)])
    dedup = Deduplication(TOPIC, store, 1000, expiry_s=24 * 3600)
    await dedup.recover(ledger)
    assert dedup.state("p").last == 7  # 23 hours idle: still remembered
    assert dedup.expire(now + 2 * HOUR_MS) == 1  # 25 hours: forgotten
    assert dedup.state("p").last == -1
    await ledger.close()


async def test_a_snapshot_written_before_expiry_existed_still_loads(
    store: MetadataStore,
) -> None:
    ledger = await ledger_with(store, [])
    old = DedupSnapshot(None, {"p": 4})
    key = PREFIX + "persistent%3A%2F%2Ft%2Fn%2Fdedup"
    await store.put(key, msgspec.json.encode({"position": None, "producers": old.producers}))
    dedup = Deduplication(TOPIC, store, 1000)
    await dedup.recover(ledger)
    assert dedup.state("p").last == 4  # its time is unknown: counted from now
    assert dedup.expire() == 0
    await ledger.close()
