"""Retention against what the cursors' *saved* state needs, not only what memory says.

A restart restores every cursor from the store, so a trim must keep each entry that a
cursor's saved state (or a save that may have landed) counts as unacknowledged, whatever the
cursor in memory acknowledged since; and a cursor saved ahead of a trim resumes where it
was saved, nothing acknowledged delivered again.

Real components: a real etcd (wrapped by the fault injector where a save has to fail on
purpose), ledger files in ``tmp_path``, and a "restart" that opens new objects over the same
directory and store.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from segtxn.ledger import (
    FileLogStorage,
    LedgerError,
    LedgerSettings,
    ManagedCursor,
    ManagedLedger,
    Position,
    RetentionPolicy,
)
from segtxn.ledger.cursor import CURSORS_PREFIX, CursorState, cursor_key
from segtxn.metastore import MetadataStore, MetadataStoreError, StoreUnavailable, open_store
from segtxn.metastore.faults import FaultInjector
from tests.ledger.test_ledger_edges import etcd_url, faults  # noqa: F401 (a fixture)

NAME = "persistent://t/n/trim"
AT_ONCE = RetentionPolicy(retention_time_s=0)
"""Delete a ledger as soon as every cursor has consumed it."""


@contextlib.asynccontextmanager
async def opened(
    url: str, data_dir: Path, *, faulty: bool = False
) -> AsyncIterator[tuple[ManagedLedger, MetadataStore]]:
    """The managed ledger ``NAME`` over the files in ``data_dir`` and the store at ``url``
    (new objects each time: a restart). Closed after, unless the test closed the ledger
    itself (as a dying owner, its saves failing), then the store."""
    store = open_store(url, wrap=FaultInjector if faulty else None)
    try:
        ledger = await ManagedLedger.open(NAME, store, FileLogStorage(data_dir), LedgerSettings())
        try:
            yield ledger, store
        finally:
            if not ledger.is_closing:  # the test failed before its own close: its
                # failure is the one to see, not a save this ledger can no longer make
                if faulty:
                    faults(store).clear()
                with contextlib.suppress(LedgerError, MetadataStoreError):
                    await ledger.close()
    finally:
        await store.close()


async def two_closed_ledgers(ledger: ManagedLedger) -> tuple[list[Position], list[Position]]:
    """Three entries in each of two closed ledgers (the next one is being appended to)."""
    first = [await ledger.append(b"a%d" % i) for i in range(3)]
    await ledger.roll_over()
    second = [await ledger.append(b"b%d" % i) for i in range(3)]
    await ledger.roll_over()
    return first, second


async def unacknowledged(ledger: ManagedLedger, cursor: ManagedCursor) -> list[Position]:
    """The entries after ``cursor``'s mark that it has not acknowledged, as a dispatcher
    starting from it would deliver them."""
    after = ledger.position_after(cursor.mark_delete)
    entries = await ledger.read(after, max_entries=100) if after is not None else []
    return [e.position for e in entries if not cursor.is_acked(e.position)]


async def test_a_trim_keeps_what_a_cursors_saved_state_still_needs(
    etcd_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Acknowledgments move the mark past a ledger boundary, but their save fails (the
    store refuses cursor writes); a trim, and the process dies before any save lands. The
    cursor comes back from its saved state, so the entries after that state are
    unacknowledged again and must still be there to be delivered again: the trim chose by
    the mark in memory and deleted both ledgers, and they were lost."""
    data_dir = tmp_path / "ledgers"
    async with opened(etcd_url, data_dir, faulty=True) as (ledger, store):
        cursor = await ledger.open_cursor("sub", start="earliest")
        first, second = await two_closed_ledgers(ledger)
        await cursor.ack([first[0]])  # saved
        faults(store).fail("txn", key_prefix=CURSORS_PREFIX, times=None)
        with pytest.raises(StoreUnavailable):
            await cursor.ack_cumulative(second[-1])
        assert cursor.mark_delete == second[-1]  # in memory, not saved
        await ledger.trim(AT_ONCE)
        with pytest.raises(StoreUnavailable):  # its last save fails too: the owner dies
            await ledger.close()

    async with opened(etcd_url, data_dir) as (reopened, _):
        restored = reopened.cursors["sub"]
        assert restored.mark_delete == first[0]  # what the store held
        assert await unacknowledged(reopened, restored) == [*first[1:], *second]
        entries = await reopened.read(first[1], max_entries=5)
        assert [e.payload for e in entries] == [b"a1", b"a2", b"b0", b"b1", b"b2"]
        # ...and once a save holds the acknowledgment, the trim lets them go
        await restored.ack_cumulative(second[-1])
        trimmed = await reopened.trim(AT_ONCE)
        assert trimmed.ledgers[:2] == [first[0].ledger_id, second[0].ledger_id]


