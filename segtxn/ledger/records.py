"""The on-disk format of a file-backed ledger: a header, entry records, acknowledgement marks.

All integers are big-endian. A file (format 1) is::

    header | entry records and marks, in the order they were written

- **Header** (24 bytes, written and fsynced when the file is created, before the metadata
  names the ledger): ``u32 HEADER_TAG | u32 crc32(nonce ‖ ledger_id) | u64 nonce |
  u64 ledger_id``. The nonce is random per file: marks are checksummed with it, so bytes
  inside a payload can never pass for a mark.
- **Entry record**: ``u32 length | u32 crc32(entry_id ‖ payload) | u64 entry_id | payload``
  (``length`` < 2**30). The CRC covers the entry id, so a record found at the wrong place
  fails like a flipped bit. Entry ids count from 0 without gaps.
- **Mark** (24 bytes): ``u32 MARK_TAG | u32 crc32(nonce ‖ offset ‖ entries) | u64 offset |
  u64 entries``. Written after a group-commit batch's ``fdatasync`` returned and before any
  of its entries is acknowledged: everything before ``offset`` (the mark's own place) was
  durable, and the first ``entries`` entries were acknowledged or about to be. It is not
  synced by itself; the next batch's ``fdatasync`` makes it durable (segtxn/ledger/recovery.py
  says what that means after a crash).

Tags have the top bit set, so no tag is a valid entry length. Files written before the
format had a header and marks (format 0, ``LedgerInfo.format``) hold entry records only.
"""

from __future__ import annotations

import os
import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

ENTRY = struct.Struct(">IIQ")
CONTROL = struct.Struct(">IIQQ")
HEADER_TAG = 0xC5E6_0001
MARK_TAG = 0xC5E6_0002
HEADER_SIZE = CONTROL.size
MARK_SIZE = CONTROL.size
ENTRY_OVERHEAD = ENTRY.size
MAX_RECORD_BYTES = 1 << 30
FORMAT = 1
"""The format new ledgers are written in (0: entry records only, no header, no marks)."""
_MARK_BYTES = MARK_TAG.to_bytes(4, "big")
_HEADER_BYTES = HEADER_TAG.to_bytes(4, "big")


def _entry_crc(entry_id: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(entry_id.to_bytes(8, "big")))


def _control_crc(nonce: int, a: int, b: int) -> int:
    return zlib.crc32(struct.pack(">QQQ", nonce, a, b))


def new_nonce() -> int:
    return int.from_bytes(os.urandom(8), "big")


def encode_header(nonce: int, ledger_id: int) -> bytes:
    return CONTROL.pack(HEADER_TAG, _control_crc(nonce, nonce, ledger_id), nonce, ledger_id)


def decode_header(data: bytes | memoryview, ledger_id: int) -> int | None:
    """The nonce of a valid header for ``ledger_id`` at the start of ``data``, else None."""
    if len(data) < HEADER_SIZE:
        return None
    tag, crc, nonce, stored_id = CONTROL.unpack_from(data, 0)
    if tag != HEADER_TAG or stored_id != ledger_id or crc != _control_crc(nonce, nonce, stored_id):
        return None
    return int(nonce)


def is_unused(data: bytes) -> bool:
    """Whether a file holds nothing but (part of) a header: a create that crashed, or whose
    metadata change never happened. Such a file holds no entry and may be reused."""
    return len(data) <= HEADER_SIZE and _HEADER_BYTES.startswith(data[:4])


def encode_mark(nonce: int, offset: int, entries: int) -> bytes:
    return CONTROL.pack(MARK_TAG, _control_crc(nonce, offset, entries), offset, entries)


def encode_records(first_id: int, payloads: Sequence[bytes]) -> bytes:
    parts: list[bytes] = []
    for i, payload in enumerate(payloads):
        entry_id = first_id + i
        parts.append(ENTRY.pack(len(payload), _entry_crc(entry_id, payload), entry_id))
        parts.append(payload)
    return b"".join(parts)


def decode_entry(data: bytes | memoryview, pos: int, entry_id: int) -> memoryview | None:
    """The payload of entry ``entry_id`` if a valid record of it starts at ``pos``."""
    view = memoryview(data)
    if pos + ENTRY.size > len(view):
        return None
    length, crc, stored_id = ENTRY.unpack_from(view, pos)
    end = pos + ENTRY.size + length
    if stored_id != entry_id or length >= MAX_RECORD_BYTES or end > len(view):
        return None
    payload = view[pos + ENTRY.size : end]
    return payload if _entry_crc(entry_id, payload) == crc else None


