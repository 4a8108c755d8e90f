"""A ledger's files and their identity, at the edges: a file that is not the one the
metadata names (another cluster's volume, a restored backup of another incarnation of the
topic) is refused, never served; a read racing close() ends with its entries or
LedgerClosed. Each failed before its fix (a review).

Real components throughout: files in ``tmp_path``, a real etcd (two key namespaces stand
for two independent clusters).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import msgspec
import pytest

from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger, Position
from segtxn.ledger.errors import LedgerClosed, LedgerMismatch
from segtxn.ledger.files import FileEntryLog
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from tests.ledger.foreign import cluster_url, restore_wrong, two_volumes, write_ledgers
from tests.waiting import wait_until

NAME = "persistent://t/n/identity"


# ---------------------------------------------------------------------------------------
# 1. Nothing tied a ledger's file to the metadata that named it: a volume from another
#    cluster (or a restored copy of another incarnation of the topic), holding files under
#    the same names with the same entry counts and sizes, was served as this topic's data.


async def test_another_clusters_volume_is_refused_not_served(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        _, theirs = await two_volumes(etcd_server, tmp_path, store, NAME)
        before = sorted(p.read_bytes() for p in theirs.rglob("*.log"))

        # the wrong volume is mounted: recovery of the last ledger finds a foreign file
        with pytest.raises(LedgerMismatch) as caught:
            await ManagedLedger.open(NAME, store, FileLogStorage(theirs), LedgerSettings())
        error = caught.value
        assert error.path is not None and error.path.startswith(str(theirs))
        assert error.recorded != error.found
        for said in (NAME, f"{error.recorded:#018x}", f"{error.found:#018x}"):
            assert said in str(error)
        # nothing on the foreign volume was changed or deleted
        assert sorted(p.read_bytes() for p in theirs.rglob("*.log")) == before


async def test_a_foreign_closed_ledger_is_refused_when_read(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        ours, theirs = await two_volumes(etcd_server, tmp_path, store, NAME)
        storage = FileLogStorage(ours)
        ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        # a restore put another cluster's copy of ledger 1 in place of ours, while it was
        # open (opening it so refuses it whole: tests/ledger/test_foreign_ledger_edges.py)
        path = restore_wrong(ours, theirs, NAME, 1)
        foreign = path.read_bytes()
        try:
            with pytest.raises(LedgerMismatch, match="ledger 1"):
                await ledger.read(Position(1, 0))
            # the ledgers after it are ours, and served
            assert [e.payload for e in await ledger.read(Position(2, 0))] == [b"ours-1"]
        finally:
            await ledger.close()
        assert path.read_bytes() == foreign  # left as it is


async def test_ledgers_recorded_before_their_nonce_was_kept_are_served(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """Backward compatibility: a record written before ``LedgerInfo.nonce`` existed (no
    such field) opens and serves as it did."""
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        await write_ledgers(store, tmp_path, NAME, [b"old-0", b"old-1"])
        key = metadata_key(NAME)
        record = await store.get(key)
        assert record is not None
        raw = msgspec.json.decode(record.value)
        for info in raw["ledgers"]:
            assert info.pop("nonce") is not None  # recorded when each was created
        await store.put(key, msgspec.json.encode(raw), expected_version=record.version)
        assert all(i.nonce is None for i in decode((await store.get(key)).value).ledgers)  # type: ignore[union-attr]

        ledger = await ManagedLedger.open(NAME, store, FileLogStorage(tmp_path), LedgerSettings())
        try:
            entries = await ledger.read(Position(0, 0))
            assert [e.payload for e in entries] == [b"old-0", b"old-1"]
        finally:
            await ledger.close()


# ---------------------------------------------------------------------------------------
# 2. A read racing close(): the log's file was closed under the read's thread, which then
#    read a closed descriptor (a bare OSError, EBADF), or one the process had meanwhile
#    given to another file.

_READING = threading.Event()
_RESUME = threading.Event()


class _PausedEntryLog(FileEntryLog):
    """A file log whose reads wait for the test in their thread, before touching the file
    (a slow disk)."""

    def read(self, first: int, last: int) -> list[bytes]:
        _READING.set()
        _RESUME.wait(30)
        return super().read(first, last)

    def read_cached(self, first: int, last: int) -> list[bytes] | None:
        return None  # a slow disk: nothing is in the page cache


class _PausedStorage(FileLogStorage):
    entry_log = _PausedEntryLog


async def test_a_read_racing_close_is_answered_not_a_bare_os_error(
    store: MetadataStore, tmp_path: Path
) -> None:
    _READING.clear()
    _RESUME.clear()
    ledger = await ManagedLedger.open(NAME, store, _PausedStorage(tmp_path), LedgerSettings())
    await ledger.append(b"e0")
    reading = asyncio.create_task(ledger.read(Position(0, 0)))
    closing: asyncio.Task[bool] | None = None
    try:
        assert await asyncio.to_thread(_READING.wait, 10)
        closing = asyncio.create_task(ledger.close())
        # the close either releases the files (before the fix) or waits for the read
        await wait_until(
            lambda: closing.done() or ledger._logs.closing, what="close reached the files"
        )
        late = asyncio.create_task(ledger.read(Position(0, 0)))  # once the close began
        with pytest.raises(LedgerClosed):
            await late
    finally:
        _RESUME.set()
        if closing is not None:
            await closing
    # the read in flight ends as it began, with its entries: the close waited for it
    assert [e.payload for e in await reading] == [b"e0"]
