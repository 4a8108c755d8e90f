"""A file log's read of bytes in the page cache runs in the event loop; one the disk would be
waited for (or where ``RWF_NOWAIT`` is refused) takes a worker thread, with the same answer
and the same refusals (segtxn/ledger/files.py ``FileEntryLog.read_async``).

Why: a hop to a worker thread and back cost 90-100 µs of CPU on the 2-core machine, a read
of cached pages 1-2 µs, and a dispatcher reads once per run of new entries. Real files;
the kernel's answer to ``RWF_NOWAIT`` is replaced where a test needs the disk's.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from segtxn.ledger import files
from segtxn.ledger.errors import LedgerCorrupted
from segtxn.ledger.files import FileEntryLog, FileLogStorage
from segtxn.ledger.records import ENTRY_OVERHEAD

pytestmark = pytest.mark.skipif(
    not hasattr(os, "RWF_NOWAIT"), reason="RWF_NOWAIT is Linux's: every read takes a thread"
)
PAYLOADS = [b"entry-%d" % i * 10 for i in range(20)]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[FileEntryLog]:
    entry_log = FileLogStorage(tmp_path).create("t", 1)
    entry_log.append_batch(PAYLOADS)
    yield entry_log
    entry_log.close()


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of each function a read handed to a worker thread."""
    handed: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        handed.append(fn.__name__)
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    return handed


def disk_would_wait(monkeypatch: pytest.MonkeyPatch, code: int) -> list[int]:
    """``preadv`` with ``RWF_NOWAIT`` fails with ``code`` (EAGAIN: not all cached);
    returns the flags of each call."""
    calls: list[int] = []

    def preadv(fd: int, buffers: list[bytearray], offset: int, flags: int = 0) -> int:
        calls.append(flags)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "preadv", preadv)
    return calls


async def test_a_read_of_cached_bytes_is_answered_in_the_loop(
    log: FileEntryLog, threads: list[str]
) -> None:
    assert await log.read_async(3, 9) == PAYLOADS[3:10]
    assert await log.read_async(0, 19) == log.read(0, 19) == PAYLOADS
    assert threads == []


@pytest.mark.parametrize("code", [errno.EAGAIN, errno.EOPNOTSUPP])
async def test_a_read_the_disk_would_wait_for_takes_a_thread_with_the_same_answer(
    log: FileEntryLog, threads: list[str], monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    calls = disk_would_wait(monkeypatch, code)
    assert await log.read_async(3, 9) == PAYLOADS[3:10]
    assert calls == [os.RWF_NOWAIT]
    assert threads == ["read"]


async def test_a_large_read_takes_a_thread_without_trying_the_loop(
    log: FileEntryLog, threads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "IN_LOOP_READ_BYTES", 64)  # fewer than entries 0..19 hold
    calls = disk_would_wait(monkeypatch, errno.EAGAIN)
    assert await log.read_async(0, 19) == PAYLOADS
    assert (calls, threads) == ([], ["read"])


async def test_a_damaged_entry_read_in_the_loop_is_refused_as_on_a_thread(
    log: FileEntryLog, threads: list[str]
) -> None:
    at = log._offsets[5] + ENTRY_OVERHEAD  # one byte of entry 5's payload flipped
    data = bytearray(log.path.read_bytes())
    data[at] ^= 0xFF
    log.path.write_bytes(bytes(data))
    with pytest.raises(LedgerCorrupted, match=r"entry 5 .* fails its checksum"):
        await log.read_async(4, 6)
    with pytest.raises(LedgerCorrupted, match=r"entry 5 .* fails its checksum"):
        log.read(4, 6)
    assert threads == []
    assert await log.read_async(6, 7) == PAYLOADS[6:8]


async def test_a_read_past_the_end_is_refused_in_the_loop_as_on_a_thread(
    log: FileEntryLog, threads: list[str]
) -> None:
    with pytest.raises(IndexError, match="entry 20 is beyond 20"):
        await log.read_async(19, 20)
    assert threads == []
