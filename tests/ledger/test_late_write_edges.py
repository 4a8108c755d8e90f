"""Metadata writes whose client call failed but which the store applied later.

On etcd, a write whose call failed (deadline exceeded, a dropped connection) may still be
queued as a proposal and applied after the writer read the record back and found it
unchanged. ``cas_put`` / ``cas_put_owned`` took that read-back for "did not land"; the
write then landed late. For a rollover: appends went on into the current ledger and were
acknowledged, the late record closed that ledger at its earlier count, and the appends
after that count were lost when the ledger was reopened. And when the write that closes
the door on it (the record's own value, written back) had its answer lost too and landed,
the writer's next write took its own old value at a later version for another owner's.

Real components: the store on both backends (memory, the session's etcd), wrapped by the
fault injector, whose ``apply_late`` fails a write to its caller and applies it when the
test releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
import pytest

from segtxn.ledger import LedgerFenced, LedgerSettings, LogStorage, ManagedLedger, Position
from segtxn.ledger.cursor import CURSORS_PREFIX
from segtxn.ledger.fencing import NotLanded, OutcomeUnknown, OwnerChanged, cas_put, cas_put_owned
from segtxn.ledger.metadata import METADATA_PREFIX, decode, encode, metadata_key
from segtxn.metastore import MetadataStore, StoreUnavailable
from segtxn.metastore.fault_holds import Late
from segtxn.metastore.faults import FaultInjector
from tests.conftest import faults as injector_of
from tests.conftest import store as both_backends

store = both_backends  # this directory's conftest has a memory store without faults
faults = injector_of

NAME = "persistent://t/n/late"
KEY = "/late/record"
OWNER = "/late/owner"


@pytest.fixture
async def opened(store: MetadataStore, storage: LogStorage) -> AsyncIterator[list[ManagedLedger]]:
    ledgers: list[ManagedLedger] = []
    yield ledgers
    for ledger in ledgers:
        await ledger.close()


async def test_a_cas_put_reported_not_landed_never_lands_later(
    store: MetadataStore, faults: FaultInjector
) -> None:
    before = await store.put(KEY, b"old")
    late = faults.apply_late(key_prefix=KEY)
    with pytest.raises(StoreUnavailable) as failed:
        await cas_put(store, KEY, b"new", before.version)
    assert not isinstance(failed.value, OutcomeUnknown)  # reported as not landed
    await late.applied()
    after = await store.get(KEY)
    assert after is not None
    assert after.value == b"old", "the write reported as not landed landed later"
    assert isinstance(failed.value, NotLanded)
    assert failed.value.version == after.version  # the writer goes on from there
    assert await cas_put(store, KEY, b"new", failed.value.version) > after.version


async def test_a_cas_put_owned_reported_not_landed_never_lands_later(
    store: MetadataStore, faults: FaultInjector
) -> None:
    owner = await store.put(OWNER, b"meta")
    before = await store.put(KEY, b"old")
    late = faults.apply_late(key_prefix=KEY)
    with pytest.raises(StoreUnavailable) as failed:
        await cas_put_owned(
            store, KEY, b"new", before.version, owner_key=OWNER, owner_version=owner.version
        )
    assert not isinstance(failed.value, OutcomeUnknown)
    await late.applied()
    after = await store.get(KEY)
    assert after is not None
    assert after.value == b"old", "the write reported as not landed landed later"
    assert isinstance(failed.value, NotLanded)
    assert failed.value.version == after.version


async def test_a_write_landing_between_read_back_and_door_is_taken_as_landed(
    store: MetadataStore, faults: FaultInjector
) -> None:
    """The read-back found the record unchanged, then the late write landed: writing the
    old value back fails its compare, and the record holds ours: landed after all."""
    before = await store.put(KEY, b"old")
    late = faults.apply_late(key_prefix=KEY)
    held = faults.hold("range", key_prefix=KEY)
    writing = asyncio.create_task(cas_put(store, KEY, b"new", before.version))
    await held.wait_for(1)  # the read-back read the record unchanged; its answer waits
    await late.applied()
    held.release()
    version = await writing
    after = await store.get(KEY)
    assert after is not None
    assert (after.value, after.version) == (b"new", version)


async def test_a_cas_put_owned_whose_owner_changed_meanwhile_is_owner_changed(
    store: MetadataStore, faults: FaultInjector
) -> None:
    """The record is still as it was, the owner record moved on before the door closed:
    the late write's own check fails for ever, so it did not land; the writer checks whose
    change that was, as after any ``OwnerChanged``."""
    owner = await store.put(OWNER, b"meta")
    before = await store.put(KEY, b"old")
    late = faults.apply_late(key_prefix=KEY)
    held = faults.hold("range", key_prefix=KEY)
    writing = asyncio.create_task(
        cas_put_owned(
            store, KEY, b"new", before.version, owner_key=OWNER, owner_version=owner.version
        )
    )
    await held.wait_for(1)  # the read-back found the record unchanged
    await store.put(OWNER, b"meta, changed")
    held.release()
    with pytest.raises(OwnerChanged):
        await writing
    await late.applied()
    after = await store.get(KEY)
    assert after == before


async def test_a_cursor_goes_on_saving_after_a_save_that_did_not_land(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector, opened: list[ManagedLedger]
) -> None:
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(ledger)
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = [await ledger.append(b"a%d" % i) for i in range(3)]
    late = faults.apply_late(key_prefix=CURSORS_PREFIX)
    with pytest.raises(StoreUnavailable):
        await cursor.ack([p[0]])
    await late.applied()
    await cursor.ack([p[1]])  # not fenced: it saves on the version the failure left
    await ledger.close()

    reopened = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(reopened)
    assert reopened.cursors["sub"].mark_delete == p[1]


async def test_appends_after_a_rollover_that_landed_late_are_kept(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector, opened: list[ManagedLedger]
) -> None:
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(ledger)
    acked = [await ledger.append(b"a%d" % i) for i in range(2)]
    late = faults.apply_late(key_prefix=METADATA_PREFIX)
    with pytest.raises(StoreUnavailable):
        await ledger.roll_over()  # reported as not landed: appends go on in this ledger
    acked += [await ledger.append(b"b%d" % i) for i in range(2)]
    await late.applied()
    fenced = None
    try:
        await ledger.update_properties({"k": "v"})  # the next metadata write
        acked += [await ledger.append(b"c")]
    except LedgerFenced as e:  # the owner reopens the ledger, as below
        fenced = e
    with contextlib.suppress(LedgerFenced):  # (fenced, its close's own writes fail too)
        await ledger.close()

    reopened = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(reopened)
    held = [e.position for e in await reopened.read(Position(0, 0), max_entries=10)]
    assert held == acked, "acknowledged appends were lost"
    assert fenced is None
    assert reopened.properties == {"k": "v"}


def _lose_write_and_door(faults: FaultInjector, prefix: str) -> tuple[Late, Late]:
    """The next write under ``prefix`` and the door-closing write after it both fail to
    their caller; release the door first (it lands), then the write (it fails its compare)."""
    return faults.apply_late(key_prefix=prefix), faults.apply_late(key_prefix=prefix)


async def _door_lands_first(lost: Late, door: Late) -> None:
    assert (lost.taken, door.taken) == (1, 1)
    await door.applied()
    await lost.applied()


async def test_a_cursor_goes_on_saving_after_its_door_write_landed_unseen(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector, opened: list[ManagedLedger]
) -> None:
    """The save's answer was lost, the read-back found the record unchanged, and the write
    of its own value back (closing the door) had its answer lost too but landed: the record
    holds the cursor's last saved state at a later version, which is its own write."""
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(ledger)
    cursor = await ledger.open_cursor("sub", start="earliest")
    p = [await ledger.append(b"a%d" % i) for i in range(3)]
    lost, door = _lose_write_and_door(faults, CURSORS_PREFIX)
    with pytest.raises(OutcomeUnknown):
        await cursor.ack([p[0]])
    await _door_lands_first(lost, door)
    await cursor.ack([p[1]])  # not fenced: the state found is its own
    await ledger.close()

    reopened = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(reopened)
    assert reopened.cursors["sub"].mark_delete == p[1]


