"""Repairing a cursor whose record does not read, without opening its ledger.

A cursor's record (``/managed-cursors/<ledger>/<cursor>``, :mod:`segtxn.ledger.cursor`)
that does not decode makes every open of its ledger fail with :class:`CursorDamaged`: the
broker refuses the topic (``PersistenceError``), so the ledger cannot be opened to seek
the cursor. :func:`repair_cursor` writes a readable record in its place from the store
alone, as :mod:`segtxn.ledger.sealed` reads a ledger without opening it; the next open
then restores the cursor from it.

**Nothing acknowledged-but-unconsumed is lost.** What the damaged record said is unknown,
so the repaired cursor starts at the ledger's first retained entry (its first retained
ledger's entry 0, from the metadata record): every entry still retained is delivered
again (at-least-once), none is skipped. An operator who knows better gives the position
of the next entry to deliver instead (at most the end of what the metadata records, so no
entry not yet written is hidden). The record replaced is returned (and its bytes logged)
for the operator to look at.

**Only a damaged record is replaced**, and only that very version of it: the write is a
compare-and-set on the version read. A record that reads is refused
(:class:`CursorReadable`: seek it through its open ledger, the subscription's reset); a
missing one is :class:`CursorNotFound`; one changed since it was read (its owner, or
another repair, wrote it) is :class:`CursorChanged`, never overwritten. The ledger's own
record is not written: while the cursor's record does not read no broker can have the
ledger open with that cursor (an open fails on it), and a broker that had it open before
the damage finds its next save of the cursor refused by the version this write moves
(its owner must unload it first: the broker's endpoint does; if it did not, that refused
save, finding a record that reads, raises ``CursorOverwritten`` and stops the ledger, and
the broker loads it again from the repaired record).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from segtxn.ledger.cursor import CursorState, cursor_key, read_state
from segtxn.ledger.errors import CursorDamaged, LedgerCorrupted, LedgerError
from segtxn.ledger.metadata import LedgerMetadata, decode, metadata_key
from segtxn.ledger.position import Position
from segtxn.metastore import BadVersion, MetadataStore, NotFound

log = logging.getLogger(__name__)

SHOWN_BYTES = 256
"""How many bytes of a replaced record the log line shows."""


class LedgerNotFound(LedgerError):
    """The ledger has no metadata record: it was never opened (it has no cursor)."""


class CursorNotFound(LedgerError):
    """The cursor has no record: there is no such subscription."""


class CursorReadable(LedgerError):
    """The cursor's record reads: nothing to repair (move it through its open ledger). It
    may have been repaired already: a repair whose write landed and whose answer was lost
    is seen so by the next one, and the message says it."""


class CursorChanged(LedgerError):
    """The cursor's record changed between its read and the repair's write (its owner or
    another repair wrote it): nothing was written."""


class TargetBeyondEnd(LedgerError):
    """The position asked for lies past what the ledger's metadata records: starting
    there could hide entries not yet written or not yet counted."""


@dataclass(frozen=True)
class RepairedCursor:
    """What :func:`repair_cursor` wrote, and what it replaced."""

    key: str
    """The cursor's record."""
    next_position: Position
    """The first entry the subscription is delivered (again) from."""
    reason: str
    """Why the replaced record did not read (the decoder's words)."""
    replaced: bytes
    """The replaced record's value."""
    version: int
    """The version of the record written."""


