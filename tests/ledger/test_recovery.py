"""File logs after a crash and after damage: what recovery keeps, truncates (logged) or
refuses (naming the file). segtxn/ledger/recovery.py is the contract under test.

A crash leaves the metadata with its last ledger open (no entry count) and the file as the
writer left it; a clean close only adds the count to the metadata. So ``_as_if_crashed``
(dropping that count again) gives exactly the state a SIGKILL right after the last
acknowledgment leaves; tests/ledger/test_crash.py does the same with real processes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
import pytest

from segtxn.ledger import (
    FileLogStorage,
    LedgerCorrupted,
    LedgerMissing,
    LedgerSettings,
    ManagedLedger,
    MemoryLogStorage,
    Position,
)
from segtxn.ledger.metadata import LedgerMetadata, decode, encode, metadata_key
from segtxn.ledger.records import (
    FORMAT,
    HEADER_SIZE,
    MARK_SIZE,
    decode_header,
    encode_records,
    scan,
)
from segtxn.metastore import MetadataStore, open_store

NAME = "persistent://t/n/recover"
SETTINGS = LedgerSettings(max_batch_bytes=1024, max_entry_bytes=1024)


async def _fill(
    store: MetadataStore, storage: FileLogStorage, n: int, *, crash: bool = True
) -> list[Position]:
    """``n`` acknowledged appends, then a crash (or a clean close)."""
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    positions = [await ledger.append(f"entry-{i}".encode() * 10) for i in range(n)]
    await ledger.close()
    if crash:
        await _as_if_crashed(store)
    return positions


async def _as_if_crashed(store: MetadataStore) -> None:
    """The metadata as a crash leaves it: the last ledger still open."""
    record = await store.get(metadata_key(NAME))
    assert record is not None
    meta = decode(record.value)
    last = msgspec.structs.replace(meta.ledgers[-1], entries=None, closed_ms=None, size_bytes=None)
    changed = msgspec.structs.replace(meta, ledgers=[*meta.ledgers[:-1], last])
    await store.put(metadata_key(NAME), encode(changed), expected_version=record.version)


async def _metadata(store: MetadataStore) -> LedgerMetadata:
    record = await store.get(metadata_key(NAME))
    assert record is not None
    return decode(record.value)


async def _reopen_keeps(
    store: MetadataStore, storage: FileLogStorage, positions: list[Position]
) -> ManagedLedger:
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    assert ledger.last_confirmed == positions[-1]
    entries = await ledger.read(positions[0], max_entries=1000)
    assert [e.position for e in entries] == positions
    return ledger


def _offset(path: Path, entry_id: int) -> int:
    """Where entry ``entry_id``'s record starts in a (format 1) ledger file."""
    data = path.read_bytes()
    return scan(data, start=HEADER_SIZE, nonce=decode_header(data, 1)).offsets[entry_id]


def _flip(path: Path, offset: int, count: int = 1) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, count, offset)
        os.pwrite(fd, bytes(b ^ 0xFF for b in old), offset)
    finally:
        os.close(fd)


