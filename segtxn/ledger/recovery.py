"""Recovery: what reopening a managed ledger after a crash keeps, cuts off, or refuses.

**The crash model.** The group-commit writer appends a batch with ``write()``, then
``fdatasync``, then a small *acknowledgement mark* with ``write()`` (not synced), and only
then resolves the appends of the batch (segtxn/ledger/records.py has the format).

- A **process crash** (SIGKILL, OOM kill, a panic) cannot reorder or lose what ``write()``
  handed to the kernel: the file is every earlier batch and its mark, plus at most a
  *prefix* of the batch being written (a fatal signal can stop a large ``write()`` part
  way), or that batch whole and without its mark. Every acknowledged entry is followed by
  a mark on disk.
- A **power loss** (or kernel crash) keeps what ``fdatasync`` made durable; pages written
  after the last sync may be lost, zeroed or reordered. The last batch may be garbage; the
  one before it is intact but may have lost its mark (marks are made durable by the next
  batch's sync, never by a sync of their own). So at most two batches and a mark
  (``2 * (tail_bytes + MARK_SIZE)``) follow the last durable mark.
- Other damage (a disk error, an operator's tool, a truncated or copied file, a wrong
  volume) is not a crash, and nothing here guesses at it.

**The contract.** When a managed ledger is opened:

1. Every ledger its metadata names must have its file (ledgers are created on disk before
   the metadata names them). A missing one raises ``LedgerMissing`` naming the files: the
   ledger is never recreated empty, so an empty or wrong data directory never serves a
   topic as empty. A file must also be that ledger's: the nonce in its header is the one
   its ``LedgerInfo`` recorded when it was created (:func:`check_identity`: every file's
   header when the ledger is opened, before anything is recovered, and again when a
   closed one is first read, in case it was replaced since); another is
   ``LedgerMismatch``, and the file is left as it is. A foreign older ledger refuses the
   whole ledger, not only reads of it: opened, its readers would stall on it.
2. The last ledger, if a crashed writer was appending to it, is scanned to its end. If
   the first invalid byte (a torn or damaged record, or a torn mark) has a valid mark
   *after* it, acknowledged entries are damaged: ``LedgerCorrupted`` naming the file and
   offset. If it lies after the last mark, it is the interrupted batch: the file is
   truncated there and the managed ledger logs a WARNING with the file, the byte range,
   the first entry id removed and the reason; nothing acknowledged is lost. Bytes after
   the last mark beyond what a crash can leave, or a missing header, are refused. Files
   of format 0 (no marks) keep the older rule: damage within the last ``tail_bytes`` is
   truncated (with the same WARNING), earlier damage is refused.
3. A closed last ledger (a clean close, a seal) must hold exactly the entries recorded
   when it closed; anything less is ``LedgerCorrupted``. Nothing is ever truncated in it.
   One that holds them all but changed after it closed (its final mark cut off, bytes
   after its end) is served as it is, with a WARNING (below).
4. The last ledger is then recorded as closed and a fresh ledger is created (unless
   sealed), in one compare-and-set; a stale owner is fenced (``LedgerFenced``).

Closed ledgers are checked when they are first read (:func:`check_closed`): the entries
before damage are served, and reading the damaged one raises ``LedgerCorrupted`` naming
the file; the managed ledger logs it once, at ERROR. Reads stop where the entries recorded
at close end: the bytes after them are never read, so whatever they hold (even records
that look like later entries) is never served. A file that holds every entry recorded at
close but is not as it was written then (the size recorded at close) has lost nothing: it
is served as it is, never truncated, and the managed ledger logs once, at WARNING, the
file, what was found and where (:class:`~segtxn.ledger.logs.Alteration`). Its final mark
missing (cut off, or zeros where it was) is what a power loss soon after the close can
leave, since no sync follows the last mark; bytes after its end, or other bytes in the
mark's place, no crash leaves: the broker never writes to a closed ledger, so something
else did.

What remains ambiguous, by construction: damage that removes a final mark *and* part of
the batch before it (a file cut by more than a mark's 24 bytes, right after an
acknowledged batch, with no later write) looks exactly like a crash during that batch's
write; it is truncated, with its WARNING. A process crash never produces it. The file
cannot tell, but the cursors can: a subscription that had acknowledged past the end
recovery kept proves those entries were stored and are gone
(:func:`segtxn.ledger.reopen.report_lost`, an ERROR naming how many).

:mod:`segtxn.ledger.reopen` carries out points 1 and 4 for a managed ledger; this module
holds the rules for one file.
"""

