"""File-backed entry logs: one file per ledger, CRC-framed records, fsync per batch.

Record layout (big-endian): ``u32 length | u32 crc32(entry_id || payload) | u64 entry_id``
followed by ``length`` payload bytes. The CRC covers the entry id, so a record found at the
wrong place is as detectable as a flipped bit.

Files live at ``<root>/<quoted managed-ledger name>/<ledger id, 16 digits>.log``. Creating a
file fsyncs its directory, so a ledger the metadata names survives a crash.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from array import array
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from segtxn.ledger.errors import LedgerCorrupted, LedgerFenced
from segtxn.ledger.logs import EntryLog, LogStorage

_HEADER = struct.Struct(">IIQ")
MAX_RECORD_BYTES = 1 << 30


def _crc(entry_id: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(entry_id.to_bytes(8, "big")))


def encode_records(first_id: int, payloads: Sequence[bytes]) -> bytes:
    parts: list[bytes] = []
    for i, payload in enumerate(payloads):
        entry_id = first_id + i
        parts.append(_HEADER.pack(len(payload), _crc(entry_id, payload), entry_id))
        parts.append(payload)
    return b"".join(parts)


class FileEntryLog(EntryLog):
    def __init__(self, path: Path, ledger_id: int, fd: int, offsets: array[int], end: int):
        self.path = path
        self.ledger_id = ledger_id
        self._fd = fd
        self._offsets = offsets  # start offset of each entry
        self._end = end

    @property
    def count(self) -> int:
        return len(self._offsets)

    def size_bytes(self) -> int:
        return self._end

    def append_batch(self, payloads: Sequence[bytes]) -> None:
        data = encode_records(self.count, payloads)
        written = 0
        while written < len(data):
            written += os.pwrite(self._fd, data[written:], self._end + written)
        os.fdatasync(self._fd)
        offsets: list[int] = []
        offset = self._end
        for payload in payloads:
            offsets.append(offset)
            offset += _HEADER.size + len(payload)
        # publish the end before the entries: a concurrent read never sees an entry
        # whose bytes lie past the end it uses
        self._end = offset
        self._offsets.extend(offsets)

    def read(self, first: int, last: int) -> list[bytes]:
        start = self._offsets[first]
        stop = self._offsets[last + 1] if last + 1 < len(self._offsets) else self._end
        data = memoryview(os.pread(self._fd, stop - start, start))
        out: list[bytes] = []
        pos = 0
        for entry_id in range(first, last + 1):
            length, crc, stored_id = _HEADER.unpack_from(data, pos)
            payload = data[pos + _HEADER.size : pos + _HEADER.size + length]
            if stored_id != entry_id or len(payload) != length or _crc(entry_id, payload) != crc:
                raise LedgerCorrupted(
                    f"{self.path}: entry {entry_id} at offset {start + pos} fails its checksum"
                )
            out.append(bytes(payload))
            pos += _HEADER.size + length
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def scan(data: bytes) -> tuple[array[int], int]:
    """Offsets of the valid records from the start, and where validity ends."""
    offsets: array[int] = array("Q")
    pos, size = 0, len(data)
    view = memoryview(data)
    while pos + _HEADER.size <= size:
        length, crc, entry_id = _HEADER.unpack_from(view, pos)
        end = pos + _HEADER.size + length
        if entry_id != len(offsets) or length > MAX_RECORD_BYTES or end > size:
            break
        if _crc(entry_id, view[pos + _HEADER.size : end]) != crc:
            break
        offsets.append(pos)
        pos = end
    return offsets, pos


class FileLogStorage(LogStorage):
    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, ledger_name: str) -> Path:
        return self.root / quote(ledger_name, safe="")

    def path(self, ledger_name: str, ledger_id: int) -> Path:
        return self._dir(ledger_name) / f"{ledger_id:016d}.log"

    def create(self, ledger_name: str, ledger_id: int) -> FileEntryLog:
        directory = self._dir(ledger_name)
        directory.mkdir(parents=True, exist_ok=True)
        path = self.path(ledger_name, ledger_id)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock(fd, path)
            if os.fstat(fd).st_size:
                # a new ledger id never has data: this file belongs to ledger metadata that
                # was lost (e.g. a memory:// store restarted). Never destroy it.
                raise LedgerCorrupted(
                    f"{path} already holds data that the ledger metadata does not know; "
                    "refusing to overwrite it"
                )
            os.fsync(fd)
            _fsync_dir(directory)
        except BaseException:
            os.close(fd)
            raise
        return FileEntryLog(path, ledger_id, fd, array("Q"), 0)

    def open(
        self, ledger_name: str, ledger_id: int, *, tail_bytes: int, must_exist: bool = True
    ) -> FileEntryLog:
        path = self.path(ledger_name, ledger_id)
        if not path.exists():
            if must_exist:
                raise LedgerCorrupted(f"{path}: the metadata names this ledger; it is missing")
            # metadata named the ledger, then the process died before the file was made
            return self.create(ledger_name, ledger_id)
        fd = os.open(path, os.O_RDWR)
        try:
            _lock(fd, path)
            os.fdatasync(fd)  # a crashed writer's unsynced pages: durable before we count them
            data = _read_all(fd)
            offsets, valid_end = scan(data)
            if valid_end < len(data):
                if len(data) - valid_end > tail_bytes:
                    raise LedgerCorrupted(
                        f"{path}: damaged record at offset {valid_end} of {len(data)}, "
                        f"before the last {tail_bytes} bytes a crash can tear"
                    )
                os.ftruncate(fd, valid_end)  # the torn tail of an unacknowledged batch
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return FileEntryLog(path, ledger_id, fd, offsets, valid_end)

    def delete(self, ledger_name: str, ledger_id: int) -> None:
        self.path(ledger_name, ledger_id).unlink(missing_ok=True)


def _lock(fd: int, path: Path) -> None:
    """Hold the log exclusively (released on close, or by the kernel when a process dies)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LedgerFenced(f"{path} is held by another writer") from None


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks, pos = [], 0
    while pos < size:
        chunk = os.pread(fd, min(size - pos, 16 << 20), pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