async def test_a_ledger_goes_on_after_its_door_write_landed_unseen(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector, opened: list[ManagedLedger]
) -> None:
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(ledger)
    lost, door = _lose_write_and_door(faults, METADATA_PREFIX)
    with pytest.raises(OutcomeUnknown):
        await ledger.update_properties({"k": "lost"})
    await _door_lands_first(lost, door)
    await ledger.update_properties({"k": "v"})  # not fenced: the state found is its own
    acked = await ledger.append(b"after")
    await ledger.close()

    reopened = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(reopened)
    assert reopened.properties == {"k": "v"}
    assert [e.position for e in await reopened.read(acked, max_entries=1)] == [acked]


async def test_another_owners_change_after_a_door_write_landed_unseen_is_a_fencing(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector
) -> None:
    """Only the writer's own values are taken up: another owner's change of the record
    after the door write landed fences the writer as ever."""
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    lost, door = _lose_write_and_door(faults, METADATA_PREFIX)
    with pytest.raises(OutcomeUnknown):
        await ledger.update_properties({"k": "lost"})
    await _door_lands_first(lost, door)
    key = metadata_key(NAME)
    found = await store.get(key)
    assert found is not None
    theirs = msgspec.structs.replace(decode(found.value), properties={"owner": "other"})
    await store.put(key, encode(theirs), expected_version=found.version)
    try:
        with pytest.raises(LedgerFenced):
            await ledger.update_properties({"k": "v"})
    finally:
        with contextlib.suppress(LedgerFenced):
            await ledger.close()
