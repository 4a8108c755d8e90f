"""A ledger's files at the edges, after their identity (a nonce in each file's header,
recorded in its ``LedgerInfo``) was added: the start-up check, trims and deletes on a
foreign volume, a refusal repeated, and a log let go while reads are in flight on it. Each
failed before its fix (a review of tests/ledger/test_ledger_identity_edges.py's leftovers).

Real components throughout: files in ``tmp_path``, a real etcd (two key namespaces stand
for two independent clusters), a real broker answering ``/readyz`` over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from pathlib import Path

import msgspec
import pytest

from segtxn.client import Client
from segtxn.ledger import (
    FileLogStorage,
    LedgerSettings,
    ManagedLedger,
    Position,
    RetentionPolicy,
    check_files,
)
from segtxn.ledger.errors import LedgerMismatch, LedgerMissing
from segtxn.ledger.files import FileEntryLog
from segtxn.ledger.metadata import metadata_key
from segtxn.ledger.sealed import delete_sealed, read_sealed
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from tests.ledger.foreign import (
    broker_on,
    cluster_url,
    readyz,
    restore_wrong,
    two_volumes,
    write_ledgers,
)

NAME = "persistent://t/n/files"


def _volume(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*.log")}


# ---------------------------------------------------------------------------------------
# 1. The start-up check looked for each ledger's file, not at whose it was: a broker
#    started on another cluster's volume (files of the same names) was ready, and its
#    topics failed one by one when they were first used.


async def test_the_start_up_check_refuses_another_clusters_files(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        ours, theirs = await two_volumes(etcd_server, tmp_path, store, NAME)
        before = _volume(theirs)

        await check_files(NAME, store, FileLogStorage(ours))  # our own volume passes
        with pytest.raises(LedgerMismatch) as caught:
            await check_files(NAME, store, FileLogStorage(theirs))
        error = caught.value
        assert error.path == str(FileLogStorage(theirs).path(NAME, 1))
        assert error.recorded != error.found
        said = str(error)
        for part in (NAME, "ledger 1", error.path, f"{error.recorded:#018x}"):
            assert part in said
        assert f"{error.found:#018x}" in said
        assert "3 of its 3 ledger files" in said
        assert _volume(theirs) == before  # looked at, not changed


async def test_a_broker_started_on_another_clusters_volume_is_not_ready(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    topic = "persistent://acme/files/events"
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    prefix = f"/files-broker-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    for cluster, volume in (("a", ours), ("b", theirs)):
        broker = broker_on(etcd_server.url(f"{prefix}-{cluster}"), volume)
        await broker.start()
        try:
            async with Client(broker.settings.advertise_url) as client:
                await client.admin.create_topic(topic)
                producer = await client.create_producer(topic)
                await producer.send(f"from {cluster}".encode())
        finally:
            await broker.stop()

    wrong = broker_on(etcd_server.url(f"{prefix}-a"), theirs)  # cluster a on b's volume
    await wrong.start()
    try:
        status, body = await readyz(wrong)
        assert status == 503 and body["ready"] is False, body
        assert "not this broker's volume" in str(body["reason"])
        refused = body["refused"]
        assert isinstance(refused, dict) and set(refused) == {topic}
        assert "nonce" in refused[topic] and str(theirs) in refused[topic]
    finally:
        await wrong.stop()


# ---------------------------------------------------------------------------------------
# 2. A trim or a delete on a foreign volume deleted the files at the metadata's paths,
#    whoever's they were: another cluster's data (or the only copy of an old one) gone.


async def _with_foreign(
    etcd_server: EtcdServer, tmp_path: Path, store: MetadataStore, ledger_id: int
) -> tuple[FileLogStorage, Path]:
    """:func:`two_volumes`, then :func:`restore_wrong` of ledger ``ledger_id``. Returns our
    storage and the foreign file's path."""
    ours, theirs = await two_volumes(etcd_server, tmp_path, store, NAME)
    return FileLogStorage(ours), restore_wrong(ours, theirs, NAME, ledger_id)


