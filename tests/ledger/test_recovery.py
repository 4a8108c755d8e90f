"""File logs after a crash: torn tails are cut off, real corruption is an error."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.ledger import FileLogStorage, LedgerCorrupted, LedgerSettings, ManagedLedger, Position
from segtxn.ledger.files import encode_records
from segtxn.metastore import MetadataStore, open_store

NAME = "persistent://t/n/recover"
SETTINGS = LedgerSettings(max_batch_bytes=1024, max_entry_bytes=1024)


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://") as s:
        yield s


async def _fill(store: MetadataStore, storage: FileLogStorage, n: int) -> list[Position]:
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    positions = [await ledger.append(f"entry-{i}".encode() * 10) for i in range(n)]
    await ledger.close()
    return positions


async def test_torn_tail_is_truncated(store: MetadataStore, tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 20)
    path = storage.path(NAME, positions[-1].ledger_id)
    whole = encode_records(20, [b"unacknowledged" * 5])
    _append_raw(path, whole[: len(whole) // 2])  # a batch the crash cut in half
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        assert ledger.last_confirmed == positions[-1]
        entries = await ledger.read(positions[0], max_entries=100)
        assert [e.position for e in entries] == positions
        assert path.stat().st_size == sum(16 + len(e.payload) for e in entries)
        fresh = await ledger.append(b"after")
        assert fresh > positions[-1]
    finally:
        await ledger.close()


async def test_garbage_tail_is_truncated(store: MetadataStore, tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 5)
    path = storage.path(NAME, positions[-1].ledger_id)
    _append_raw(path, b"\x00" * 300)  # the file grew, its pages never made it
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        assert ledger.last_confirmed == positions[-1]
    finally:
        await ledger.close()


async def test_corruption_before_the_tail_is_an_error(store: MetadataStore, tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 50)  # ~5 KB, more than a batch can tear
    path = storage.path(NAME, positions[-1].ledger_id)
    _flip_byte(path, 40)  # inside entry 0's payload
    with pytest.raises(LedgerCorrupted, match="damaged record"):
        await ManagedLedger.open(NAME, store, storage, SETTINGS)


async def test_corruption_in_a_closed_ledger_is_never_served(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 10)
    await _fill(store, storage, 1)  # reopening closed the first ledger and started another
    _flip_byte(storage.path(NAME, positions[0].ledger_id), 100)
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        with pytest.raises(LedgerCorrupted):
            await ledger.read(positions[0])
    finally:
        await ledger.close()


def _flip_byte(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0xFF]), offset)
    finally:
        os.close(fd)


def _append_raw(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


async def test_a_damaged_entry_of_a_sealed_ledger_is_not_cut_off(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    positions = [await ledger.append(f"e{i}".encode()) for i in range(10)]
    await ledger.terminate()
    await ledger.close()
    path = storage.path(NAME, positions[-1].ledger_id)
    _flip_byte(path, path.stat().st_size - 1)  # inside the last, acknowledged entry
    with pytest.raises(LedgerCorrupted, match="were recorded"):
        await ManagedLedger.open(NAME, store, storage, SETTINGS)


async def test_a_damaged_entry_after_a_clean_close_is_not_cut_off(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 10)
    path = storage.path(NAME, positions[-1].ledger_id)
    _flip_byte(path, path.stat().st_size - 1)
    with pytest.raises(LedgerCorrupted):
        await ManagedLedger.open(NAME, store, storage, SETTINGS)


async def test_a_missing_closed_ledger_is_corruption(store: MetadataStore, tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 3)
    await _fill(store, storage, 1)
    storage.path(NAME, positions[0].ledger_id).unlink()
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        with pytest.raises(LedgerCorrupted, match="missing"):
            await ledger.read(positions[0])
        assert not storage.path(NAME, positions[0].ledger_id).exists()  # not recreated empty
    finally:
        await ledger.close()


async def test_lost_metadata_never_overwrites_ledger_files(tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    async with open_store("memory://") as first_store:
        await _fill(first_store, storage, 5)
    # a new, empty store (a memory store after a restart) knows nothing of those files
    async with open_store("memory://") as second_store:
        with pytest.raises(LedgerCorrupted, match="refusing to overwrite"):
            await ManagedLedger.open(NAME, second_store, storage, SETTINGS)
    assert storage.path(NAME, 1).stat().st_size > 0
