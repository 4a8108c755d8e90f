"""Managed ledger: appends, group commit, rollover, reads, notification, seal, metadata."""

from __future__ import annotations

import asyncio
import fcntl
import threading
from pathlib import Path

import pytest

from segtxn.ledger import (
    EntryTooLarge,
    FileLogStorage,
    LedgerClosed,
    LedgerError,
    LedgerFenced,
    LedgerSealed,
    LedgerSettings,
    LogStorage,
    ManagedLedger,
    Position,
)
from segtxn.ledger.files import FileEntryLog
from segtxn.ledger.managed import METADATA_PREFIX
from segtxn.metastore import MetadataStore
from tests.ledger.conftest import OpenLedger
from tests.ledger.held import hold_writes
from tests.waiting import wait_until


async def test_append_and_read_in_order(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    assert ledger.last_confirmed is None and ledger.first_position() is None
    positions = [await ledger.append(f"m{i}".encode()) for i in range(10)]
    assert positions == sorted(positions) and len(set(positions)) == 10
    assert ledger.last_confirmed == positions[-1]
    entries = await ledger.read(positions[0])
    assert [e.payload for e in entries] == [f"m{i}".encode() for i in range(10)]
    assert [e.position for e in entries] == positions
    page = await ledger.read(positions[3], max_entries=2)
    assert [e.payload for e in page] == [b"m3", b"m4"]
    assert await ledger.read(Position(positions[-1].ledger_id, 99)) == []


async def test_concurrent_appends_share_fsyncs(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    positions = await asyncio.gather(*(ledger.append(b"x" * 100) for _ in range(256)))
    assert len(set(positions)) == 256
    assert ledger.stats.entries == 256
    assert ledger.stats.batches <= 256 / 4, f"{ledger.stats.batches} syncs for 256 appends"
    for entry in await ledger.read(min(positions), max_entries=300):
        assert entry.payload == b"x" * 100


async def test_rollover_and_reads_across_ledgers(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    ledger = await open_ledger(max_ledger_bytes=500)
    positions = [await ledger.append(bytes([i]) * 100) for i in range(20)]
    ledger_ids = sorted({p.ledger_id for p in positions})
    assert len(ledger_ids) >= 4 and ledger.stats.rollovers == len(ledger_ids) - 1
    entries = await ledger.read(positions[0], max_entries=100)
    assert [e.position for e in entries] == positions
    small = await ledger.read(positions[0], max_entries=100, max_bytes=250)
    assert len(small) == 2  # ~250 bytes of 100-byte entries, across the byte budget
    listing = await store.list_prefix(METADATA_PREFIX)
    assert len(listing.records) == 1


async def test_roll_over_starts_a_new_ledger_at_once(open_ledger: OpenLedger) -> None:
    """roll_over cuts the chain where it is called: what was durable stays before the
    cut, what is appended after goes to the new ledger (the v4 log's compaction trims at
    such a cut); with nothing in the current ledger it does nothing; a sealed ledger
    refuses it."""
    ledger = await open_ledger()
    before = [await ledger.append(b"a") for _ in range(3)]
    cut = await ledger.roll_over()
    assert cut == Position(before[-1].ledger_id + 1, 0) and ledger.stats.rollovers == 1
    assert await ledger.roll_over() == cut  # an empty ledger is not rolled over again
    assert await ledger.append(b"b") == cut
    assert [e.payload for e in await ledger.read(before[0])] == [b"a", b"a", b"a", b"b"]
    assert len(ledger.ledger_ids) == 2
    await ledger.terminate()
    with pytest.raises(LedgerSealed):
        await ledger.roll_over()


async def test_reopen_keeps_entries_and_continues(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    before = [await ledger.append(f"a{i}".encode()) for i in range(5)]
    await ledger.close()
    again = await open_ledger()
    assert again.last_confirmed == before[-1]
    after = await again.append(b"b")
    assert after > before[-1]
    entries = await again.read(before[0])
    assert [e.payload for e in entries] == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b"]


async def test_terminate_seals_but_reads_still_work(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    first = await ledger.append(b"1")
    last = await ledger.terminate()
    assert last == first and ledger.is_sealed
    with pytest.raises(LedgerSealed):
        await ledger.append(b"2")
    assert await ledger.terminate() == first  # idempotent
    assert [e.payload for e in await ledger.read(first)] == [b"1"]
    await ledger.close()
    reopened = await open_ledger()  # durable across restart
    assert reopened.is_sealed and reopened.last_confirmed == first
    with pytest.raises(LedgerSealed):
        await reopened.append(b"3")


async def test_appends_racing_terminate_are_in_or_refused(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()

    async def append(i: int) -> Position | None:
        try:
            return await ledger.append(str(i).encode())
        except LedgerSealed:
            return None

    tasks = [asyncio.create_task(append(i)) for i in range(100)]
    await asyncio.sleep(0)  # let some of them queue before the seal
    sealed_at = await ledger.terminate()
    results = await asyncio.gather(*tasks)
    accepted = [p for p in results if p is not None]
    assert accepted and all(sealed_at is not None and p <= sealed_at for p in accepted)
    stored = await ledger.read(Position(0, 0), max_entries=1000)
    assert [e.position for e in stored] == sorted(accepted)


async def test_waiters_wake_on_append_and_fail_on_seal(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    waiter = asyncio.create_task(ledger.wait_for_entries(None))
    await asyncio.sleep(0)
    assert not waiter.done()
    position = await ledger.append(b"x")
    await asyncio.wait_for(waiter, 5)
    await ledger.wait_for_entries(None)  # already satisfied: returns at once
    later = asyncio.create_task(ledger.wait_for_entries(position))
    await asyncio.sleep(0)
    await ledger.terminate()
    with pytest.raises(LedgerSealed):
        await asyncio.wait_for(later, 5)


async def test_properties_are_durable(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    await ledger.update_properties({"__contains_txn_messages": "true", "owner": "me"})
    await ledger.update_properties({}, removals=("owner",))
    await ledger.close()
    reopened = await open_ledger()
    assert reopened.properties == {"__contains_txn_messages": "true"}


async def test_a_ledger_has_one_writer_at_a_time(open_ledger: OpenLedger) -> None:
    first = await open_ledger()
    position = await first.append(b"x")
    with pytest.raises(LedgerFenced):
        await open_ledger()  # the first still holds it: a second writer is refused
    await first.append(b"still mine")
    await first.close()
    second = await open_ledger()  # once released, the next owner recovers everything
    assert [e.payload for e in await second.read(position)] == [b"x", b"still mine"]


async def test_entry_size_limit(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_entry_bytes=1000)
    with pytest.raises(EntryTooLarge):
        await ledger.append(b"x" * 1001)
    await ledger.append(b"x" * 1000)


async def test_backpressure_bounds_the_queue(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_pending_bytes=1000, max_batch_bytes=500)
    positions = await asyncio.gather(*(ledger.append(b"p" * 100) for _ in range(100)))
    assert len(set(positions)) == 100


async def test_a_failed_write_fails_its_appends_and_later_ones(
    open_ledger: OpenLedger, storage: LogStorage
) -> None:
    ledger = await open_ledger()
    await ledger.append(b"ok")
    current = ledger._current
    assert current is not None

    def broken(payloads: object) -> None:
        raise OSError(28, "No space left on device")

    current.append_batch = broken  # type: ignore[method-assign]
    with pytest.raises(LedgerError, match="No space"):
        await ledger.append(b"lost?")
    with pytest.raises(LedgerError, match="reopen"):
        await ledger.append(b"refused")


async def test_concurrent_metadata_updates_do_not_fence_each_other(
    open_ledger: OpenLedger,
) -> None:
    ledger = await open_ledger(max_ledger_bytes=200)
    appends = [asyncio.create_task(ledger.append(b"a" * 150)) for _ in range(10)]  # rollovers
    await asyncio.gather(
        ledger.update_properties({"k1": "v1"}),
        ledger.update_properties({"k2": "v2"}),
        *appends,
    )
    first, second = await asyncio.gather(ledger.terminate(), ledger.terminate())
    assert first == second == ledger.last_confirmed
    assert ledger.properties == {"k1": "v1", "k2": "v2"}


async def test_close_finishes_or_refuses_every_append(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()

    async def append(i: int) -> Position | None:
        try:
            return await ledger.append(str(i).encode())
        except LedgerClosed:
            return None

    tasks = [asyncio.create_task(append(i)) for i in range(50)]
    await asyncio.sleep(0)
    await ledger.close()
    results = await asyncio.wait_for(asyncio.gather(*tasks), 10)  # none hangs
    accepted = [p for p in results if p is not None]
    assert accepted
    with pytest.raises(LedgerClosed):
        await ledger.append(b"late")


async def test_batches_are_bounded_on_disk(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_batch_bytes=1024)
    await asyncio.gather(*(ledger.append(b"t" * 10) for _ in range(300)))
    assert ledger.stats.batches > 1
    assert ledger.stats.largest_batch_bytes <= 1024  # headers count: a crash tears no more


async def test_backpressure_is_first_come_first_served(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_pending_bytes=1000)
    gate = hold_writes(ledger)
    head = asyncio.create_task(ledger.append(b"h"))  # being written, held at the gate
    await wait_until(lambda: ledger._writer._queued_bytes == 0 and not ledger._writer.idle.is_set())
    filler = asyncio.create_task(ledger.append(b"f" * 900))
    big = asyncio.create_task(ledger.append(b"A" * 500))  # must wait for room
    await asyncio.sleep(0)
    small = asyncio.create_task(ledger.append(b"B" * 10))  # fits, but arrived later
    await asyncio.sleep(0)
    gate.set()
    positions = await asyncio.gather(head, filler, big, small)
    assert list(positions) == sorted(positions)


async def test_enqueue_returns_once_queued_and_the_queue_order_is_the_write_order(
    open_ledger: OpenLedger,
) -> None:
    ledger = await open_ledger()
    gate = hold_writes(ledger)
    try:
        written = [await ledger.enqueue(f"q{i}".encode()) for i in range(5)]
        assert not any(w.done() for w in written)  # queued, not durable: no write ended
    finally:
        gate.set()
    positions = [await w for w in reversed(written)][::-1]  # awaited in any order
    assert positions == sorted(positions)
    entries = await ledger.read(positions[0])
    assert [e.payload for e in entries] == [f"q{i}".encode() for i in range(5)]


async def test_readers_learn_of_a_failed_write(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    position = await ledger.append(b"ok")
    waiter = asyncio.create_task(ledger.wait_for_entries(position))
    current = ledger._current
    assert current is not None

    def broken(payloads: object) -> None:
        raise OSError(5, "Input/output error")

    current.append_batch = broken  # type: ignore[method-assign]
    with pytest.raises(LedgerError):
        await ledger.append(b"x")
    with pytest.raises(LedgerError, match="failed a write"):
        await asyncio.wait_for(waiter, 5)


class _GatedCreate(FileLogStorage):
    """File storage whose creates wait, with the new file opened and locked, for ``gate``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.entered, self.gate = threading.Event(), threading.Event()

    def create(self, ledger_name: str, ledger_id: int) -> FileEntryLog:
        created = super().create(ledger_name, ledger_id)
        self.entered.set()
        self.gate.wait(10)
        return created


async def test_an_open_cancelled_while_its_file_opens_leaves_no_lock_behind(
    store: MetadataStore, tmp_path: Path
) -> None:
    """A file is opened (and locked) in a worker thread, which a cancel cannot stop: the
    log it opened used to stay open, its lock held, and every later open of the ledger in
    this process failed with "held by another writer" (a CI run: a coordinator stopped while
    it took over a v4 log, started again in the same process, never took it back)."""
    gated = _GatedCreate(tmp_path / "ledgers")
    opening = asyncio.create_task(ManagedLedger.open("gated", store, gated, LedgerSettings()))
    assert await asyncio.to_thread(gated.entered.wait, 10)
    opening.cancel()
    gated.gate.set()  # the thread finishes the create the caller no longer waits for
    with pytest.raises(asyncio.CancelledError):
        await opening
    path = gated.path("gated", 1)

    def unlocked() -> bool:
        with path.open("rb") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            return True

    await wait_until(unlocked, what="the file the cancelled open created unlocked")
    ledger = await ManagedLedger.open("gated", store, FileLogStorage(tmp_path / "ledgers"))
    try:
        assert await ledger.append(b"after") is not None
    finally:
        await ledger.close()


async def test_enqueue_now_queues_only_what_needs_no_wait(open_ledger: OpenLedger) -> None:
    """``enqueue_now``: queued at once while there is room and no append waits for room
    before it; else None and nothing queued (the caller then awaits ``enqueue``, which
    keeps first come, first served)."""
    ledger = await open_ledger(max_pending_bytes=1000, max_entry_bytes=900)
    gate = hold_writes(ledger)
    try:
        head = ledger.enqueue_now(b"h")  # taken by the writer, held at the gate
        assert head is not None
        await wait_until(lambda: ledger._writer._queued_bytes == 0)
        filler = ledger.enqueue_now(b"f" * 900)
        assert filler is not None  # room: queued at once
        assert ledger.enqueue_now(b"A" * 500) is None  # no room: nothing queued
        assert ledger._writer._queued_bytes == 900
        waiting = asyncio.create_task(ledger.enqueue(b"W" * 500))  # waits for room
        await wait_until(lambda: ledger._writer._admitting == 1)
        assert ledger.enqueue_now(b"s") is None  # would overtake the waiting append
        with pytest.raises(EntryTooLarge):
            ledger.enqueue_now(b"x" * 901)
    finally:
        gate.set()
    later = await waiting
    positions = [await head, await filler, await later]
    assert positions == sorted(positions)
    await ledger.close()
    with pytest.raises(LedgerClosed):
        ledger.enqueue_now(b"late")
