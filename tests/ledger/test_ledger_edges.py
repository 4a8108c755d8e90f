"""The ledger layer at its edges: a close or seal racing a rollover, a close cancelled while
a batch is written, a crash in the middle of a trim, and reads asked for a negative number of
entries. Each failed before its fix (a review).

Real components throughout: files in ``tmp_path``, the in-memory store (wrapped by the
fault injector where an interleaving has to be made on purpose, not hoped for), etcd and a
real child process SIGKILLed at a chosen point for the crash test.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from segtxn.ledger import (
    FileLogStorage,
    LedgerSettings,
    ManagedLedger,
    Position,
    RetentionPolicy,
)
from segtxn.ledger.files import FileEntryLog
from segtxn.ledger.memory import MemoryLogStorage
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
NAME = "persistent://t/n/review"


def faults(store: MetadataStore) -> FaultInjector:
    engine = store.engine
    assert isinstance(engine, FaultInjector)
    return engine


@pytest.fixture
async def faulty_store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


# ---------------------------------------------------------------------------------------
# 1. close() / terminate() racing a roll_over() (a compaction's cut) record the new,
#    empty ledger as closed with the old ledger's entry count: the managed ledger can
#    never be opened again.


@pytest.mark.parametrize("ending", ["close", "terminate"])
async def test_close_or_seal_racing_a_roll_over_keeps_the_ledger_openable(
    faulty_store: MetadataStore, tmp_path: Path, ending: str
) -> None:
    storage = FileLogStorage(tmp_path / "ledgers")
    ledger = await ManagedLedger.open(NAME, faulty_store, storage, LedgerSettings())
    for i in range(3):
        await ledger.append(b"entry-%d" % i)
    # the roll-over's metadata CAS reaches the store late (as any CAS on etcd can)
    held = faults(faulty_store).hold("txn", key_prefix="/managed-ledgers/", before=True)
    rolling = asyncio.create_task(ledger.roll_over())
    await held.wait_for(1)
    ending_task = asyncio.create_task(ledger.close() if ending == "close" else ledger.terminate())
    await wait_until(lambda: ledger.is_closing or ledger._sealing, what="the close started")
    held.release()
    await asyncio.gather(rolling, ending_task)
    await ledger.close()

    infos = {i.id: i.entries for i in ledger.ledgers}
    reopened = await ManagedLedger.open(NAME, faulty_store, storage, LedgerSettings())
    try:
        entries = await reopened.read(Position(0, 0))
        assert [e.payload for e in entries] == [b"entry-0", b"entry-1", b"entry-2"], infos
    finally:
        await reopened.close()


# ---------------------------------------------------------------------------------------
# 2. A close() that is cancelled while a batch is being written cancels the group-commit
#    writer mid-write: the appends of that batch are never answered (neither a position
#    nor an error), and the log's file is closed under the writing thread.

_GATE = threading.Event()
_ENTERED = threading.Event()


class _SlowEntryLog(FileEntryLog):
    """A file log whose batch holding b"slow" waits for the test in its writing thread
    (a slow disk)."""

    def append_batch(self, payloads: Sequence[bytes]) -> None:
        if b"slow" in payloads:
            _ENTERED.set()
            _GATE.wait(30)
        super().append_batch(payloads)


class _SlowStorage(FileLogStorage):
    entry_log = _SlowEntryLog


async def test_a_cancelled_close_still_answers_the_append_being_written(
    store: MetadataStore, tmp_path: Path
) -> None:
    _GATE.clear()
    _ENTERED.clear()
    ledger = await ManagedLedger.open(NAME, store, _SlowStorage(tmp_path), LedgerSettings())
    await ledger.append(b"first")
    appending = asyncio.create_task(ledger.append(b"slow"))
    try:
        assert await asyncio.to_thread(_ENTERED.wait, 10)
        closing = asyncio.create_task(ledger.close())
        await wait_until(lambda: ledger.is_closing, what="close started")
        closing.cancel()  # (a shutdown with a deadline)
        writer = ledger._writer._task
        await wait_until(lambda: writer.cancelling() > 0, what="the writer stopped mid-write")
    finally:
        _GATE.set()
    await asyncio.gather(closing, return_exceptions=True)
    done, _ = await asyncio.wait({appending}, timeout=5)
    if not done:
        appending.cancel()
        await asyncio.gather(appending, return_exceptions=True)
    assert done, "the append in the batch being written was never answered (hangs for ever)"


# ---------------------------------------------------------------------------------------
# 3. A SIGKILL between a trim's metadata CAS and its file deletion leaves the trimmed
#    ledger's file behind (documented); nothing ever deletes it (only CompactedLog looks
#    for such leftovers), so once the topic is deleted, creating it again under the same
#    name is refused for good ("already holds data that the ledger metadata does not know").


async def _crash_mid_trim_child(url: str, data_dir: str, name: str) -> None:
    store = open_store(url)
    storage = FileLogStorage(Path(data_dir))
    ledger = await ManagedLedger.open(name, store, storage, LedgerSettings())
    cursor = await ledger.open_cursor("sub", start="earliest")
    for i in range(3):
        await ledger.append(b"old-%d" % i)
    await ledger.roll_over()
    last = ledger.last_confirmed
    assert last is not None
    await cursor.ack_cumulative(last)

    def killed_here(*args: object, **kwargs: object) -> None:
        print("DELETING", flush=True)  # the parent SIGKILLs us now
        threading.Event().wait()

    storage.delete = killed_here  # type: ignore[method-assign]
    await ledger.trim(RetentionPolicy(retention_time_s=0))


def _kill_mid_trim(url: str, data_dir: Path) -> str:
    """Run the child until it is about to delete the trimmed file, SIGKILL it there;
    returns the line it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.ledger.test_ledger_edges", url, str(data_dir), NAME],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        return proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)