async def repair_cursor(
    store: MetadataStore, ledger: str, cursor: str, *, start: Position | None = None
) -> RepairedCursor:
    """Replace the damaged record of ``ledger``'s cursor ``cursor`` with one whose next
    entry is ``start`` (None: the first retained entry), by compare-and-set on the
    damaged record's version. The ledger must not be open (the caller's duty: its owner
    unloads it first).

    Raises:
        LedgerNotFound: the ledger has no metadata record.
        LedgerCorrupted: its metadata record does not read (the message names its key).
        CursorNotFound: the cursor has no record.
        CursorReadable: the record reads (nothing written).
        TargetBeyondEnd: ``start`` lies past the end the metadata records.
        CursorChanged: the record changed since it was read (nothing written).
        MetadataStoreError: the store failed (the write may have landed: repairing again
            is then refused with :class:`CursorReadable`, which says it may have).
    """
    meta = await _metadata(store, ledger)
    key = cursor_key(ledger, cursor)
    record = await store.get(key)
    if record is None:
        raise CursorNotFound(f"{ledger}: no subscription {cursor!r} (no record at {key})")
    try:
        read_state(ledger, cursor, record)
    except CursorDamaged as e:
        reason = e.reason
    else:
        raise CursorReadable(
            f"{ledger}: the record of its cursor {cursor!r} at {key} reads correctly now: "
            "nothing to repair (it may already have been repaired, by a repair whose answer "
            "was lost); if the subscription's position is wrong, reset the subscription: "
            f"{_reset_command(ledger, cursor)}"
        )
    first = _first_retained(meta) if start is None else _checked(ledger, cursor, meta, start)
    state = CursorState((first.ledger_id, first.entry_id - 1))
    try:
        written = await store.put(key, msgspec.json.encode(state), expected_version=record.version)
    except (BadVersion, NotFound) as e:
        raise CursorChanged(
            f"{ledger}: the record of its cursor {cursor!r} at {key} changed while it was "
            "being repaired (its broker or another repair wrote it): nothing written; "
            "look at it again"
        ) from e
    log.warning(
        "%s: repaired the record of its cursor %r at %s: its subscription starts again at "
        "%s; the record replaced (%d bytes, version %d) began %r",
        ledger, cursor, key, first, len(record.value), record.version,
        record.value[:SHOWN_BYTES],
    )  # fmt: skip
    return RepairedCursor(key, first, reason, record.value, written.version)


async def cursor_damage(store: MetadataStore, ledger: str, cursor: str) -> str | None:
    """Why the record of ``ledger``'s cursor ``cursor`` does not read; None if it reads
    or there is none."""
    record = await store.get(cursor_key(ledger, cursor))
    try:
        if record is not None:
            read_state(ledger, cursor, record)
    except CursorDamaged as e:
        return e.reason
    return None


async def _metadata(store: MetadataStore, ledger: str) -> LedgerMetadata:
    key = metadata_key(ledger)
    record = await store.get(key)
    if record is None:
        raise LedgerNotFound(f"{ledger}: no ledger (no record at {key}): it has no cursor")
    try:
        return decode(record.value)
    except msgspec.DecodeError as e:
        raise LedgerCorrupted(f"{ledger}: its metadata record at {key} does not read ({e})") from e


def _first_retained(meta: LedgerMetadata) -> Position:
    """Entry 0 of the first retained ledger (where the next is to be, with none):
    everything retained comes after it (ledgers are trimmed whole)."""
    return Position(meta.ledgers[0].id if meta.ledgers else meta.next_ledger_id, 0)


def _reset_command(ledger: str, cursor: str) -> str:
    """The command that resets ``ledger``'s subscription ``cursor`` (a topic's or
    segment's ledger is named as the topic or segment is), for an operator told to."""
    return (
        f"segtxn topics reset-subscription {ledger} {cursor} "
        "--to-earliest|--to-latest|--to LEDGER:ENTRY"
    )


def _checked(ledger: str, cursor: str, meta: LedgerMetadata, start: Position) -> Position:
    """``start``, if it lies at or before the end the metadata records: just after its last
    ledger's last entry when that ledger is closed; its entry 0 when it is still open (a
    crash left it so: its entries are counted when the ledger opens next)."""
    if not meta.ledgers:
        end = Position(meta.next_ledger_id, 0)
    else:
        last = meta.ledgers[-1]
        end = Position(last.id, last.entries or 0)
    if start > end:
        raise TargetBeyondEnd(
            f"{ledger}: {start} is beyond the end its metadata records ({end}): it could hide "
            "entries; repair to the earliest, then reset the loaded subscription: "
            f"{_reset_command(ledger, cursor)}"
        )
    return start
