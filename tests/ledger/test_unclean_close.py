"""A close after the ledger's writer failed: the clean close cannot be recorded (the last
ledger's count is not known to be what the file holds), and the close skipped it without a
word. Its caller could not tell a ledger closed cleanly from one left for recovery. The
close now says so (its result, and a WARNING naming the ledger, once), never raising: a
broker stop, a topic's delete and an unload after the failed write must close everything
else. The next open recovers the last ledger as after a crash, keeping every acknowledged
entry.

Real components: files in ``tmp_path`` whose disk is made full (a write stores a prefix of
its bytes, then fails with ENOSPC, as tests/broker/test_disk_full.py does), the in-memory
store, and a "restart" that opens the ledger again over the same store and files.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from segtxn.ledger import (
    FileLogStorage,
    LedgerSettings,
    ManagedLedger,
    Position,
    StorageFull,
    WriteFailed,
)
from segtxn.ledger.files import FileEntryLog
from segtxn.metastore import open_store

NAME = "persistent://t/n/unclean-close"
SAID = "without recording a clean close"


def fill_the_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, a write to a ledger file stores half its bytes and fails with ENOSPC."""
    write_at = FileEntryLog._write_at

    def short_write(log: FileEntryLog, data: bytes, offset: int) -> None:
        write_at(log, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(FileEntryLog, "_write_at", short_write)


async def test_a_close_after_a_failed_write_says_so_and_the_reopen_keeps_what_was_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileLogStorage(tmp_path / "ledgers")
    async with open_store("memory://") as store:
        ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        acknowledged = [await ledger.append(b"m%d" % i) for i in range(3)]
        await ledger.roll_over()
        acknowledged += [await ledger.append(b"m%d" % i) for i in range(3, 5)]
        fill_the_disk(monkeypatch)
        with pytest.raises(WriteFailed) as failed:
            await ledger.append(b"never acknowledged")
        assert isinstance(failed.value.cause, StorageFull)
        monkeypatch.undo()  # (the disk has room again: the reopen makes its next file)

        with caplog.at_level(logging.WARNING, logger="segtxn.ledger"):
            assert await ledger.close() is False, "the close did not say it was not clean"
            assert await ledger.close() is False  # idempotent, and said once
        said = [r.getMessage() for r in caplog.records if SAID in r.getMessage()]
        assert len(said) == 1 and NAME in said[0] and "No space left" in said[0], said

        reopened = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        try:
            entries = await reopened.read(Position(0, 0), max_entries=10)
            assert [e.position for e in entries] == acknowledged
            assert [e.payload for e in entries] == [b"m%d" % i for i in range(5)]
            assert reopened.ledgers[1].entries == 2  # closed by the recovery, at its count
            assert await reopened.append(b"after") > acknowledged[-1]
        finally:
            assert await reopened.close() is True


async def test_a_clean_close_and_a_sealed_ledger_s_close_say_they_are_clean(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileLogStorage(tmp_path / "ledgers")
    async with open_store("memory://") as store:
        ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        await ledger.append(b"m")
        with caplog.at_level(logging.WARNING, logger="segtxn.ledger"):
            assert await ledger.close() is True
        sealed = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        await sealed.terminate()
        with caplog.at_level(logging.WARNING, logger="segtxn.ledger"):
            assert await sealed.close() is True
        assert not [r for r in caplog.records if SAID in r.getMessage()]
