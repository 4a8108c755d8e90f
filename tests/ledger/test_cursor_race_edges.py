"""A cursor's delete racing its open, and the ledger's own metadata writes whose outcome was
lost.

1. ``delete_cursor`` and ``open_cursor`` of one name, interleaved on purpose (a store call
   of one held while the other runs), must end as one of their two serial orders: the
   cursor open in memory *and* its record in the store, or neither. The interleaving left
   a cursor open in memory with no record (gone after a restart, its acknowledgments
   lost, retention blind to it).
2. A metadata compare-and-set of the ledger that landed while its answer and the read-back
   were lost is the ledger's own write: the next change (or a cursor's save, which is
   conditional on the record) must take it up, not take it for another owner's fencing
   (the topic unloaded and recovered). Another owner's change is still a fencing. A
   rollover whose outcome stays unknown stops the appends (they were acknowledged into a
   ledger the record had closed, and lost).
3. A cursor opened while the ledger closes (its saves of the cursors on their way) broke
   the close, and cursors after it were never saved.

Real components: the in-memory store wrapped by the fault injector (its holds make the
interleavings), file-backed and in-memory logs, and "restarts" that open new objects over
the same store and storage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest

from segtxn.ledger import (
    LedgerClosed,
    LedgerError,
    LedgerFenced,
    LedgerSettings,
    LogStorage,
    ManagedCursor,
    ManagedLedger,
    Position,
    RetentionPolicy,
    WriteFailed,
)
from segtxn.ledger.cursor import CURSORS_PREFIX, cursor_key
from segtxn.ledger.fencing import OwnerUnknown
from segtxn.ledger.metadata import METADATA_PREFIX, decode, encode, metadata_key
from segtxn.metastore import MetadataStore, MetadataStoreError, StoreUnavailable, open_store
from segtxn.metastore.faults import FaultInjector
from tests.ledger.test_ledger_edges import faults
from tests.waiting import wait_until

NAME = "persistent://t/n/cursor-races"
AT_ONCE = RetentionPolicy(retention_time_s=0)


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


OpenLedger = Callable[[], Awaitable[ManagedLedger]]


@pytest.fixture
async def open_ledger(store: MetadataStore, storage: LogStorage) -> AsyncIterator[OpenLedger]:
    """Opens ``NAME`` over the store and storage (again: a restart). Those a test left open
    (it failed first) are closed after it, faults cleared: its failure is the one to see."""
    opened: list[ManagedLedger] = []

    async def open_() -> ManagedLedger:
        opened.append(await ManagedLedger.open(NAME, store, storage, LedgerSettings()))
        return opened[-1]

    yield open_
    faults(store).clear()
    for ledger in opened:
        if not ledger.is_closing:
            with contextlib.suppress(LedgerError, MetadataStoreError):
                await ledger.close()


def waiting_for_its_turn(ledger: ManagedLedger, name: str) -> bool:
    """Whether a second open or delete of the cursor ``name`` waits for the first to end
    (how the ledger serialises them)."""
    return ledger._cursor_turns.users(name) > 1


async def consistent(ledger: ManagedLedger, store: MetadataStore, name: str) -> bool:
    """Whether the cursor ``name`` is open in memory exactly when the store holds it."""
    record = await store.get(cursor_key(NAME, name))
    cursor = ledger.cursors.get(name)
    return (cursor is not None and not cursor.closed) == (record is not None)


async def appended(ledger: ManagedLedger, count: int) -> list[Position]:
    return [await ledger.append(b"e%d" % i) for i in range(count)]


async def held_after_a_restart(open_ledger: OpenLedger) -> list[Position]:
    """The positions of the entries ``NAME`` holds when opened again (a restart)."""
    reopened = await open_ledger()
    return [e.position for e in await reopened.read(Position(0, 0), max_entries=10)]


# ---------------------------------------------------------------------------------------
# 1. delete_cursor racing open_cursor


async def with_a_saved_cursor(open_ledger: OpenLedger) -> tuple[ManagedLedger, list[Position]]:
    """``NAME`` opened with three entries, and a cursor ``sub`` that acknowledged the first
    (its record in the store). Returns the ledger and the entries' positions."""
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = await appended(ledger, 3)
    await cursor.ack([p[0]])
    return ledger, p