from __future__ import annotations

from typing import NamedTuple

from segtxn.ledger.errors import LedgerCorrupted, LedgerMismatch
from segtxn.ledger.logs import Alteration, Truncation
from segtxn.ledger.records import (
    HEADER_SIZE,
    MARK_SIZE,
    Scan,
    decode_header,
    encode_mark,
    find_mark,
    scan,
    written_end,
)

# ----------------------------------------------------------------------- one file


def recover_tail(
    path: str, data: bytes, *, ledger_id: int, log_format: int, tail_bytes: int
) -> tuple[Scan, Truncation | None, int | None]:
    """Decide what to keep of a log a crashed writer was appending to.

    Returns the scan of what is kept, what to truncate (None: nothing) and the file's
    nonce (None for format 0).

    Raises:
        LedgerCorrupted: damage that a crash cannot explain.
    """
    nonce: int | None = None
    start = 0
    if log_format >= 1:
        nonce = decode_header(data, ledger_id)
        if nonce is None:
            raise LedgerCorrupted(
                f"{path}: no valid header for ledger {ledger_id} ({len(data)} bytes); a "
                "header is synced before the ledger is used, so the file was truncated or "
                "overwritten: refusing it",
                path=path,
            )
        start = HEADER_SIZE
    found = scan(data, start=start, nonce=nonce)
    if found.clean:
        return found, None, nonce
    where = f"{path}: {found.problem} at offset {found.end} of {found.size}"
    if nonce is not None:
        later = find_mark(data, found.end, nonce)
        if later is not None:
            raise LedgerCorrupted(
                f"{where}; a mark at offset {later[0]} confirms {later[1]} entries were "
                "acknowledged, so this is damage to acknowledged entries, not an "
                "interrupted write: refusing to drop them (restore the file)",
                path=path,
            )
        unconfirmed = found.size - found.marked_end
        limit = 2 * (tail_bytes + MARK_SIZE)
        if unconfirmed > limit:
            raise LedgerCorrupted(
                f"{where}; the last acknowledgement mark ends at offset {found.marked_end}, "
                f"{unconfirmed} bytes before the end: more than a crash leaves unconfirmed "
                f"({limit}), so entries there may have been acknowledged: refusing",
                path=path,
            )
        reason = (
            f"{found.problem}, after the last acknowledgement mark (offset "
            f"{found.marked_end}, {found.marked_entries} entries acknowledged): taken for "
            "the tail of a write that was interrupted before it was acknowledged"
        )
    else:
        if found.size - found.end > tail_bytes:
            raise LedgerCorrupted(
                f"{where}, before the last {tail_bytes} bytes a crash can tear (a format-0 "
                "file, without acknowledgement marks): refusing",
                path=path,
            )
        reason = (
            f"{found.problem}, within the last {tail_bytes} bytes of a format-0 file "
            "(written before acknowledgement marks): taken for the batch a crash interrupted"
        )
    return found, Truncation(path, found.end, found.size, found.count, reason), nonce


def check_identity(
    path: str, data: bytes, *, name: str, ledger_id: int, recorded: int | None
) -> None:
    """Check that a file is the ledger its metadata names: the nonce in its header is the
    one ``recorded`` in its ``LedgerInfo`` when it was created (None: not recorded, as in
    records written before it was kept; nothing to check). Done before anything else
    reads or changes the file, so a foreign file is neither served nor truncated. A
    missing or damaged header is not decided here (the checks after this refuse it).

    Raises:
        LedgerMismatch: the header holds another nonce (another cluster's volume, or a
            restored copy of another incarnation of the topic).
    """
    if recorded is None:
        return
    found = decode_header(data, ledger_id)
    if found is None or found == recorded:
        return
    raise LedgerMismatch(
        f"{name}: {path} is not the file of its ledger {ledger_id}: its header's nonce is "
        f"{found:#018x}, and the metadata recorded {recorded:#018x} when the ledger was "
        "created. It belongs to another cluster's volume, or to another incarnation of the "
        "topic (a restored copy): refusing to serve it (it is left as it is). Mount the "
        "right volume or restore the right files",
        path=path,
        recorded=recorded,
        found=found,
    )


class Checked(NamedTuple):
    """A closed log as :func:`check_closed` found it."""

    found: Scan
    """Its scan, limited to the readable entries (at most the count recorded at close)."""
    end: int
    """Where those entries end (past the mark after the last, if it is there): reads never
    go further."""
    damage: LedgerCorrupted | None
    """Entries recorded at close that cannot be read (None: all can)."""
    alteration: Alteration | None
    """How a file that holds all of them changed since it closed (None: it did not)."""