async def _open_with_foreign(
    etcd_server: EtcdServer, tmp_path: Path, store: MetadataStore, ledger_id: int
) -> tuple[ManagedLedger, FileLogStorage, Path]:
    """:func:`two_volumes`, ``NAME`` opened (opening refuses a foreign file: it checks every
    one), then :func:`restore_wrong` of ledger ``ledger_id`` while it is open."""
    ours, theirs = await two_volumes(etcd_server, tmp_path, store, NAME)
    storage = FileLogStorage(ours)
    ledger = await ManagedLedger.open(NAME, store, storage)
    return ledger, storage, restore_wrong(ours, theirs, NAME, ledger_id)


async def test_a_trim_stops_at_a_foreign_file_and_leaves_it(
    etcd_server: EtcdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        ledger, storage, foreign = await _open_with_foreign(etcd_server, tmp_path, store, 2)
        held = foreign.read_bytes()
        try:
            await ledger.open_cursor("all", start="latest")  # everything is consumed
            with caplog.at_level(logging.ERROR):
                result = await ledger.trim(RetentionPolicy(retention_time_s=0))
            # ledger 1 is ours, and goes; 2 is not, and stays, with all after it
            assert result.ledgers == [1]
            assert ledger.ledger_ids[0] == 2
            assert foreign.read_bytes() == held
            assert not storage.path(NAME, 1).exists()
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert any("ledger 2" in m and str(foreign) in m for m in errors), errors
        finally:
            await ledger.close()


async def test_deleting_a_managed_ledger_with_a_foreign_file_deletes_nothing(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        ledger, _, foreign = await _open_with_foreign(etcd_server, tmp_path, store, 1)
        before = _volume(tmp_path / "ours")
        with pytest.raises(LedgerMismatch, match="ledger 1") as caught:
            await ledger.delete()
        assert caught.value.path == str(foreign)
        # refused before anything went: the foreign file, ours, and the metadata
        assert set(_volume(tmp_path / "ours")) == set(before)
        assert foreign.read_bytes() == before[foreign]
        assert await store.get(metadata_key(NAME)) is not None


async def test_deleting_a_sealed_ledger_with_a_foreign_file_deletes_nothing(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """A retired segment's delete (segtxn/broker/retire.py) opens nothing: no recovery
    would have noticed."""
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        ours, theirs = await two_volumes(etcd_server, tmp_path, store, NAME)
        storage = FileLogStorage(ours)
        ledger = await ManagedLedger.open(NAME, store, storage)
        await ledger.terminate()
        await ledger.close()
        restore_wrong(ours, theirs, NAME, 1)
        before = _volume(ours)
        sealed = await read_sealed(store, NAME, max_persisted_ranges=10)
        assert sealed is not None
        with pytest.raises(LedgerMismatch, match="ledger 1"):
            await delete_sealed(store, storage, sealed)
        assert _volume(ours) == before
        assert await store.get(metadata_key(NAME)) is not None


async def test_a_trim_of_ledgers_recorded_without_a_nonce_deletes_as_before(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """Records written before ``LedgerInfo.nonce`` was kept say nothing to check against:
    their files are deleted as they always were."""
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        storage, foreign = await _with_foreign(etcd_server, tmp_path, store, 1)
        key = metadata_key(NAME)
        record = await store.get(key)
        assert record is not None
        raw = msgspec.json.decode(record.value)
        for info in raw["ledgers"]:
            del info["nonce"]
        await store.put(key, msgspec.json.encode(raw), expected_version=record.version)
        ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        try:
            await ledger.open_cursor("all", start="latest")
            result = await ledger.trim(RetentionPolicy(retention_time_s=0))
            assert result.ledgers == [1, 2, 3]
            assert not foreign.exists()
        finally:
            await ledger.close()


# ---------------------------------------------------------------------------------------
# 3. A closed ledger refused once was refused again, on every later read, as a plain
#    LedgerCorrupted: a caller catching LedgerMismatch (or LedgerMissing) got it once.


async def test_a_foreign_closed_ledger_is_refused_the_same_way_every_time(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with open_store(cluster_url(etcd_server, tmp_path, "a")) as store:
        ledger, _, foreign = await _open_with_foreign(etcd_server, tmp_path, store, 1)
        try:
            refusals = []
            for _ in range(3):
                with pytest.raises(LedgerMismatch) as caught:
                    await ledger.read(Position(1, 0))
                refusals.append(caught.value)
            first = refusals[0]
            for again in refusals[1:]:
                assert again is not first  # (a new error each time, not one shared)
                assert (str(again), again.path) == (str(first), str(foreign))
                assert (again.recorded, again.found) == (first.recorded, first.found)
        finally:
            await ledger.close()


async def test_a_closed_ledger_whose_file_went_is_missing_every_time(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    await write_ledgers(store, tmp_path, NAME, [b"e0", b"e1"])
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    try:
        path = storage.path(NAME, 1)
        path.unlink()  # gone after the open checked it
        for _ in range(2):
            with pytest.raises(LedgerMissing) as caught:
                await ledger.read(Position(1, 0))
            assert caught.value.paths == (str(path),)
    finally:
        await ledger.close()


# ---------------------------------------------------------------------------------------
# 4. LogHandles.let_go() (a replicated ledger's move: its next read opens it from its new
#    placement) closed the log at once, under a read in flight on it in its thread, which
#    then read a closed descriptor (a bare OSError, EBADF) or one the process had
#    meanwhile given to another file.

_READING = threading.Event()
_RESUME = threading.Event()
_CLOSED = threading.Event()


class _PausedEntryLog(FileEntryLog):
    """A file log whose reads wait for the test in their thread, before touching the file
    (a slow disk), and which says when it is closed."""

    def read(self, first: int, last: int) -> list[bytes]:
        _READING.set()
        _RESUME.wait(30)
        return super().read(first, last)

    def read_cached(self, first: int, last: int) -> list[bytes] | None:
        return None  # a slow disk: nothing is in the page cache

    def close(self) -> None:
        _CLOSED.set()
        super().close()


class _PausedStorage(FileLogStorage):
    entry_log = _PausedEntryLog


async def test_let_go_lets_a_read_in_flight_end_on_the_log_before_closing_it(
    store: MetadataStore, tmp_path: Path
) -> None:
    for event in (_READING, _RESUME, _CLOSED):
        event.clear()
    ledger = await ManagedLedger.open(NAME, store, _PausedStorage(tmp_path), LedgerSettings())
    forgetting: asyncio.Task[bool] | None = None
    try:
        await ledger.append(b"e0")
        await ledger.roll_over()  # ledger 1 is closed, its log still held for reads
        reading = asyncio.create_task(ledger.read(Position(1, 0)))
        try:
            assert await asyncio.to_thread(_READING.wait, 10)
            released = await ledger._logs.let_go(1)
            # let_go() closes the log under the read (before the fix), or leaves it to it
            assert not _CLOSED.is_set() and 1 in ledger._logs.letting_go
            assert released is not None and not released.is_set()
            forgetting = asyncio.create_task(released.wait())
        finally:
            _RESUME.set()
        # the read in flight ends as it began, with its entries; then the log is closed
        assert [e.payload for e in await reading] == [b"e0"]
        await forgetting
        assert _CLOSED.is_set() and not ledger._logs.letting_go
        # and the ledger's next read opens it again
        assert [e.payload for e in await ledger.read(Position(1, 0))] == [b"e0"]
    finally:
        _RESUME.set()
        if forgetting is not None:
            await forgetting
        await ledger.close()