async def test_an_open_during_a_delete_ends_as_delete_then_open(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """The delete's store call reaches the store late; an open of the same name meanwhile
    found the record still there and took it up, and then the delete removed it: the
    cursor it returned was open, listed by the ledger, and had no record."""
    ledger, p = await with_a_saved_cursor(open_ledger)
    held = faults(store).hold("txn", key_prefix=CURSORS_PREFIX, before=True)  # the delete
    deleting = asyncio.create_task(ledger.delete_cursor("sub"))
    await held.wait_for(1)
    opening = asyncio.create_task(ledger.open_cursor("sub"))
    await wait_until(
        lambda: opening.done() or waiting_for_its_turn(ledger, "sub"), what="the open ran"
    )
    held.release()
    await deleting
    again = await opening

    assert await consistent(ledger, store, "sub"), "open in memory, no record in the store"
    assert ledger.cursors["sub"] is again and not again.closed
    assert again.mark_delete == p[-1]  # a new cursor, at the next write
    q = await appended(ledger, 1)
    await again.ack([q[0]])  # its saves land
    await ledger.close()

    reopened = await open_ledger()
    assert reopened.cursors["sub"].mark_delete == q[0]


async def test_a_delete_during_an_open_ends_as_open_then_delete(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """A failed delete left the cursor closed but listed; an open takes it up again, and
    reading its record answers late; a delete meanwhile removed the record and the ledger's
    entry, and then the open listed the cursor it built from the record it had read: open
    in memory, with no record."""
    ledger, _ = await with_a_saved_cursor(open_ledger)
    injected = faults(store)
    injected.fail("txn", key_prefix=CURSORS_PREFIX)
    with pytest.raises(StoreUnavailable):
        await ledger.delete_cursor("sub")
    held = injected.hold("range", key_prefix=CURSORS_PREFIX)  # the open reads the record
    opening = asyncio.create_task(ledger.open_cursor("sub"))
    await held.wait_for(1)
    deleting = asyncio.create_task(ledger.delete_cursor("sub"))
    await wait_until(
        lambda: deleting.done() or waiting_for_its_turn(ledger, "sub"), what="the delete ran"
    )
    held.release()
    again = await opening
    await deleting

    assert await consistent(ledger, store, "sub"), "open in memory, no record in the store"
    assert "sub" not in ledger.cursors and again.closed
    assert (await ledger.trim(AT_ONCE)).ledgers == []  # nothing closed yet to let go
    await ledger.close()
    reopened = await open_ledger()
    assert "sub" not in reopened.cursors


# ---------------------------------------------------------------------------------------
# 2. the ledger's own metadata write, landed with no answer


def lose_the_next_metadata_answer(store: MetadataStore) -> None:
    """The next metadata CAS lands but its answer is lost, and so is the read-back."""
    injected = faults(store)
    injected.fail("txn", key_prefix=METADATA_PREFIX, after_apply=True)
    injected.fail("range", key_prefix=METADATA_PREFIX)


async def test_a_property_change_that_landed_unseen_is_not_a_fencing(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """Its retry found the record a version ahead, written by this owner itself, and took
    it for another owner's (LedgerFenced: the topic unloaded and recovered)."""
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = await appended(ledger, 2)
    lose_the_next_metadata_answer(store)
    with pytest.raises(StoreUnavailable):
        await ledger.update_properties({"k": "v"})
    await ledger.update_properties({"k": "v", "other": "w"})  # the retry
    assert ledger.properties == {"k": "v", "other": "w"}
    await appended(ledger, 1)
    await ledger.close()

    reopened = await open_ledger()
    assert reopened.properties == {"k": "v", "other": "w"}
    assert reopened.cursors["sub"].mark_delete == cursor.mark_delete
    assert reopened.contains(p[1])


async def test_a_cursor_save_after_the_ledgers_own_unseen_write_is_not_fenced(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """A cursor's save is conditional on the ledger's record: the ledger's own write that
    landed unseen moved it on, and the save took that for another owner's."""
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = await appended(ledger, 2)
    lose_the_next_metadata_answer(store)
    with pytest.raises(StoreUnavailable):
        await ledger.update_properties({"k": "v"})
    await cursor.ack([p[0], p[1]])
    assert cursor.durable and cursor.persisted_mark_delete == p[1]
    assert ledger.properties == {"k": "v"}  # the write it found is taken up
    await ledger.close()


async def test_a_cursor_save_that_cannot_tell_whose_change_it_met_is_not_fenced(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """As above, and the store then fails the read of the ledger's record that would tell
    the ledger's own change from another owner's: the save fails as the store's trouble
    (``OwnerUnknown``, a StoreUnavailable: try again), not as fenced (it was ``OwnerChanged``,
    a LedgerFenced: "another owner has the ledger", for a read that failed); once the store
    answers, the next save takes the ledger's own change up and lands."""
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = await appended(ledger, 2)
    injected = faults(store)
    injected.fail("txn", key_prefix=METADATA_PREFIX, after_apply=True)
    injected.fail("range", key_prefix=METADATA_PREFIX, times=None)  # every read, until cleared
    with pytest.raises(StoreUnavailable):
        await ledger.update_properties({"k": "v"})
    with pytest.raises(StoreUnavailable) as unknown:
        await cursor.ack([p[0], p[1]])
    assert isinstance(unknown.value, OwnerUnknown), repr(unknown.value)
    assert not isinstance(unknown.value, LedgerFenced)
    assert "could not tell whether" in str(unknown.value), str(unknown.value)
    injected.clear()
    await cursor.flush()  # the store answers: the save lands
    assert cursor.durable and cursor.persisted_mark_delete == p[1]
    assert ledger.properties == {"k": "v"}  # the ledger's own change, taken up
    await ledger.close()
    reopened = await open_ledger()
    assert reopened.cursors["sub"].mark_delete == p[1]


async def test_a_trim_that_landed_unseen_deletes_its_ledgers_when_tried_again(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """The trim's record (without its ledgers) landed unseen; tried again, it must take
    that record up and delete the files it no longer names, not fail as fenced."""
    ledger = await open_ledger()
    cursor = await ledger.open_cursor("sub", start="earliest")
    first = await appended(ledger, 2)
    await ledger.roll_over()
    second = await appended(ledger, 2)
    await cursor.ack_cumulative(second[-1])
    gone = first[0].ledger_id
    lose_the_next_metadata_answer(store)
    with pytest.raises(StoreUnavailable):
        await ledger.trim(AT_ONCE)
    retried = await ledger.trim(AT_ONCE)
    assert (retried.ledgers, retried.entries) == ([gone], 2)  # for the indexes over it
    assert gone not in ledger.ledger_ids
    assert not storage.exists(NAME, gone)
    assert ledger.first_position() == second[0]
    await ledger.close()


async def test_a_seal_that_landed_unseen_completes_when_tried_again(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    ledger = await open_ledger()
    p = await appended(ledger, 2)
    lose_the_next_metadata_answer(store)
    with pytest.raises(StoreUnavailable):
        await ledger.terminate()
    assert await ledger.terminate() == p[-1]
    assert ledger.is_sealed
    await ledger.close()
    reopened = await open_ledger()
    assert reopened.is_sealed and reopened.last_confirmed == p[-1]


async def test_another_owners_change_is_still_a_fencing(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """The owner's own write landed unseen, and then another owner changed the record: it
    holds the other owner's state, and the retry (and a cursor's save) is fenced."""
    ledger = await open_ledger()
    cursor: ManagedCursor = await ledger.open_cursor("sub", start="earliest")
    p = await appended(ledger, 2)
    lose_the_next_metadata_answer(store)
    with pytest.raises(StoreUnavailable):
        await ledger.update_properties({"k": "v"})
    key = metadata_key(NAME)
    found = await store.get(key)
    assert found is not None and decode(found.value).properties == {"k": "v"}  # it landed
    theirs = msgspec.structs.replace(decode(found.value), properties={"by": "another"})
    await store.put(key, encode(theirs), expected_version=found.version)

    with pytest.raises(LedgerFenced):
        await ledger.update_properties({"k": "v"})
    with pytest.raises(LedgerFenced):
        await cursor.ack([p[0]])
    with pytest.raises(LedgerFenced):  # its close's own writes are fenced too
        await ledger.close()
    assert (await store.get(cursor_key(NAME, "sub"))) is not None


async def test_an_append_after_a_rollover_of_unknown_outcome_is_never_lost(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """A rollover's CAS landed, its answer and the read-back lost: the record closed the
    ledger being appended to, at its count then, and names the next one. The appends went
    on into the closed ledger, were acknowledged, and were gone once the ledger was
    reopened. The ledger cannot tell where an append goes: it refuses them, and its owner
    is told to reopen it, as after a failed write."""
    ledger = await open_ledger()
    told: list[WriteFailed] = []
    ledger.on_write_failure.append(told.append)
    acknowledged = await appended(ledger, 2)
    lose_the_next_metadata_answer(store)
    with pytest.raises(StoreUnavailable):
        await ledger.roll_over()
    with contextlib.suppress(WriteFailed):
        acknowledged.append(await ledger.append(b"after"))
    with contextlib.suppress(LedgerFenced):  # (before: its clean close found the rollover)
        await ledger.close()

    assert acknowledged == await held_after_a_restart(open_ledger), (
        "an acknowledged append was lost"
    )
    assert len(told) == 1


async def test_a_rollover_known_not_to_have_landed_lets_appends_go_on(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """The rollover's CAS never reached the store, and the read-back says so: the ledger
    appends on where it was (nothing to reopen)."""
    ledger = await open_ledger()
    told: list[WriteFailed] = []
    ledger.on_write_failure.append(told.append)
    acknowledged = await appended(ledger, 2)
    faults(store).fail("txn", key_prefix=METADATA_PREFIX)
    with pytest.raises(StoreUnavailable):
        await ledger.roll_over()
    acknowledged.append(await ledger.append(b"after"))
    await ledger.roll_over()
    acknowledged.append(await ledger.append(b"next"))
    assert not told
    await ledger.close()

    assert acknowledged == await held_after_a_restart(open_ledger)


async def test_an_append_waiting_for_a_rollover_of_unknown_outcome_is_refused(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """An append queued while the rollover's CAS is on its way waits for it, its batch taken
    already: once the rollover's outcome is unknown, that batch is refused too, not written
    into the ledger the record may have closed."""
    ledger = await open_ledger()
    acknowledged = await appended(ledger, 2)
    injected = faults(store)
    held = injected.hold("txn", key_prefix=METADATA_PREFIX, before=True)
    lose_the_next_metadata_answer(store)
    rolling = asyncio.create_task(ledger.roll_over())
    await held.wait_for(1)
    waiting = await ledger.enqueue(b"during")
    await wait_until(lambda: not ledger._writer._queue, what="the writer took the batch")
    held.release()
    with pytest.raises(StoreUnavailable):
        await rolling
    with pytest.raises(WriteFailed):
        acknowledged.append(await waiting)
    await ledger.close()

    assert acknowledged == await held_after_a_restart(open_ledger)


# ---------------------------------------------------------------------------------------
# 3. a cursor opened while the ledger closes


async def test_a_cursor_opened_while_the_ledger_closes_stops_no_other_cursors_save(
    store: MetadataStore, storage: LogStorage, open_ledger: OpenLedger
) -> None:
    """The close saves each cursor in turn; a cursor opened while one of those saves was on
    its way changed the ledger's list of cursors under the close ("dictionary changed size
    during iteration"): the cursors after it were never saved, their acknowledgments
    delivered again after the reopen. A ledger that is closing opens no cursor."""
    ledger = await open_ledger()
    first = await ledger.open_cursor("a", start="earliest")
    second = await ledger.open_cursor("b", start="earliest")
    p = await appended(ledger, 2)
    await first.ack([p[0]], wait=False)
    await second.ack([p[0]], wait=False)
    held = faults(store).hold("txn", key_prefix=CURSORS_PREFIX, before=True)  # a's save
    closing = asyncio.create_task(ledger.close())
    await held.wait_for(1)
    with pytest.raises(LedgerClosed):
        await ledger.open_cursor("c")
    held.release()
    await closing

    reopened = await open_ledger()
    assert {n: c.mark_delete for n, c in reopened.cursors.items()} == {"a": p[0], "b": p[0]}