async def test_a_save_whose_outcome_is_unknown_holds_data_back_as_if_it_landed(
    etcd_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A seek back's save lands but its answer is lost, and reading the record back fails
    too: the store may hold that lower mark, so the last save known to have landed (ahead
    of it) is not what a restart would restore, and a trim must keep what the lower mark
    needs even once memory has moved past it again."""
    data_dir = tmp_path / "ledgers"
    async with opened(etcd_url, data_dir, faulty=True) as (ledger, store):
        cursor = await ledger.open_cursor("sub", start="earliest")
        first, second = await two_closed_ledgers(ledger)
        await cursor.ack_cumulative(second[-1])  # saved: every entry consumed
        injected = faults(store)
        injected.fail("txn", key_prefix=CURSORS_PREFIX, after_apply=True)  # lands, no answer
        injected.fail("range", key_prefix=CURSORS_PREFIX, times=None)  # nor a read-back
        with pytest.raises(StoreUnavailable):
            await cursor.seek(first[1])
        injected.fail("txn", key_prefix=CURSORS_PREFIX, times=None)
        with pytest.raises(StoreUnavailable):
            await cursor.ack_cumulative(second[-1])  # memory is where the last save was
        assert (await ledger.trim(AT_ONCE)).ledgers == []
        assert cursor.persisted_mark_delete == first[0]
        with pytest.raises(StoreUnavailable):
            await ledger.close()

    async with opened(etcd_url, data_dir) as (reopened, _):
        restored = reopened.cursors["sub"]
        assert restored.mark_delete == first[0]  # the seek's save had landed
        assert await unacknowledged(reopened, restored) == [*first[1:], *second]


async def test_a_cursor_saved_ahead_of_a_trim_resumes_where_it_was_saved(
    etcd_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """After a trim and a crash, a cursor saved ahead of what was trimmed delivers again
    only what its save did not hold (an acknowledgment whose save failed): nothing the save
    held, individual acknowledgments beyond the mark included, and nothing trimmed."""
    data_dir = tmp_path / "ledgers"
    async with opened(etcd_url, data_dir, faulty=True) as (ledger, store):
        cursor = await ledger.open_cursor("sub", start="earliest")
        first, second = await two_closed_ledgers(ledger)
        third = [await ledger.append(b"c%d" % i) for i in range(2)]
        await cursor.ack_cumulative(second[0])
        await cursor.ack([second[2], third[1]])  # saved, beyond the mark
        assert (await ledger.trim(AT_ONCE)).ledgers == [first[0].ledger_id]
        faults(store).fail("txn", key_prefix=CURSORS_PREFIX, times=None)
        with pytest.raises(StoreUnavailable):
            await cursor.ack([second[1]])
        assert cursor.mark_delete == second[2]  # in memory: the second ledger consumed
        assert (await ledger.trim(AT_ONCE)).ledgers == []  # not by the saved state
        with pytest.raises(StoreUnavailable):
            await ledger.close()

    async with opened(etcd_url, data_dir) as (reopened, _):
        restored = reopened.cursors["sub"]
        assert restored.mark_delete == second[0]
        assert await unacknowledged(reopened, restored) == [second[1], third[0]]
        assert reopened.first_position() == second[0]


async def test_a_cursor_whose_delete_failed_still_holds_its_data_back(
    etcd_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Deleting a cursor forgot it in memory before its record was deleted: when the store
    refused that delete, the record (restored by the next open) no longer held anything
    back, a trim deleted what it had not consumed, and a retry of the delete found no
    such cursor. Until its record is gone the cursor counts, and subscribing again takes
    up the state the store holds."""
    data_dir = tmp_path / "ledgers"
    async with opened(etcd_url, data_dir, faulty=True) as (ledger, store):
        gone = await ledger.open_cursor("gone", start="earliest")
        kept = await ledger.open_cursor("kept", start="earliest")
        first, second = await two_closed_ledgers(ledger)
        await kept.ack_cumulative(second[-1])
        await gone.ack([first[0]])
        faults(store).fail("txn", key_prefix=CURSORS_PREFIX)  # the record's delete
        with pytest.raises(StoreUnavailable):
            await ledger.delete_cursor("gone")
        assert (await ledger.trim(AT_ONCE)).ledgers == []
        again = await ledger.open_cursor("gone")
        assert again.mark_delete == first[0]  # the state its record holds
        await again.ack([first[1]])
        await ledger.close()

    async with opened(etcd_url, data_dir) as (reopened, _):
        restored = reopened.cursors["gone"]
        assert await unacknowledged(reopened, restored) == [first[2], *second]
        await reopened.delete_cursor("gone")
        assert (await reopened.trim(AT_ONCE)).ledgers[:2] == [
            first[0].ledger_id,
            second[0].ledger_id,
        ]


async def test_a_cursor_saved_with_acks_in_ledgers_since_trimmed_moves_on(
    etcd_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A store written before trims kept what saved cursors need may hold a cursor whose
    mark and individual acknowledgments lie in ledgers since deleted. Its mark must move
    on once the entries after the gap are acknowledged: it stayed before the gap for good
    (the acknowledged range in the deleted ledger never touched the next retained entry),
    so its backlog was wrong and nothing after it could ever be trimmed again."""
    data_dir = tmp_path / "ledgers"
    async with opened(etcd_url, data_dir) as (ledger, store):
        cursor = await ledger.open_cursor("sub", start="earliest")
        first, second = await two_closed_ledgers(ledger)
        await cursor.ack_cumulative(first[-1])
        assert (await ledger.trim(AT_ONCE)).ledgers == [first[0].ledger_id]
        await ledger.close()
        # as the old trim left it: saved before acknowledging first[1], trimmed after
        legacy = CursorState(first[0].as_pair(), [[*first[2].as_pair(), *first[2].as_pair()]])
        await store.put(cursor_key(NAME, "sub"), msgspec.json.encode(legacy))

    async with opened(etcd_url, data_dir) as (reopened, _):
        restored = reopened.cursors["sub"]
        await restored.ack(second)
        assert restored.mark_delete == second[-1]
        assert restored.backlog() == 0
        assert (await reopened.trim(AT_ONCE)).ledgers[:1] == [second[0].ledger_id]


async def test_a_save_that_landed_unknown_does_not_fence_the_cursor_itself(
    etcd_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A save lands, but its answer and the read-back that would tell are both lost. The
    next save then finds the record a version ahead, written by this cursor itself: it
    took that for another owner's change (LedgerFenced), and every save after it failed
    the same way until the ledger was opened again."""
    async with opened(etcd_url, tmp_path / "ledgers", faulty=True) as (ledger, store):
        cursor = await ledger.open_cursor("sub", start="earliest")
        p = [await ledger.append(b"s%d" % i) for i in range(3)]
        injected = faults(store)
        injected.fail("txn", key_prefix=CURSORS_PREFIX, after_apply=True)
        injected.fail("range", key_prefix=CURSORS_PREFIX)
        with pytest.raises(StoreUnavailable):
            await cursor.ack([p[0]])
        await cursor.ack([p[1], p[2]])
        assert cursor.durable and cursor.persisted_mark_delete == p[2]
        await ledger.close()
    async with opened(etcd_url, tmp_path / "ledgers") as (reopened, _):
        assert reopened.cursors["sub"].mark_delete == p[2]
