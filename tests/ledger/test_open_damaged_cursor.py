"""An open that meets a cursor record it cannot read refuses the ledger, naming the record,
and closes the ledger it had opened.

``ManagedLedger.open`` restores the cursors from their records after it has opened the
ledger (its writer running, its new ledger's file open). A record that does not decode
(written by hand, by another version, damaged) raised msgspec's bare ``DecodeError``, which
named no cursor, and the ledger it had opened was left open: its writer task and files
outlived the failed open, and its last ledger was never closed in the metadata. It now
raises ``CursorDamaged`` (a ``LedgerCorrupted``: the broker refuses the topic) naming the
record's key, and the ledger is closed first (its clean close recorded, its writer gone).

Real components: the in-memory store, file-backed and in-memory logs.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from segtxn.ledger import LedgerSettings, LogStorage, ManagedLedger
from segtxn.ledger.cursor import CursorState, cursor_key
from segtxn.ledger.errors import CursorDamaged, LedgerCorrupted
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.metastore import MetadataStore

NAME = "persistent://t/n/damaged-cursor"

UNREADABLE = {
    "not JSON": b"{not json",
    "another shape": msgspec.json.encode({"mark_delete": "3:4"}),
    "a range of three numbers": msgspec.json.encode(CursorState((0, 1), [[0, 3, 0]])),
}


def writers_of(name: str) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"ledger-writer-{name}"]


@pytest.mark.parametrize("value", UNREADABLE.values(), ids=UNREADABLE.keys())
async def test_an_unreadable_cursor_record_refuses_the_open_and_closes_the_ledger(
    store: MetadataStore, storage: LogStorage, value: bytes
) -> None:
    first = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    await first.open_cursor("good")
    await first.close()
    key = cursor_key(NAME, "sub/damaged")
    await store.put(key, value)

    with pytest.raises(CursorDamaged) as refused:
        await ManagedLedger.open(NAME, store, storage, LedgerSettings())

    assert isinstance(refused.value, LedgerCorrupted)
    assert refused.value.key == key and key in str(refused.value), refused.value
    assert refused.value.cursor == "sub/damaged", refused.value
    assert str(refused.value).startswith(f"{NAME}: the record of its cursor 'sub/damaged'")
    assert writers_of(NAME) == [], "the failed open's writer outlived it"
    record = await store.get(metadata_key(NAME))
    assert record is not None
    assert decode(record.value).ledgers[-1].entries == 0, "its ledger was not closed"

    await store.delete(key)  # the operator removes it: the ledger opens again
    again = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    assert set(again.cursors) == {"good"}
    await again.close()


async def test_a_cursor_record_made_meanwhile_that_does_not_read_is_named_too(
    store: MetadataStore, storage: LogStorage
) -> None:
    """``open_cursor`` takes up a record that a create whose answer was lost had made: one
    that does not read is refused the same way, the ledger left open."""
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    try:
        key = cursor_key(NAME, "late")
        await store.put(key, UNREADABLE["not JSON"])
        with pytest.raises(CursorDamaged, match="cursor 'late'") as refused:
            await ledger.open_cursor("late")
        assert refused.value.key == key
        assert "late" not in ledger.cursors
    finally:
        await ledger.close()
