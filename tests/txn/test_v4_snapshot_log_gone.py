"""A v4 snapshot log's compaction keeps only the snapshots a recovery can still load
(segtxn/broker/txn/snapshots.py): those of topics that exist, of their current
incarnation, wherever they are served now. A deleted topic's, or one of a topic deleted and
created again since, is dropped.

Before, a compaction copied every indexed topic's latest snapshot forward: a broker's log
kept the last snapshot of every topic that moved away from it and was deleted on its new
broker (only the broker serving a topic tombstones its snapshots when it is deleted), so
the log grew without bound over topics created and deleted, and each compaction copied more.

Real files, real ledgers, on both stores.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from segtxn.broker.txn.snapshots import BufferSnapshot, SnapshotLog
from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger, delete_unopened
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, StoreUnavailable
from segtxn.metastore.faults import FaultInjector

LOG = "persistent://acme/v4/__transaction_buffer_snapshot@b1"
SETTINGS = LedgerSettings(max_ledger_bytes=4096)
GONE = 40
"""Topics snapshotted here, then deleted (on another broker: no tombstone here)."""


def snapshot(topic: str, incarnation: int) -> BufferSnapshot:
    return BufferSnapshot(topic, (1, 7), {"0:7": (1, 3)}, {"0:2": (1, 5)}, incarnation)


async def create(topic: str, store: MetadataStore, storage: FileLogStorage) -> int:
    """Create ``topic``'s ledger (closed again); returns its incarnation."""
    ledger = await ManagedLedger.open(topic, store, storage, SETTINGS)
    await ledger.close()
    record = await store.get(metadata_key(topic))
    assert record is not None
    return record.created_version


async def test_compaction_drops_the_snapshots_no_recovery_can_load(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    log_ = await SnapshotLog.open(LOG, store, storage, SETTINGS, compact_entries=0)
    kept: dict[str, BufferSnapshot] = {}
    dropped: list[str] = []
    try:
        for name in ("served-here", "moved-away"):  # exist, current: recovery loads them
            topic = f"persistent://acme/v4/{name}"
            kept[topic] = snapshot(topic, await create(topic, store, storage))
            await log_.write(kept[topic])
        for i in range(GONE):
            topic = f"persistent://acme/v4/gone-{i}"
            await log_.write(snapshot(topic, await create(topic, store, storage)))
            await delete_unopened(topic, store, storage)
            dropped.append(topic)
        again = "persistent://acme/v4/created-again"
        await log_.write(snapshot(again, await create(again, store, storage)))
        await delete_unopened(again, store, storage)
        await create(again, store, storage)  # a new incarnation: the old one's is not its
        unknown = "persistent://acme/v4/incarnation-unknown"
        await create(unknown, store, storage)
        await log_.write(snapshot(unknown, 0))  # (written before incarnations were kept)
        dropped += [again, unknown]
        assert log_.entries == len(kept) + len(dropped)

        await log_.compact()
        assert log_.entries == len(kept), f"{log_.entries} snapshots kept, {len(kept)} loadable"
        for topic, expected in kept.items():
            assert await log_.latest(topic) == expected
        for topic in dropped:
            assert await log_.latest(topic) is None
    finally:
        await log_.close()

    reopened = await SnapshotLog.open(LOG, store, storage, SETTINGS, compact_entries=0)
    try:
        assert reopened.entries == len(kept)
        for topic, expected in kept.items():
            assert await reopened.latest(topic) == expected
        for topic in dropped:
            assert await reopened.latest(topic) is None
    finally:
        await reopened.close()


async def test_a_snapshot_written_while_the_compaction_judges_the_one_before_is_kept(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path
) -> None:
    """The topic was deleted and created again; the compaction asks the store about its
    old snapshot, and before the answer comes the topic writes its first snapshot of the new
    incarnation: that one is kept, only the one judged is dropped."""
    storage = FileLogStorage(tmp_path)
    log_ = await SnapshotLog.open(LOG, store, storage, SETTINGS, compact_entries=0)
    topic = "persistent://acme/v4/again"
    try:
        await log_.write(snapshot(topic, await create(topic, store, storage)))
        await delete_unopened(topic, store, storage)
        current = snapshot(topic, await create(topic, store, storage))
        asked = faults.hold("range", key_prefix=metadata_key(topic))
        compacting = asyncio.create_task(log_.compact())
        await asked.wait_for(1)
        await log_.write(current)
        asked.release()
        await compacting
        assert log_.entries == 1
        assert await log_.latest(topic) == current
    finally:
        await log_.close()


async def test_a_store_failure_leaves_the_log_whole(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path
) -> None:
    """The store cannot tell whether a topic exists: the compaction fails with the store's
    error (a snapshot's write then logs it and goes on) and drops nothing; the next one,
    with the store back, drops the deleted topics' snapshots."""
    storage = FileLogStorage(tmp_path)
    log_ = await SnapshotLog.open(LOG, store, storage, SETTINGS, compact_entries=0)
    try:
        for i in range(3):
            topic = f"persistent://acme/v4/gone-{i}"
            await log_.write(snapshot(topic, await create(topic, store, storage)))
            await delete_unopened(topic, store, storage)
        faults.fail("range", key_prefix=metadata_key("persistent://acme/v4/gone-1"), times=None)
        with pytest.raises(StoreUnavailable):
            await log_.compact()
        assert log_.entries == 3
        assert await log_.latest("persistent://acme/v4/gone-0") is not None
        faults.clear()
        await log_.compact()
        assert log_.entries == 0
    finally:
        await log_.close()


async def test_a_write_while_a_compaction_judges_does_not_start_a_second_one(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path
) -> None:
    """A compaction is due; one write starts it, which asks the store about its topics; a
    second write, meanwhile, finds a compaction under way: it appends its snapshot and
    starts none (the compaction's lock was taken only after the store's answers, so the
    second write judged every topic again and compacted the log a second time, a roll-over
    and a copy of every snapshot for nothing, its own snapshot waiting for it all)."""
    storage = FileLogStorage(tmp_path)
    log_ = await SnapshotLog.open(LOG, store, storage, SETTINGS, compact_entries=4)
    topic = "persistent://acme/v4/busy"
    try:
        incarnation = await create(topic, store, storage)
        for _ in range(4):
            await log_.write(snapshot(topic, incarnation))
        asked = faults.hold("range", key_prefix=metadata_key(topic), times=None)
        first = asyncio.create_task(log_.write(snapshot(topic, incarnation)))
        await asked.wait_for(1)
        second = asyncio.create_task(log_.write(snapshot(topic, incarnation)))
        judged_again = asyncio.create_task(asked.wait_for(2))
        await asyncio.wait([second, judged_again], return_when=asyncio.FIRST_COMPLETED)
        judged = asked.parked
        judged_again.cancel()
        faults.clear()
        asked.release()
        await asyncio.gather(first, second)
        assert judged == 1, f"the second write judged the topics again ({judged} reads held)"
        assert log_.entries == 2  # the one copied, then the second write's (after the cut)
    finally:
        await log_.close()
