"""A managed ledger's metadata change cancelled while its compare-and-set is in flight.

A compacted log's owner compacts it in a background task and cancels that task when it
closes (a subscription's v4 pending-ack log, a v4 coordinator's transaction log at its
stop). The cancel could land while the compaction's rollover CAS was in flight: the CAS
landed in the store, the ledger took it for failed (its new ledger let go, the version
it expects the old one), and the owner's next change, the close's clean-close write, found
the rollover and failed: LedgerFenced "a rollover of its own landed though it seemed to
fail ...; reopen the ledger" (seen in CI under load). Appends made between the two would
have gone to the ledger the record had closed. A cancelled metadata change now ends once
its CAS is known to have landed or not, and the ledger takes up what it did.

Real components: the store on both backends, wrapped by the fault injector, whose
``hold`` parks a write's answer (applied already) until the test lets it go; real files.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

import pytest

from segtxn.ledger import LedgerSettings, LogStorage, ManagedLedger, Position
from segtxn.ledger.compacted import CompactedLog
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.metastore import MetadataStore
from segtxn.metastore.faults import FaultInjector
from tests.conftest import faults as injector_of
from tests.conftest import store as both_backends

store = both_backends  # this directory's conftest has a memory store without faults
faults = injector_of

NAME = "persistent://t/n/cancelled"


@pytest.fixture
async def opened(store: MetadataStore, storage: LogStorage) -> AsyncIterator[list[ManagedLedger]]:
    ledgers: list[ManagedLedger] = []
    yield ledgers
    for ledger in ledgers:
        await ledger.close()


async def cancelled_while_held(faults: FaultInjector, step: Coroutine[Any, Any, Any]) -> None:
    """Run ``step``; cancel it once its first write to the ledger's record is applied and
    its answer parked, then let the answer go. ``step`` must end cancelled."""
    held = faults.hold("txn", key_prefix=metadata_key(NAME))
    work = asyncio.create_task(step)
    await held.wait_for(1)
    work.cancel()
    held.release()
    with pytest.raises(asyncio.CancelledError):
        await work


async def test_a_rollover_cancelled_while_its_cas_is_in_flight_leaves_the_ledger_usable(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector, opened: list[ManagedLedger]
) -> None:
    ledger = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(ledger)
    acked = [await ledger.append(b"a%d" % i) for i in range(2)]
    await cancelled_while_held(faults, ledger.roll_over())
    acked += [await ledger.append(b"b%d" % i) for i in range(2)]
    await ledger.update_properties({"k": "v"})  # the next metadata write: not fenced
    await ledger.close()  # its clean close is recorded
    record = await store.get(metadata_key(NAME))
    assert record is not None
    meta = decode(record.value)
    assert meta.ledgers[-1].entries is not None, "the clean close was not recorded"

    reopened = await ManagedLedger.open(NAME, store, storage, LedgerSettings())
    opened.append(reopened)
    held = [e.position for e in await reopened.read(Position(0, 0), max_entries=10)]
    assert held == acked, "acknowledged appends were lost"
    assert reopened.properties == {"k": "v"}


async def test_a_compaction_cancelled_at_its_rollover_lets_the_log_close_cleanly(
    store: MetadataStore, storage: LogStorage, faults: FaultInjector
) -> None:
    log_ = await CompactedLog.open(NAME, store, storage, LedgerSettings())
    for i in range(6):
        await log_.append(b"old%d" % i)

    async def keep() -> Sequence[bytes]:
        return [b"kept"]

    await cancelled_while_held(faults, log_.compact(keep))
    await log_.append(b"new")
    await log_.close()  # raised LedgerFenced: "a rollover of its own landed ..."
    record = await store.get(metadata_key(NAME))
    assert record is not None
    assert decode(record.value).ledgers[-1].entries is not None, "no clean close recorded"

    reopened = await CompactedLog.open(NAME, store, storage, LedgerSettings())
    try:
        replayed = [e.payload async for entries in reopened.replay() for e in entries]
    finally:
        await reopened.close()
    # cancelled before it re-logged anything: the cursor did not move, all is replayed
    assert replayed == [b"old%d" % i for i in range(6)] + [b"new"]