def _append_raw(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def _cut(path: Path, count: int) -> None:
    os.truncate(path, path.stat().st_size - count)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ================================================================= a torn tail: recovered


async def test_a_torn_batch_is_truncated_and_logged(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 20)
    path = storage.path(NAME, positions[-1].ledger_id)
    size = path.stat().st_size
    whole = encode_records(20, [b"unacknowledged" * 5])
    _append_raw(path, whole[: len(whole) // 2])  # the batch a SIGKILL cut in half
    ledger = await _reopen_keeps(store, storage, positions)
    try:
        assert path.stat().st_size == size
        (line,) = _warnings(caplog)
        assert str(path) in line and f"bytes {size}..{size + len(whole) // 2}" in line
        assert "keeping entries 0..19" in line and "interrupted before it was acknowledged" in line
        assert await ledger.append(b"after") > positions[-1]
    finally:
        await ledger.close()


async def test_cutting_the_last_bytes_cuts_a_mark_not_an_acknowledged_entry(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tester's case: 5 bytes cut off the end used to lose the last acknowledged entry.
    Those bytes are its acknowledgement mark now; the entry stays."""
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 30)
    path = storage.path(NAME, positions[-1].ledger_id)
    _cut(path, 5)
    ledger = await _reopen_keeps(store, storage, positions)
    try:
        (line,) = _warnings(caplog)
        assert str(path) in line and f"an incomplete mark ({MARK_SIZE - 5} of" in line
        assert "keeping entries 0..29" in line
    finally:
        await ledger.close()


async def test_a_garbage_tail_after_the_last_mark_is_truncated(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 5)
    path = storage.path(NAME, positions[-1].ledger_id)
    _append_raw(path, b"\x00" * 300)  # a power loss: the file grew, its pages never came
    ledger = await _reopen_keeps(store, storage, positions)
    try:
        assert any("300 bytes" in line for line in _warnings(caplog))
    finally:
        await ledger.close()


async def test_an_intact_batch_without_its_mark_is_kept(
    store: MetadataStore, tmp_path: Path
) -> None:
    """Killed after the sync, before the mark: not acknowledged, but whole; kept."""
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 3)
    path = storage.path(NAME, positions[-1].ledger_id)
    _append_raw(path, encode_records(3, [b"synced", b"not acked"]))
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        assert ledger.last_confirmed == Position(positions[-1].ledger_id, 4)
    finally:
        await ledger.close()


async def test_a_cut_past_the_last_mark_is_taken_for_a_torn_batch(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The limit of what one file can tell: a cut through the last mark *and* into the
    batch before it is what a crash during that batch leaves. It is truncated, and said."""
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 10)
    path = storage.path(NAME, positions[-1].ledger_id)
    _cut(path, MARK_SIZE + 6)
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        assert ledger.last_confirmed == positions[-2]
        (line,) = _warnings(caplog)
        assert str(path) in line and "keeping entries 0..8" in line
    finally:
        await ledger.close()


# ================================================================= damage: refused, named


async def test_damage_in_the_middle_is_refused_not_truncated(
    store: MetadataStore, tmp_path: Path
) -> None:
    """The tester's case: 8 bytes damaged mid-file used to lose the 15 entries after them."""
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 30)
    path = storage.path(NAME, positions[-1].ledger_id)
    size = path.stat().st_size
    _flip(path, size // 2, 8)
    before = path.read_bytes()
    with pytest.raises(LedgerCorrupted, match="acknowledged") as caught:
        await ManagedLedger.open(NAME, store, storage, SETTINGS)
    assert caught.value.path == str(path) and str(path) in str(caught.value)
    assert path.read_bytes() == before  # nothing was cut
    assert (await _metadata(store)).ledgers[-1].entries is None  # nor recorded as closed


async def test_damage_to_the_last_acknowledged_entry_is_refused(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 10)
    path = storage.path(NAME, positions[-1].ledger_id)
    _flip(path, path.stat().st_size - MARK_SIZE - 1)  # its last payload byte; the mark follows
    with pytest.raises(LedgerCorrupted, match="a mark at offset"):
        await ManagedLedger.open(NAME, store, storage, SETTINGS)


async def test_more_unconfirmed_bytes_than_a_crash_leaves_are_refused(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 60)  # ~5 KB, more than two 1 KiB batches
    path = storage.path(NAME, positions[-1].ledger_id)
    size = path.stat().st_size
    with path.open("r+b") as f:  # zeroed from the second entry on: marks and all
        f.seek(HEADER_SIZE + 200)
        f.write(b"\x00" * (size - HEADER_SIZE - 200))
    with pytest.raises(LedgerCorrupted, match="more than a crash leaves unconfirmed"):
        await ManagedLedger.open(NAME, store, storage, SETTINGS)


async def test_a_file_without_its_header_is_refused(store: MetadataStore, tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 5)
    path = storage.path(NAME, positions[-1].ledger_id)
    os.truncate(path, 0)
    with pytest.raises(LedgerCorrupted, match="no valid header"):
        await ManagedLedger.open(NAME, store, storage, SETTINGS)


@pytest.mark.parametrize("then", ["", "garbage appended"])
@pytest.mark.parametrize("how", ["sealed", "clean close"])
async def test_a_closed_last_ledger_is_never_cut(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str, then: str
) -> None:
    """Short of one entry, it is refused, whatever follows (bytes after the cut are not
    taken for the entry, nor for a change that lost nothing)."""
    storage = FileLogStorage(tmp_path)
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    positions = [await ledger.append(f"e{i}".encode()) for i in range(10)]
    if how == "sealed":
        await ledger.terminate()
    await ledger.close()
    path = storage.path(NAME, positions[-1].ledger_id)
    _cut(path, MARK_SIZE + 1)  # into the last, acknowledged entry
    if then:
        _append_raw(path, GARBAGE)
    with pytest.raises(LedgerCorrupted, match="10 entries were recorded"):
        await ManagedLedger.open(NAME, store, storage, SETTINGS)
    assert not any("changed after" in line for line in _warnings(caplog))


async def test_a_damaged_closed_ledger_serves_up_to_the_damage_then_names_it(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 10, crash=False)
    await _fill(store, storage, 1, crash=False)  # the reopen closed the first ledger
    path = storage.path(NAME, positions[0].ledger_id)
    _flip(path, _offset(path, 4) + 20)  # inside entry 4's payload
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        served = await ledger.read(positions[0], max_entries=100)
        assert [e.position for e in served] == positions[:4]
        for _ in range(2):  # every read of it fails the same way; logged once
            with pytest.raises(LedgerCorrupted, match="entry 4 fails its checksum") as caught:
                await ledger.read(positions[4])
            assert caught.value.path == str(path)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and str(path) in errors[0].getMessage()
    finally:
        await ledger.close()


async def test_a_truncated_closed_ledger_names_what_is_missing(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 10, crash=False)
    await _fill(store, storage, 1, crash=False)
    path = storage.path(NAME, positions[0].ledger_id)
    os.truncate(path, _offset(path, 7))  # at a record boundary: three entries gone
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        assert len(await ledger.read(positions[0], max_entries=100)) == 7
        with pytest.raises(LedgerCorrupted, match=r"entries 7\.\.9 cannot be read"):
            await ledger.read(positions[7])
    finally:
        await ledger.close()


# ================================================================= closed, then changed: said


CLOSED = 10
"""Entries of the closed ledger (ledger 1) the tests below change."""
GARBAGE = encode_records(CLOSED, [b"not an entry"]) + b"\xde\xad\xbe\xef" * 50
"""Bytes appended to a closed ledger: a record that looks like its next entry (its id,
a good checksum), then noise."""


def _payload(i: int) -> bytes:
    return f"entry-{i}".encode() * 10  # as _fill appends them


async def _closed_ledger(
    store: MetadataStore, storage: FileLogStorage, where: str
) -> list[Position]:
    """Ledger 1 with CLOSED entries, closed as ``where`` says: the last ledger, closed
    cleanly or sealed, or an older one (a reopen closed it, ledger 2 holds one more
    entry). Returns every position of the managed ledger."""
    if where == "last, sealed":
        ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
        positions = [await ledger.append(_payload(i)) for i in range(CLOSED)]
        await ledger.terminate()
        await ledger.close()
        return positions
    positions = await _fill(store, storage, CLOSED, crash=False)
    if where == "older":
        positions += await _fill(store, storage, 1, crash=False)
    return positions


def _change(path: Path, change: str) -> str:
    """Change a closed ledger's file as ``change`` says; returns what the WARNING must say."""
    size = path.stat().st_size
    if change == "mark cut":
        _cut(path, MARK_SIZE)
        return (
            f"its final acknowledgement mark (offset {size - MARK_SIZE}) is missing: the file "
            f"ends at byte {size - MARK_SIZE} (it had {size} bytes when it closed)"
        )
    if change == "mark zeroed":  # what a power loss right after the close can leave
        with path.open("r+b") as f:
            f.seek(size - MARK_SIZE)
            f.write(bytes(MARK_SIZE))
        return f"is missing: bytes {size - MARK_SIZE}..{size} hold zeros"
    _append_raw(path, GARBAGE)
    return (
        f"{len(GARBAGE)} unexpected bytes follow its last entry and its mark, at offset {size} "
        f"(bytes {size}..{size + len(GARBAGE)}; it had {size} bytes when it closed), holding "
        f"records of entries {CLOSED}..{CLOSED}, past the {CLOSED} recorded (never served)"
    )


@pytest.mark.parametrize("where", ["last, closed", "last, sealed", "older"])
@pytest.mark.parametrize("change", ["mark cut", "mark zeroed", "garbage"])
async def test_a_closed_ledger_changed_after_it_closed_is_served_and_said(
    store: MetadataStore,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    where: str,
    change: str,
) -> None:
    """The trial's cases: a closed ledger's final mark cut off, or bytes appended after
    its end, was served without a word. Every entry is still there, so it is served as it
    is, and one WARNING names the file, what was found and where."""
    storage = FileLogStorage(tmp_path)
    positions = await _closed_ledger(store, storage, where)
    path = storage.path(NAME, 1)
    assert (await _metadata(store)).ledgers[0].size_bytes == path.stat().st_size
    found = _change(path, change)
    changed = path.read_bytes()
    caplog.clear()
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        for _ in range(2):  # every read serves it all; said once
            served = await ledger.read(positions[0], max_entries=1000)
            assert [e.position for e in served] == positions
            assert [e.payload for e in served[:CLOSED]] == [_payload(i) for i in range(CLOSED)]
        (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
        line = record.getMessage()
        assert record.levelno == logging.WARNING
        assert f"{path} changed after ledger 1 closed: " in line and found in line
        assert f"the {CLOSED} entries recorded when it closed are intact and are served" in line
        cause = "power loss" if change.startswith("mark") else "no crash adds bytes"
        assert cause in line
        assert path.read_bytes() == changed  # a closed ledger is never changed
    finally:
        await ledger.close()


async def test_reads_of_a_closed_ledger_stop_at_its_recorded_end(
    store: MetadataStore, tmp_path: Path
) -> None:
    """Bytes after a closed ledger's end are never read, let alone served: not the record
    that looks like its next entry, nor the last entry's read running into them."""
    storage = FileLogStorage(tmp_path)
    await _fill(store, storage, CLOSED, crash=False)
    path = storage.path(NAME, 1)
    size = path.stat().st_size
    _append_raw(path, GARBAGE + bytes(1 << 20))
    entry_log = storage.open(NAME, 1, log_format=FORMAT, entries=CLOSED, size_bytes=size)
    try:
        assert entry_log.count == CLOSED and entry_log.size_bytes() == size
        assert entry_log.read(CLOSED - 1, CLOSED - 1) == [_payload(CLOSED - 1)]
        assert entry_log.entries_within(CLOSED - 2, 1 << 10) == 2  # (the last one ends there)
        with pytest.raises(IndexError):
            entry_log.read(CLOSED, CLOSED)
        assert entry_log.damage is None and entry_log.alteration is not None
    finally:
        entry_log.close()


async def test_a_ledger_recovery_closed_without_a_final_mark_is_as_it_was_written(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash between a batch's sync and its mark leaves a whole batch without a mark,
    which recovery keeps and closes: no final mark is what was written, and reading it
    says nothing. Bytes appended to it later are said, and not as a missing mark."""
    storage = FileLogStorage(tmp_path)
    await _fill(store, storage, 3)
    path = storage.path(NAME, 1)
    _append_raw(path, encode_records(3, [b"synced", b"not acked"]))
    await (await ManagedLedger.open(NAME, store, storage, SETTINGS)).close()  # closes 1 at 5
    first = Position(1, 0)
    for appended in (b"", b"\xde\xad" * 10):
        size = path.stat().st_size
        _append_raw(path, appended)
        caplog.clear()
        ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
        try:
            served = await ledger.read(first, max_entries=1000)
            assert [e.position for e in served] == [Position(1, i) for i in range(5)]
        finally:
            await ledger.close()
        lines = _warnings(caplog)
        if not appended:
            assert lines == []
            continue
        (line,) = lines
        assert f"20 unexpected bytes follow its last entry, at offset {size} " in line
        assert "is missing" not in line and "its mark" not in line


# ================================================================= missing files: refused


async def test_a_missing_closed_ledger_refuses_the_managed_ledger(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 3)
    await _fill(store, storage, 1)
    path = storage.path(NAME, positions[0].ledger_id)
    path.unlink()
    with pytest.raises(LedgerMissing) as caught:
        await ManagedLedger.open(NAME, store, storage, SETTINGS)
    assert caught.value.paths == (str(path),)
    assert not path.exists()  # not recreated empty


async def test_an_empty_data_directory_is_refused_and_left_empty(
    store: MetadataStore, tmp_path: Path
) -> None:
    """The tester's case: a broker restarted on an empty volume served its topics empty."""
    await _fill(store, FileLogStorage(tmp_path / "old"), 5)
    empty = FileLogStorage(tmp_path / "new")
    with pytest.raises(
        LedgerMissing, match=r"none of the 1 ledger file\(s\) the metadata"
    ) as caught:
        await ManagedLedger.open(NAME, store, empty, SETTINGS)
    assert caught.value.paths == (str(empty.path(NAME, 1)),)
    assert not (tmp_path / "new").exists()  # nothing created
    before = await _metadata(store)
    assert before.ledgers[-1].entries is None  # the metadata is left as it was


async def test_memory_storage_that_lost_its_logs_is_refused(store: MetadataStore) -> None:
    ledger = await ManagedLedger.open(NAME, store, MemoryLogStorage(), SETTINGS)
    await ledger.append(b"gone with the process")
    await ledger.close()
    with pytest.raises(LedgerMissing):
        await ManagedLedger.open(NAME, store, MemoryLogStorage(), SETTINGS)


async def test_lost_metadata_never_overwrites_ledger_files(tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path)
    async with open_store("memory://") as first_store:
        await _fill(first_store, storage, 5)
    # a new, empty store (a memory store after a restart) knows nothing of those files
    async with open_store("memory://") as second_store:
        with pytest.raises(LedgerCorrupted, match="refusing to overwrite"):
            await ManagedLedger.open(NAME, second_store, storage, SETTINGS)
    assert storage.path(NAME, 1).stat().st_size > HEADER_SIZE


async def test_a_ledger_created_but_never_named_is_reused(
    store: MetadataStore, tmp_path: Path
) -> None:
    """A crash between creating the next ledger's file and the metadata naming it leaves
    a file with a header only: the next open creates that ledger again over it."""
    storage = FileLogStorage(tmp_path)
    positions = await _fill(store, storage, 3)
    next_id = (await _metadata(store)).next_ledger_id
    storage.create(NAME, next_id).close()
    ledger = await _reopen_keeps(store, storage, positions)
    try:
        assert (await ledger.append(b"x")).ledger_id == next_id
    finally:
        await ledger.close()


# ================================================================= format 0 (no marks)


async def _legacy(store: MetadataStore, storage: FileLogStorage, n: int) -> Path:
    """A ledger as the previous version wrote it: records only, crashed while open."""
    path = storage.path(NAME, 1)
    path.parent.mkdir(parents=True)
    path.write_bytes(encode_records(0, [f"old-{i}".encode() * 10 for i in range(n)]))
    meta = {"ledgers": [{"id": 1, "created_ms": 1}], "next_ledger_id": 2, "tail_bytes": 1040}
    await store.put(metadata_key(NAME), msgspec.json.encode(meta))
    return path


async def test_a_format_0_ledger_recovers_by_the_older_rule(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileLogStorage(tmp_path)
    path = await _legacy(store, storage, 20)
    _append_raw(path, encode_records(20, [b"torn" * 20])[:30])
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        assert ledger.last_confirmed == Position(1, 19)
        assert any("format-0" in line and str(path) in line for line in _warnings(caplog))
        assert (await ledger.append(b"new")).ledger_id == 2  # a new file, with marks
        assert (await _metadata(store)).ledgers[-1].format == 1
    finally:
        await ledger.close()


async def test_deep_damage_in_a_format_0_ledger_is_refused(
    store: MetadataStore, tmp_path: Path
) -> None:
    storage = FileLogStorage(tmp_path)
    path = await _legacy(store, storage, 100)  # ~7 KB, beyond the 1040 bytes a crash tears
    _flip(path, 40)
    with pytest.raises(LedgerCorrupted, match="format-0"):
        await ManagedLedger.open(NAME, store, storage, SETTINGS)


async def test_a_cut_that_took_consumed_entries_is_an_error_naming_them(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same cut, when a subscription had acknowledged the entries it removed: the file
    takes it for an interrupted write, the cursor proves they were stored. An ERROR says
    how many are gone (the trial cut 3,000 bytes: 47 consumed entries vanished in silence)."""
    storage = FileLogStorage(tmp_path)
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    positions = [await ledger.append(f"entry-{i}".encode() * 10) for i in range(10)]
    cursor = await ledger.open_cursor("s", start="earliest")
    await cursor.ack_cumulative(positions[-1])
    untouched = await ledger.open_cursor("behind", start="earliest")
    await untouched.ack_cumulative(positions[2])
    await ledger.close()
    await _as_if_crashed(store)
    path = storage.path(NAME, positions[-1].ledger_id)
    _cut(path, MARK_SIZE + 6)  # the last entry and its mark
    caplog.clear()
    ledger = await ManagedLedger.open(NAME, store, storage, SETTINGS)
    try:
        assert ledger.last_confirmed == positions[-2]
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        (line,) = errors  # the subscription behind the cut has lost nothing
        assert "'s' had acknowledged up to" in line and str(positions[-1]) in line
        assert "1 stored and acknowledged entries are gone" in line
    finally:
        await ledger.close()