def check_closed(
    path: str,
    data: bytes,
    *,
    ledger_id: int,
    log_format: int,
    entries: int,
    size_bytes: int | None = None,
) -> Checked:
    """Check a closed log against the ``entries`` (and ``size_bytes``, None: not recorded)
    recorded when it closed."""
    nonce: int | None = None
    start = 0
    if log_format >= 1:
        nonce = decode_header(data, ledger_id)
        if nonce is None:
            empty = scan(b"", start=0, nonce=None)
            return Checked(
                empty,
                0,
                LedgerCorrupted(
                    f"{path}: no valid header for ledger {ledger_id} ({len(data)} bytes): "
                    f"none of its {entries} entries can be read",
                    path=path,
                ),
                None,
            )
        start = HEADER_SIZE
    found = scan(data, start=start, nonce=nonce)
    beyond = found.count - entries  # valid records past the count: never served
    del found.offsets[entries:]
    end, marked = written_end(data, found.offsets, start=start, nonce=nonce)
    if found.count >= entries:
        what = _changed(
            data,
            end,
            marked=marked,
            nonce=nonce,
            size_bytes=size_bytes,
            entries=entries,
            beyond=beyond,
        )
        alteration = None if what is None else Alteration(path, ledger_id, entries, *what)
        return Checked(found, end, None, alteration)
    if not found.clean:
        why = f"{found.problem} at offset {found.end}"
    else:
        why = f"the file ends after {found.count} entries ({found.size} bytes; truncated)"
    damage = LedgerCorrupted(
        f"{path}: {why}; {entries} entries were recorded when this ledger closed: entries "
        f"{found.count}..{entries - 1} cannot be read",
        path=path,
    )
    return Checked(found, end, damage, None)


_MARK_LOST = (
    "A power loss soon after it closed can do this (a ledger's final mark is never synced "
    "by itself), and so can a tool or a copy"
)
_CHANGED = (
    "The broker never writes to a closed ledger: a tool, a copy, another volume or the "
    "disk changed it"
)
_WRITTEN_TO = (
    "The broker never writes to a closed ledger, and no crash adds bytes to one: a tool, a "
    "copy, another volume or the disk wrote them"
)


def _changed(
    data: bytes,
    end: int,
    *,
    marked: bool,
    nonce: int | None,
    size_bytes: int | None,
    entries: int,
    beyond: int,
) -> tuple[str, str] | None:
    """What changed in a closed file whose ``entries`` all end at ``end`` (``marked``: a
    valid mark follows the last), and what can have done it; None when it is as it was
    written: ``size_bytes`` long (when recorded), nothing after its entries and mark."""
    size = len(data)
    recorded = "" if size_bytes is None else f" (it had {size_bytes} bytes when it closed)"
    what = ""
    if nonce is not None and entries > 0 and not marked and size_bytes == end + MARK_SIZE:
        # it closed with a mark after its last entry, which is not there now
        mark = encode_mark(nonce, end, entries)
        tail = data[end:]
        if len(tail) < MARK_SIZE and mark.startswith(tail):
            left = f" ({len(tail)} of its {MARK_SIZE} bytes left)" if tail else ""
            found = f"the file ends at byte {size}{left}"
        elif len(tail) <= MARK_SIZE and all(b in (0, m) for b, m in zip(tail, mark, strict=False)):
            held = "zeros" if not any(tail) else "zeros and parts of it"
            found = f"bytes {end}..{size} hold {held}"  # (the pages a power loss lost)
        else:
            found = ""
        if found:
            what = f"its final acknowledgement mark (offset {end}) is missing: {found}"
            return what + recorded, _MARK_LOST
        what = f"its final acknowledgement mark (offset {end}) is missing, and "
    if size == end:
        if size_bytes in (None, end):
            return None
        return f"its entries end at offset {end}{recorded}", _CHANGED
    after = "its last entry and its mark" if marked else "its last entry"
    had = "" if size_bytes is None else f"; it had {size_bytes} bytes when it closed"
    what += (
        f"{size - end} unexpected bytes follow {after}, at offset {end} (bytes {end}..{size}{had})"
    )
    if beyond > 0:
        what += (
            f", holding records of entries {entries}..{entries + beyond - 1}, past the "
            f"{entries} recorded (never served)"
        )
    return what, _WRITTEN_TO
