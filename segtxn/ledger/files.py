"""File-backed entry logs: one file per ledger, CRC-framed records, one fdatasync per batch.

The record format (a header, entry records, acknowledgement marks) is in
:mod:`segtxn.ledger.records`; what recovery keeps, truncates or refuses is in
:mod:`segtxn.ledger.recovery`. This module does the I/O.

Files live at ``<root>/<quoted managed-ledger name>/<ledger id, 16 digits>.log``. Creating a
file writes its header and fsyncs it and its directory, so a ledger the metadata names (it
is named only after this) survives a crash. A batch is one ``write`` and one
``fdatasync``, then its mark: one more small ``write``, never another sync.

A managed ledger's directory is removed when the delete of its last file empties it (a
retired segment or a deleted topic leaves nothing behind, issue 22). The name may be used
again at once (a topic re-created under the same name maps to the same directory), so the
removal is only ever an ``rmdir`` (which refuses a directory holding anything), and a
create that finds its directory removed between its ``mkdir`` and its ``open`` makes it
again (:func:`create_file`): no lock is needed between them, across threads or processes.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import fcntl
import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from segtxn.ledger.errors import DeleteFailed, LedgerCorrupted, LedgerFenced, LedgerMissing
from segtxn.ledger.logs import (
    LOCAL,
    Alteration,
    EntryLog,
    LogStorage,
    Placement,
    Recovered,
    check_local,
)
from segtxn.ledger.records import (
    ENTRY_OVERHEAD,
    HEADER_SIZE,
    decode_entry,
    decode_header,
    encode_header,
    encode_mark,
    encode_records,
    is_unused,
    new_nonce,
)
from segtxn.ledger.recovery import check_closed, check_identity, recover_tail

IN_LOOP_READ_BYTES = 1 << 20
"""The most a read does in the event loop (:meth:`FileEntryLog.read_async`): decoding and
checking a larger one would hold the loop, where a worker thread lets it run between."""
_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)


class FileEntryLog(EntryLog):
    def __init__(
        self,
        path: Path,
        ledger_id: int,
        fd: int,
        offsets: array[int],
        end: int,
        *,
        nonce: int | None,
        damage: LedgerCorrupted | None = None,
        alteration: Alteration | None = None,
    ) -> None:
        """``nonce``: the file's, for a log to append to (None for a closed one, and a
        format-0 file: they are never appended to)."""
        self.path = path
        self.ledger_id = ledger_id
        self._fd = fd
        self._offsets = offsets  # start offset of each entry
        self._end = end
        self.nonce = nonce
        self.damage = damage
        self.alteration = alteration
        self._nowait_refused = False
        """``RWF_NOWAIT`` was refused on this file (:meth:`read_cached` asks no more)."""

    @property
    def count(self) -> int:
        return len(self._offsets)

    def size_bytes(self) -> int:
        return self._end

    def entries_within(self, first: int, max_bytes: int) -> int:
        """How many entries from ``first`` fit in ``max_bytes`` on disk (at least one)."""
        limit = self._offsets[first] + max_bytes
        starts = bisect.bisect_right(self._offsets, limit, lo=first + 1)
        count = starts - 1 - first  # entry j ends where entry j + 1 starts
        if starts == len(self._offsets) and self._end <= limit:
            count += 1  # (the last one ends at the end of the file)
        return max(1, count)

    def append_batch(self, payloads: Sequence[bytes]) -> None:
        if self.nonce is None:
            raise LedgerCorrupted(f"{self.path}: a format-0 ledger is never appended to")
        data = encode_records(self.count, payloads)
        self._write_at(data, self._end)
        os.fdatasync(self._fd)
        offsets: list[int] = []
        offset = self._end
        for payload in payloads:
            offsets.append(offset)
            offset += ENTRY_OVERHEAD + len(payload)
        offset = self._mark(self.nonce, offset, self.count + len(payloads))
        # publish the end before the entries: a concurrent read never sees an entry
        # whose bytes lie past the end it uses
        self._end = offset
        self._offsets.extend(offsets)

    def _mark(self, nonce: int, offset: int, entries: int) -> int:
        """Record that the first ``entries`` entries, all before ``offset``, are synced
        (before any of them is acknowledged); returns the new end. Not synced: a process
        crash keeps it, and the next batch's fdatasync makes it durable."""
        mark = encode_mark(nonce, offset, entries)
        self._write_at(mark, offset)
        return offset + len(mark)

    def _write_at(self, data: bytes, offset: int) -> None:
        written = 0
        while written < len(data):
            written += os.pwrite(self._fd, data[written:], offset + written)

    def last_within(self, first: int, last: int, max_bytes: int) -> int:
        if first >= self.count:
            return last  # (a damaged one's read of it raises)
        return max(first, min(last, first + self.entries_within(first, max_bytes) - 1))

    def read(self, first: int, last: int) -> list[bytes]:
        last, start, stop = self._span(first, last)
        return self._decode(memoryview(os.pread(self._fd, stop - start, start)), first, last)

    async def read_async(self, first: int, last: int) -> list[bytes]:
        """:meth:`read`, in the event loop when :meth:`read_cached` can, else on a worker
        thread.

        Why: a hop to a worker thread and back cost 90-100 µs of CPU on a small virtual
        machine (its wake-ups), a read of cached pages 1-2 µs; a dispatcher reads once per
        run of new entries, a tailing consumer's from the page cache. A read answered in
        the loop still lets it run other tasks once, as the hop did: the scans of a
        topic's load (1000 entries a read, no other await between) held the loop for a
        whole ledger of cached pages otherwise (0.8 s for 200,000 small entries)."""
        cached = self.read_cached(first, last)
        if cached is not None:
            await asyncio.sleep(0)  # one turn of the loop, as the hop gave: see the docstring
            return cached
        return await super().read_async(first, last)

    def read_cached(self, first: int, last: int) -> list[bytes] | None:
        """:meth:`read` if every byte of it is in the page cache and they are no more than
        :data:`IN_LOOP_READ_BYTES`; else None, having waited for nothing. ``RWF_NOWAIT``
        (Linux) makes the read fail rather than wait for the disk; where it does not exist,
        or is refused, this is always None.

        Raises:
            as :meth:`read` (bounds, a damaged entry).
        """
        last, start, stop = self._span(first, last)
        if _NOWAIT is None or self._nowait_refused or stop - start > IN_LOOP_READ_BYTES:
            return None
        buffer = bytearray(stop - start)
        try:
            got = os.preadv(self._fd, [buffer], start, _NOWAIT)
        except BlockingIOError:  # not all cached (EAGAIN): the disk would be waited for
            return None
        except OSError as e:  # anything else: the thread's read says what it finds
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                self._nowait_refused = True  # (this file system's: not asked again)
            return None
        if got != len(buffer):
            return None
        return self._decode(memoryview(buffer), first, last)

    def _span(self, first: int, last: int) -> tuple[int, int, int]:
        """``last`` as it can be read (a damaged log ends at its last whole entry), and the
        byte range of ``first..last``.

        Raises:
            IndexError: ``last`` is beyond the log.
            LedgerCorrupted: ``first`` is in or after the damage.
        """
        if last >= self.count:
            if self.damage is None:
                raise IndexError(f"{self.path}: entry {last} is beyond {self.count}")
            if first >= self.count:
                raise LedgerCorrupted(str(self.damage), path=str(self.path))
            last = self.count - 1
        start = self._offsets[first]
        stop = self._offsets[last + 1] if last + 1 < len(self._offsets) else self._end
        return last, start, stop

    def _decode(self, data: memoryview, first: int, last: int) -> list[bytes]:
        """The payloads of entries ``first..last`` from ``data``, their bytes (from the
        offset of ``first`` on), each checked against its checksum.

        Raises:
            LedgerCorrupted: an entry fails its checksum.
        """
        start = self._offsets[first]
        out: list[bytes] = []
        for entry_id in range(first, last + 1):
            payload = decode_entry(data, self._offsets[entry_id] - start, entry_id)
            if payload is None:
                raise LedgerCorrupted(
                    f"{self.path}: entry {entry_id} at offset {self._offsets[entry_id]} "
                    "fails its checksum (damaged after the ledger was opened)",
                    path=str(self.path),
                )
            out.append(bytes(payload))
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class FileLogStorage(LogStorage):
    entry_log: type[FileEntryLog] = FileEntryLog
    """The class of the logs it hands out (bench/ledger.py measures marks against a
    subclass that writes none)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, ledger_name: str) -> Path:
        return self.root / quote(ledger_name, safe="")

    def path(self, ledger_name: str, ledger_id: int) -> Path:
        return self._dir(ledger_name) / f"{ledger_id:016d}.log"

    def where(self, ledger_name: str, ledger_id: int) -> str:
        return str(self.path(ledger_name, ledger_id))

    def exists(self, ledger_name: str, ledger_id: int) -> bool:
        return self.path(ledger_name, ledger_id).exists()

    def verify_identity(self, ledger_name: str, ledger_id: int, nonce: int | None) -> None:
        if nonce is None:
            return
        path = self.path(ledger_name, ledger_id)
        try:
            with path.open("rb") as file:
                header = file.read(HEADER_SIZE)
        except FileNotFoundError:
            return
        check_identity(str(path), header, name=ledger_name, ledger_id=ledger_id, recorded=nonce)

    def create(self, ledger_name: str, ledger_id: int) -> FileEntryLog:
        directory = self._dir(ledger_name)
        path = self.path(ledger_name, ledger_id)
        fd = create_file(path, os.O_RDWR)
        try:
            _lock(fd, path)
            data = _read_all(fd)
            if not is_unused(data):
                # a new ledger id never has entries: this file belongs to ledger metadata
                # that was lost (e.g. a memory:// store restarted). Never destroy it.
                raise LedgerCorrupted(
                    f"{path} already holds data that the ledger metadata does not know; "
                    "refusing to overwrite it",
                    path=str(path),
                )
            # (empty, or a header: a create whose metadata change never happened, or may
            # still: a write whose answer was lost can land late, naming the file by the
            # nonce of its header, which is kept so that the file stays the one it names)
            kept = decode_header(data, ledger_id) if len(data) == HEADER_SIZE else None
            nonce = new_nonce() if kept is None else kept
            os.ftruncate(fd, 0)
            header = encode_header(nonce, ledger_id)
            os.pwrite(fd, header, 0)
            os.fsync(fd)
            _fsync_dir(directory)
        except BaseException:
            os.close(fd)
            raise
        created = self.entry_log(path, ledger_id, fd, array("Q"), len(header), nonce=nonce)
        created.reused = kept is not None
        return created

    def recover(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        tail_bytes: int,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> Recovered:
        path = self.path(ledger_name, ledger_id)
        check_local(placement, str(path))
        fd = self._open(path)
        try:
            os.fdatasync(fd)  # a crashed writer's unsynced pages: durable before we count them
            data = _read_all(fd)
            check_identity(str(path), data, name=ledger_name, ledger_id=ledger_id, recorded=nonce)
            found, truncation, held = recover_tail(
                str(path),
                data,
                ledger_id=ledger_id,
                log_format=log_format,
                tail_bytes=tail_bytes,
            )
            if truncation is not None:
                os.ftruncate(fd, truncation.start)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        entry_log = self.entry_log(path, ledger_id, fd, found.offsets, found.end, nonce=held)
        return Recovered(entry_log, truncation)

    def open(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        entries: int,
        size_bytes: int | None = None,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> FileEntryLog:
        path = self.path(ledger_name, ledger_id)
        check_local(placement, str(path))
        fd = self._open(path)
        try:
            data = _read_all(fd)
            check_identity(str(path), data, name=ledger_name, ledger_id=ledger_id, recorded=nonce)
            checked = check_closed(
                str(path),
                data,
                ledger_id=ledger_id,
                log_format=log_format,
                entries=entries,
                size_bytes=size_bytes,
            )
        except BaseException:
            os.close(fd)
            raise
        return self.entry_log(
            path,
            ledger_id,
            fd,
            checked.found.offsets,
            checked.end,  # reads never touch bytes past the entries recorded at close
            nonce=None,
            damage=checked.damage,
            alteration=checked.alteration,
        )

    def _open(self, path: Path) -> int:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise LedgerMissing(
                f"{path}: the metadata names this ledger; its file is missing",
                paths=(str(path),),
            ) from None
        try:
            _lock(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def delete(self, ledger_name: str, ledger_id: int, placement: Placement = LOCAL) -> None:
        """Remove the log, and its directory if that leaves it empty (idempotent).

        Raises:
            DeleteFailed: the file or the directory could not be removed (it names it): a
                ``LedgerError``, so the deletion it stops is answered as stopped part-way
                (retriable), not as a bug.
        """
        _remove(self.path(ledger_name, ledger_id))

    def delete_unused(self, ledger_name: str, ledger_id: int) -> bool:
        """(See :meth:`LogStorage.delete_unused`.) The file must hold no more than its
        header (a header for ``ledger_id``, or part of one: a create cut short), and is
        removed under its lock, so never while a create or an open log holds it."""
        path = self.path(ledger_name, ledger_id)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # held: a create in flight, or an open log
            data = _read_all(fd)
            whole_header = len(data) == HEADER_SIZE
            if not is_unused(data) or (whole_header and decode_header(data, ledger_id) is None):
                return False
            _remove(path)
        finally:
            os.close(fd)
        return True


def _remove(path: Path) -> None:
    """Unlink a ledger's file (if there), and its directory if that leaves it empty.

    Raises:
        DeleteFailed: as :meth:`FileLogStorage.delete`.
    """
    try:
        path.unlink(missing_ok=True)
        remove_if_empty(path.parent)
    except OSError as e:
        where = e.filename or path
        raise DeleteFailed(
            f"could not delete {where}: {e.strerror or e} (the deletion stopped there; "
            "doing it again once that is fixed goes on)"
        ) from e


CREATE_ATTEMPTS = 8
"""How often :func:`create_file` makes the directory again when a concurrent delete
removed it (each time another delete must empty it between two system calls)."""


def create_file(path: Path, flags: int) -> int:
    """Open ``path`` with ``O_CREAT`` (and ``flags``), making its directory first (synced
    into its parent, so a file synced in it survives a crash); returns the descriptor. A
    delete may remove the directory (:func:`remove_if_empty`) between the ``mkdir`` and
    the ``open``: it is made again.

    Raises:
        FileNotFoundError: the directory vanished :data:`CREATE_ATTEMPTS` times in a row.
    """
    attempts = 0
    while True:
        try:
            path.parent.mkdir(parents=True)
            _fsync_dir(path.parent.parent)
        except FileExistsError:
            pass
        try:
            return os.open(path, flags | os.O_CREAT, 0o644)
        except FileNotFoundError:
            attempts += 1
            if attempts >= CREATE_ATTEMPTS:
                raise


def remove_if_empty(directory: Path) -> bool:
    """Remove ``directory`` if it holds nothing (an ``rmdir``: never a file in it, nor one
    a concurrent create is making, see :func:`create_file`); returns whether it did."""
    try:
        directory.rmdir()
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True


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
