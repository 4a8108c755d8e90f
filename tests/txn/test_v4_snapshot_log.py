"""A namespace's v4 snapshot log (segtxn/broker/txn/snapshots.py) keeps each topic's latest
snapshot and what follows it, and drops what precedes it: it stays bounded however many
snapshots are written, each topic's latest is read back after a reopen, and a crash at any
step of a compaction leaves a log whose latest snapshots are the same. A broker's logs
(SnapshotLogs) are all closed whatever closing one raised.

Real files and the embedded store; tests/txn/test_v4.py runs the buffer on etcd too.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.broker.txn.snapshots import BufferSnapshot, SnapshotLog, SnapshotLogs, snapshot_log
from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore, StoreUnavailable, open_store
from segtxn.metastore.faults import FaultInjector
from tests.compaction import (
    CURSOR_MOVED,
    STEPS,
    WITHOUT_PROPERTIES,
    Killed,
    kill,
    stored_ledgers,
)

NAME = "persistent://acme/v4/__transaction_buffer_snapshot@b1"
TOPICS = [f"persistent://acme/v4/t{i}" for i in range(8)]
SMALL_LEDGERS = LedgerSettings(max_ledger_bytes=4096)


def snapshot(topic: str, n: int, incarnation: int = 0) -> BufferSnapshot:
    """The ``n``-th snapshot of ``topic`` (its content tells which one it is)."""
    return BufferSnapshot(
        topic,
        (1, n),
        {f"0:{n}": (1, n)},
        {f"0:{i}": (1, i) for i in range(n % 5)},
        incarnation,
    )


async def create_topics(store: MetadataStore, root: Path) -> dict[str, int]:
    """Create the ledgers of ``TOPICS``; returns their incarnations (a compaction keeps
    only the snapshots of topics that exist, of their current incarnation:
    tests/txn/test_v4_snapshot_log_gone.py)."""
    incarnations = {}
    for topic in TOPICS:
        await (await ManagedLedger.open(topic, store, FileLogStorage(root), SMALL_LEDGERS)).close()
        record = await store.get(metadata_key(topic))
        assert record is not None
        incarnations[topic] = record.created_version
    return incarnations


async def open_log(store: MetadataStore, root: Path, compact_entries: int) -> SnapshotLog:
    return await SnapshotLog.open(
        NAME, store, FileLogStorage(root), SMALL_LEDGERS, compact_entries=compact_entries
    )


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://") as s:
        yield s


@pytest.mark.parametrize("compact_entries", [100, 0])
async def test_the_snapshot_log_stays_bounded(
    store: MetadataStore, tmp_path: Path, compact_entries: int
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    incarnations = await create_topics(store, tmp_path)
    log_ = await open_log(store, tmp_path, compact_entries)
    idle = TOPICS[-1]  # an idle topic: it writes once, first
    latest = {idle: snapshot(idle, 0, incarnations[idle])}
    await log_.write(latest[TOPICS[-1]])
    largest = 0
    try:
        for n in range(1, 2000):
            topic = rng.choice(TOPICS[:-1])
            latest[topic] = snapshot(topic, n, incarnations[topic])
            await log_.write(latest[topic])
            largest = max(largest, log_.entries)
        for topic, expected in latest.items():
            assert await log_.latest(topic) == expected
        size = log_.size_bytes
    finally:
        await log_.close()
    print(f"compact_entries={compact_entries}: at most {largest} snapshots, {size} bytes")
    if compact_entries:
        assert largest <= compact_entries + len(TOPICS)
        assert size < 2 * (compact_entries + len(TOPICS)) * 200
    else:
        assert largest == 2000
    again = await open_log(store, tmp_path, compact_entries)
    try:
        for topic, expected in latest.items():  # the idle topic's one snapshot included
            assert await again.latest(topic) == expected
        assert await again.latest("persistent://acme/v4/never") is None
    finally:
        await again.close()


@pytest.mark.parametrize("step", sorted(set(STEPS) - WITHOUT_PROPERTIES))
async def test_a_crash_at_each_step_of_a_compaction_keeps_the_latest_snapshots(
    store: MetadataStore, tmp_path: Path, step: str
) -> None:
    incarnations = await create_topics(store, tmp_path)
    log_ = await open_log(store, tmp_path, 0)
    latest = {}
    for n in range(300):
        topic = TOPICS[n % len(TOPICS)]
        latest[topic] = snapshot(topic, n, incarnations[topic])
        await log_.write(latest[topic])
    storage = log_._log._storage  # (whose delete the step may cut)
    STEPS[step](log_._log, storage, len(TOPICS) // 2)
    with pytest.raises(Killed):
        await log_.compact()
    await kill(log_._log)

    again = await open_log(store, tmp_path, 0)  # the next process
    try:
        for topic, expected in latest.items():
            assert await again.latest(topic) == expected
        if step in CURSOR_MOVED:
            assert again.entries == len(TOPICS)
        assert stored_ledgers(FileLogStorage(tmp_path), NAME) == set(again._log.ledger.ledger_ids)
        await again.compact()
        assert again.entries == len(TOPICS)
        for topic, expected in latest.items():
            assert await again.latest(topic) == expected
    finally:
        await again.close()


@pytest.fixture
async def faulty_store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


async def test_closing_the_logs_closes_every_one_whatever_one_raised(
    faulty_store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first log's clean-close write fails (the store refusing it): the logs are all
    closed anyway, the one being opened is cancelled, the failure is logged once and raised
    after. The close stopped at the first failure: the logs after it stayed open, their
    ledgers' writer tasks running, and the next open of one in the process was refused
    ("... is held by another writer")."""
    faults = faulty_store.engine
    assert isinstance(faults, FaultInjector)
    storage = FileLogStorage(tmp_path)
    logs = SnapshotLogs("b1", faulty_store, storage, SMALL_LEDGERS)
    first = await logs.get("acme", "ns0")
    second = await logs.get("acme", "ns1")
    for n, log_ in enumerate((first, second)):
        await log_.write(snapshot(TOPICS[n], n))
    opening = faults.hold(
        "range", key_prefix=metadata_key(snapshot_log("acme", "ns2", "b1")), before=True
    )
    third = logs.get("acme", "ns2")
    await opening.wait_for(1)
    faults.fail("txn", key_prefix=metadata_key(first.ledger.name), times=1)

    with pytest.raises(StoreUnavailable, match="did not land"):
        await logs.close()
    assert faults.injected >= 2  # (the hold and the failure fired)
    assert first.ledger.is_closing
    assert second.ledger.is_closing, "the log after the failing one was left open"
    assert third.cancelled(), "the log being opened was not cancelled"
    (record,) = [r for r in caplog.records if "did not land" in r.getMessage()]
    assert record.levelno >= logging.WARNING and first.ledger.name in record.getMessage()

    again = SnapshotLogs("b1", faulty_store, storage, SMALL_LEDGERS)  # (the same process)
    try:
        assert await (await again.get("acme", "ns1")).latest(TOPICS[1]) == snapshot(TOPICS[1], 1)
    finally:
        await again.close()