@pytest.fixture
def etcd_url(etcd_server: EtcdServer, tmp_path: Path) -> str:
    return etcd_server.url(f"/review-{os.getpid()}-{tmp_path.name}")


async def test_a_crash_mid_trim_does_not_stop_the_topic_being_created_again(
    etcd_url: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "ledgers"
    line = await asyncio.to_thread(_kill_mid_trim, etcd_url, data_dir)
    assert line.strip() == "DELETING", line

    store = open_store(etcd_url)
    try:
        storage = FileLogStorage(data_dir)
        ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        assert 1 not in ledger.ledger_ids  # the trim's CAS landed
        await ledger.delete()  # the topic is deleted, then made again
        again = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        try:
            assert await again.read(Position(0, 0)) == []
        finally:
            await again.close()
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------
# 5. read() takes any max_entries: a negative one is not refused; memory storage then
#    returns entries (Python's negative slice), file storage raises a bare OSError.


@pytest.mark.parametrize("kind", ["file", "memory"])
async def test_read_refuses_a_negative_max_entries(
    store: MetadataStore, tmp_path: Path, kind: str
) -> None:
    storage = FileLogStorage(tmp_path) if kind == "file" else MemoryLogStorage()
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    try:
        for i in range(3):
            await ledger.append(b"e%d" % i)
        for start in (Position(1, 0), Position(1, 2)):
            with pytest.raises(ValueError, match="max_entries"):
                await ledger.read(start, max_entries=-1)
    finally:
        await ledger.close()


async def test_a_read_bounded_by_bytes_reads_no_more_from_disk(
    store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read(max_bytes=...)`` reads about that much from disk (at most twice it and some
    slack), not ``max_entries`` entries first: the broker's load-time scans ask for 1000
    entries within 64 MiB, and with messages near their 5 MiB limit that was one read of
    5 GB."""
    entry = 256 * 1024
    ledger = await ManagedLedger.open(NAME, store, FileLogStorage(tmp_path), LedgerSettings())
    asked: list[tuple[int, int]] = []
    span = FileEntryLog._span  # the bytes a read takes from disk, in the loop or not

    def spied(self: FileEntryLog, first: int, last: int) -> tuple[int, int, int]:
        asked.append((first, last))
        return span(self, first, last)

    try:
        for i in range(40):
            await ledger.append(bytes([i]) * entry)
        monkeypatch.setattr(FileEntryLog, "_span", spied)
        got = await ledger.read(Position(1, 0), max_entries=40, max_bytes=2 * entry)
        assert [len(e.payload) for e in got] == [entry, entry]
        ((first, last),) = set(asked)  # (once in the loop's try, once on a thread)
        assert last - first + 1 <= 5, f"read {asked} from disk for a read of 2 entries"
        whole = await ledger.read(Position(1, 0), max_entries=40, max_bytes=50 * entry)
        assert len(whole) == 40
    finally:
        await ledger.close()


if __name__ == "__main__":
    asyncio.run(_crash_mid_trim_child(*sys.argv[1:4]))
