"""The v4 transaction log's compaction (segtxn/coordinator/txnlog.py): what the next holder
of the id replays after it — also when the holder dies at any step of it — is what it
replayed before, minus the transactions that ended long ago; and numbers are never reused.

Real files and real stores (the embedded one and etcd). A "crash" cuts the compaction at one
step (the step raises :class:`Killed`, before or after doing its work) and then abandons the
log the way SIGKILL would: the writer stops where it is, the files are released, no clean
close is recorded.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import msgspec
import pytest

from segtxn.coordinator.txnlog import (
    ABORTED,
    ABORTING,
    COMMITTED,
    COMMITTING,
    FINAL,
    NEXT_LEAST,
    OPEN,
    TIME_OUT,
    TxnLog,
    TxnMeta,
)
from segtxn.ledger import FileLogStorage, LedgerSettings, LogStorage, MemoryLogStorage
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from tests.compaction import CURSOR_MOVED, STEPS, Killed, kill, stored_ledgers

NAME = "__transaction_log_0"
NOW_MS = 1_800_000_000_000
KEEP_ENDED_S = 60.0
SMALL_LEDGERS = LedgerSettings(max_ledger_bytes=2048)
"""Many ledgers per log, so a trim deletes several."""


@pytest.fixture
def storage(tmp_path: Path) -> FileLogStorage:
    return FileLogStorage(tmp_path / "txn-logs")


async def open_log(store: MetadataStore, storage: LogStorage) -> TxnLog:
    return await TxnLog.open(
        NAME, store, storage, SMALL_LEDGERS, compact_entries=0, keep_ended_s=KEEP_ENDED_S
    )


async def populate(txn_log: TxnLog, n: int, rng: random.Random) -> None:
    """``n`` transactions in every state, each logged through its real steps; a fifth of
    them ended long ago (to be dropped), a fifth ended recently (to be kept)."""
    for i in range(n):
        least = txn_log.take_least()
        meta = TxnMeta((0, least), OPEN, NOW_MS + 60_000, NOW_MS - 1000)
        await txn_log.append(meta)
        if rng.random() < 0.5:
            meta = msgspec.structs.replace(meta, partitions=[f"persistent://t/n/p{i % 7}"])
            await txn_log.append(meta)
        kind = i % 5
        if kind == 0:
            continue  # stays OPEN
        going = {1: COMMITTING, 2: COMMITTING, 3: ABORTING, 4: TIME_OUT}[kind]
        meta = msgspec.structs.replace(meta, state=going)
        await txn_log.append(meta)
        if kind in (2, 3):  # ended: 2 long ago, 3 just now
            final = COMMITTED if kind == 2 else ABORTED
            ended_ms = NOW_MS - 600_000 if kind == 2 else NOW_MS - 1000
            await txn_log.append(msgspec.structs.replace(meta, state=final, finalized_ms=ended_ms))


def kept(txns: dict[int, TxnMeta]) -> dict[int, TxnMeta]:
    """What a compaction at NOW_MS keeps: live ones, and those ended within KEEP_ENDED_S."""
    horizon = NOW_MS - KEEP_ENDED_S * 1000
    return {
        least: m
        for least, m in txns.items()
        if m.state not in FINAL or (m.finalized_ms or 0) >= horizon
    }


async def test_recovery_after_compaction_gives_the_same_transactions(
    store: MetadataStore, storage: LogStorage
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    first = await open_log(store, storage)
    await populate(first, 200, random.Random(seed))
    before = dict(first.txns)
    ledgers_before = len(first.ledger.ledger_ids)
    done, dropped = await first.compact(now_ms=NOW_MS)
    assert first.txns == kept(before)
    assert done.relogged == len(kept(before)) and dropped == len(before) - len(kept(before))
    assert done.trimmed_ledgers >= ledgers_before - 1 > 1  # every ledger before the cut went
    assert first.entries == len(kept(before))  # what a take-over would replay now
    assert stored_ledgers(storage, NAME) == set(first.ledger.ledger_ids)
    next_least = first.next_least
    await first.close()

    second = await open_log(store, storage)
    try:
        assert second.txns == kept(before)
        assert second.replayed == len(kept(before))
        assert second.next_least == next_least
    finally:
        await second.close()


async def test_numbers_are_never_reused_once_every_transaction_is_dropped(
    store: MetadataStore, storage: LogStorage
) -> None:
    """Every transaction ended long ago: the compacted log holds none, and the next holder
    still starts past the highest number issued (the NEXT_LEAST property)."""
    first = await open_log(store, storage)
    for _ in range(30):
        least = first.take_least()
        meta = TxnMeta((0, least), COMMITTED, NOW_MS, NOW_MS - 10**6, finalized_ms=0)
        await first.append(meta)
    await first.compact(now_ms=NOW_MS)
    assert first.txns == {} and first.entries == 0
    await first.close()
    second = await open_log(store, storage)
    try:
        assert second.txns == {}
        assert second.next_least == 30
        assert second.ledger.properties[NEXT_LEAST] == "30"
    finally:
        await second.close()


@pytest.mark.parametrize("step", list(STEPS))
async def test_a_crash_at_each_step_of_a_compaction_loses_nothing(
    store: MetadataStore, storage: FileLogStorage, tmp_path: Path, step: str
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}, killed {step}")
    first = await open_log(store, storage)
    await populate(first, 120, random.Random(seed))
    before = dict(first.txns)
    next_least = first.next_least
    STEPS[step](first._log, storage, len(kept(before)) // 2)
    with pytest.raises(Killed):
        await first.compact(now_ms=NOW_MS)
    await kill(first._log)
    storage = FileLogStorage(tmp_path / "txn-logs")  # the next process's (nothing patched)

    second = await open_log(store, storage)  # the next holder of the id
    try:
        assert kept(second.txns) == kept(before)  # every live one, as it was
        assert all(before[least] == meta for least, meta in second.txns.items())
        if step in CURSOR_MOVED:
            assert second.txns == kept(before)  # the replay starts at the cut
            assert second.replayed == len(kept(before))
        assert second.next_least >= next_least
        # what a crashed trim left is deleted: the files are the ledgers the metadata names
        assert stored_ledgers(storage, NAME) == set(second.ledger.ledger_ids)
        await second.compact(now_ms=NOW_MS)  # the next compaction completes
        assert second.txns == kept(before)
        assert stored_ledgers(storage, NAME) == set(second.ledger.ledger_ids)
    finally:
        await second.close()
    third = await open_log(store, storage)
    try:
        assert third.txns == kept(before)
        assert third.next_least >= next_least
    finally:
        await third.close()


async def test_a_compaction_waits_for_the_append_queued_before_it(
    store: MetadataStore, storage: LogStorage
) -> None:
    """An append queued, not yet written, when a compaction starts: the compaction must not
    re-log the state that append replaces after it (replay would bring the old state back).
    The two start in one step (gather): the append queues its entry and waits; the
    compaction comes next, before the writer has taken the entry."""
    txn_log = await open_log(store, storage)
    least = txn_log.take_least()
    opened = TxnMeta((0, least), OPEN, NOW_MS + 60_000, NOW_MS)
    await txn_log.append(opened)
    committing = msgspec.structs.replace(opened, state=COMMITTING)
    await asyncio.gather(txn_log.append(committing), txn_log.compact(now_ms=NOW_MS))
    assert txn_log.txns == {least: committing}
    await txn_log.close()
    again = await open_log(store, storage)
    try:
        assert again.txns == {least: committing}
    finally:
        await again.close()


async def test_an_append_whose_caller_gave_up_is_still_applied(
    store: MetadataStore, storage: LogStorage
) -> None:
    """A caller cancelled while its entry is being written: the entry is durable, so its
    state is the transaction's in memory too (a compaction re-logs memory: a stale state
    there would be written over the newer one)."""
    txn_log = await open_log(store, storage)
    least = txn_log.take_least()
    opened = TxnMeta((0, least), OPEN, NOW_MS + 60_000, NOW_MS)
    await txn_log.append(opened)
    committing = msgspec.structs.replace(opened, state=COMMITTING)
    appending = asyncio.create_task(txn_log.append(committing), name="append")
    await asyncio.sleep(0)  # sleep-ok: one loop step, in which the append queues its entry
    appending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await appending
    later = TxnMeta((0, txn_log.take_least()), OPEN, NOW_MS + 60_000, NOW_MS)
    await txn_log.append(later)  # written after it: the cancelled one has settled
    assert txn_log.txns[least] == committing
    await txn_log.compact(now_ms=NOW_MS)
    await txn_log.close()
    again = await open_log(store, storage)
    try:
        assert again.txns[least] == committing
    finally:
        await again.close()


async def test_compaction_among_appends_in_flight_keeps_every_state(
    store: MetadataStore, storage: LogStorage
) -> None:
    """Appends run while compactions cut the log, and some of their callers give up
    waiting: the log replays to exactly the states in memory. (Without the write gate a
    compaction would re-log a state older than an entry already written before its cut.)"""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    txn_log = await open_log(store, storage)

    async def one(least: int) -> None:
        meta = TxnMeta((0, least), OPEN, NOW_MS + 60_000, NOW_MS)
        for state in (OPEN, COMMITTING, COMMITTED):
            meta = msgspec.structs.replace(meta, state=state)
            if state == COMMITTED:
                meta = msgspec.structs.replace(meta, finalized_ms=NOW_MS)
            await txn_log.append(meta)

    try:
        for _ in range(8):
            tasks = [
                asyncio.create_task(one(txn_log.take_least()), name="append")
                for _ in range(rng.randint(5, 40))
            ]
            compaction = asyncio.create_task(txn_log.compact(now_ms=NOW_MS), name="compact")
            for task in rng.sample(tasks, len(tasks) // 4):
                task.cancel()  # its entry, if queued, is still written and still applied
            await asyncio.gather(*tasks, return_exceptions=True)
            await compaction
        # a cancelled caller's entry may still be in flight; entries settle in order, so
        # once a later one is durable every earlier one is in memory
        last = txn_log.take_least()
        await txn_log.append(TxnMeta((0, last), OPEN, NOW_MS + 60_000, NOW_MS))
        in_memory = dict(txn_log.txns)
        assert len(in_memory) > 8 * 5 and last in in_memory
    finally:
        await txn_log.close()
    again = await open_log(store, storage)
    try:
        assert again.txns == in_memory
    finally:
        await again.close()


async def test_memory_storage_compacts_the_same(store: MetadataStore) -> None:
    """The in-memory log storage (standalone runs, tests) behaves as the files do."""
    storage = MemoryLogStorage()
    first = await open_log(store, storage)
    await populate(first, 60, random.Random(1))
    before = dict(first.txns)
    await first.compact(now_ms=NOW_MS)
    assert stored_ledgers(storage, NAME) == set(first.ledger.ledger_ids)
    await first.close()
    second = await open_log(store, storage)
    try:
        assert second.txns == kept(before)
    finally:
        await second.close()


KILLER_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("step", list(STEPS))
async def test_a_sigkill_at_each_step_of_a_compaction_loses_nothing(
    etcd_server: EtcdServer, tmp_path: Path, step: str
) -> None:
    """The same, with a real process killed by SIGKILL at the step (on etcd): its threads
    die mid-write, its file locks go with it, and the next holder opens what it left."""
    seed = random.randrange(2**32)
    print(f"seed {seed}, SIGKILL {step}")
    url = etcd_server.url(f"/v4kill-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tests.coordinator.v4log_killer", url, str(tmp_path), step,
         str(seed)],
        cwd=KILLER_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == -signal.SIGKILL, (done.returncode, lines[-3:], done.stderr[-2000:])
    before = {
        m.txn[1]: m
        for m in (msgspec.json.decode(ln[4:], type=TxnMeta) for ln in lines if ln[:4] == "TXN ")
    }
    next_least = int(next(ln for ln in lines if ln.startswith("NEXT ")).split()[1])
    assert len(before) == 120 and lines[-1].startswith("DYING")
    async with open_store(url) as store:
        storage = FileLogStorage(tmp_path)
        second = await open_log(store, storage)  # the next holder of the id
        try:
            assert kept(second.txns) == kept(before)
            assert all(before[least] == meta for least, meta in second.txns.items())
            if step in CURSOR_MOVED:
                assert second.txns == kept(before)
            assert second.next_least >= next_least
            assert stored_ledgers(storage, NAME) == set(second.ledger.ledger_ids)
            await second.compact(now_ms=NOW_MS)
            assert second.txns == kept(before)
        finally:
            await second.close()
