"""A trim whose ledger file cannot be removed (permission denied, an I/O error) goes on with
the others. The trim's metadata change has landed when its files are deleted: before, the
first file that failed raised out of the trim (DeleteFailed), the ledgers after it were
neither deleted nor reported (their files left for good; higher layers never told to trim
their indexes), and the trim's caller took it for failed."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger, RetentionPolicy
from segtxn.metastore import open_store

NAME = "persistent://t/n/undeletable"


async def test_a_trimmed_ledger_whose_file_cannot_be_removed_leaves_only_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FileLogStorage(tmp_path / "ledgers")
    async with open_store("memory://") as store:
        ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
        try:
            for i in range(3):
                await ledger.append(b"m%d" % i)
                await ledger.roll_over()
            await ledger.open_cursor("all", start="latest")  # everything is consumed
            first, second = storage.path(NAME, 1), storage.path(NAME, 2)
            assert first.exists() and second.exists()
            unlink = Path.unlink

            def refusing(path: Path, missing_ok: bool = False) -> None:
                if path == first:
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
                unlink(path, missing_ok=missing_ok)

            monkeypatch.setattr(Path, "unlink", refusing)
            with caplog.at_level(logging.WARNING):
                trimmed = await ledger.trim(RetentionPolicy(retention_time_s=0))
            assert trimmed.ledgers[:2] == [1, 2], trimmed
            assert first.exists() and not second.exists()
            said = [r.getMessage() for r in caplog.records if "its file is left" in r.getMessage()]
            assert len(said) == 1 and str(first) in said[0], said
        finally:
            monkeypatch.undo()
            await ledger.close()