@dataclass
class Scan:
    """What a file holds, read from the start up to the first record that is not valid."""

    offsets: array[int]
    """Where each valid entry record starts (entry ``i`` at ``offsets[i]``)."""
    end: int
    """Where validity ends: the file's size when nothing is wrong."""
    size: int
    marked_end: int = 0
    """The end of the last valid mark (or of the header, or 0 without one)."""
    marked_entries: int = 0
    """The entries that mark confirms."""
    problem: str = ""
    """Why the scan stopped before ``size`` (empty when it did not)."""

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def clean(self) -> bool:
        return self.end == self.size


def scan(data: bytes, *, start: int, nonce: int | None) -> Scan:
    """Scan records from ``start``; ``nonce`` None: a format-0 file (no marks)."""
    view = memoryview(data)
    size = len(view)
    result = Scan(array("Q"), start, size, marked_end=start)
    pos = start
    while pos < size:
        if pos + ENTRY.size > size:
            result.problem = f"an incomplete record header ({size - pos} bytes)"
            break
        word = ENTRY.unpack_from(view, pos)[0]
        if word == MARK_TAG and nonce is not None:
            if pos + MARK_SIZE > size:
                result.problem = f"an incomplete mark ({size - pos} of {MARK_SIZE} bytes)"
                break
            if not _is_mark(view, pos, nonce, result.count):
                result.problem = "a mark that fails its checksum or names the wrong place"
                break
            pos += MARK_SIZE
            result.marked_end, result.marked_entries = pos, result.count
            continue
        length, _, stored_id = ENTRY.unpack_from(view, pos)
        if length >= MAX_RECORD_BYTES:
            result.problem = f"an unknown record (first word {word:#010x})"
            break
        if pos + ENTRY.size + length > size:
            result.problem = (
                f"an incomplete record (entry {stored_id}: {size - pos - ENTRY.size} of "
                f"{length} payload bytes)"
            )
            break
        if decode_entry(view, pos, result.count) is None:
            result.problem = f"entry {result.count} fails its checksum"
            break
        result.offsets.append(pos)
        pos += ENTRY.size + length
    result.end = pos
    return result


def written_end(
    data: bytes, offsets: Sequence[int], *, start: int, nonce: int | None
) -> tuple[int, bool]:
    """Where the entry records at ``offsets`` (valid ones, as :func:`scan` found them) end,
    past the mark that follows the last of them if a valid one does (``start``, the end
    of the header, without entries); and whether that mark is there. This is where a
    closed ledger's file ended when it closed, unless it was closed by a recovery that
    kept a batch without its mark."""
    end = start
    if offsets:
        end = offsets[-1] + ENTRY.size + ENTRY.unpack_from(data, offsets[-1])[0]
    marked = bool(
        offsets
        and nonce is not None
        and end + MARK_SIZE <= len(data)
        and _is_mark(memoryview(data), end, nonce, len(offsets))
    )
    return (end + MARK_SIZE if marked else end), marked


def _is_mark(view: memoryview, pos: int, nonce: int, entries_before: int) -> bool:
    tag, crc, offset, entries = CONTROL.unpack_from(view, pos)
    return bool(
        tag == MARK_TAG
        and offset == pos
        and entries == entries_before
        and crc == _control_crc(nonce, offset, entries)
    )


def find_mark(data: bytes, after: int, nonce: int) -> tuple[int, int] | None:
    """The first valid mark that starts after ``after`` (its offset and entry count),
    searched byte by byte past damage. A mark is checked against its own offset and the
    file's nonce, never against the entries before it (they cannot be counted past the
    damage)."""
    view = memoryview(data)
    pos = data.find(_MARK_BYTES, after + 1)
    while pos >= 0 and pos + MARK_SIZE <= len(data):
        _, crc, offset, entries = CONTROL.unpack_from(view, pos)
        if offset == pos and crc == _control_crc(nonce, offset, entries):
            return pos, int(entries)
        pos = data.find(_MARK_BYTES, pos + 1)
    return None
