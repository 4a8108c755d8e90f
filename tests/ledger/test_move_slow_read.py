"""A placement move (``ManagedLedger.move_ledger``, a replicated ledger's repair) while a
read of the moved ledger is in flight holds none of the ledger's other metadata changes.

Since 2e6af6a the move lets go of the ledger's old log with its CAS, under the metadata
lock (so a cancel cannot leave the move landed and the old log in use), and letting go
waited there for the reads in flight on that log to end: a slow read (a replica's reads
are network round trips) held every rollover, trim, property update and clean close of the
same ledger, and the cursor saves that settle on its version, as long as it lasted.

The wait is now made after the CAS, out of the lock; what the move means in memory (reads
go to the new placement, the old log is let go) is still done with the CAS, so a move
cancelled while its CAS is in flight leaves no landed move unrecorded (2e6af6a).

Real components: a managed ledger and the store on both backends (wrapped by the fault
injector, whose ``hold`` parks a write's answer); the entry log's reads wait for an
explicit event (a slow disk or replica).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from segtxn.ledger import LedgerSettings, ManagedLedger, Position
from segtxn.ledger.logs import LOCAL, Placement
from segtxn.ledger.memory import MemoryEntryLog, MemoryLogStorage
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore
from segtxn.metastore.faults import FaultInjector
from tests.conftest import faults as injector_of
from tests.conftest import store as both_backends
from tests.waiting import wait_until

store = both_backends  # this directory's conftest has a memory store without faults
faults = injector_of

NAME = "persistent://t/n/moved"
ELSEWHERE = Placement(("b1@1", "b2@1"), 2)

BOUND_S = 5.0
"""How long a metadata change may take here: a store in memory answers at once."""


class HeldReads:
    """What the test holds reads with: set ``reading`` when one starts, wait for
    ``resume``."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.resume = asyncio.Event()
        self.closed: list[int] = []


class SlowLog(MemoryEntryLog):
    held: HeldReads

    async def read_async(self, first: int, last: int) -> list[bytes]:
        self.held.reading.set()
        await self.held.resume.wait()
        return self.read(first, last)

    def close(self) -> None:
        self.held.closed.append(self.ledger_id)
        super().close()


class SlowStorage(MemoryLogStorage):
    def __init__(self, held: HeldReads) -> None:
        super().__init__()
        self.held = held

    def _handle(self, key: tuple[str, int]) -> MemoryEntryLog:
        handle = super()._handle(key)
        slow = SlowLog(handle.ledger_id, handle._entries, handle._release)  # type: ignore[arg-type]
        slow.held = self.held
        return slow


@pytest.fixture
async def held_ledger(store: MetadataStore) -> AsyncIterator[tuple[ManagedLedger, HeldReads]]:
    held = HeldReads()
    ledger = await ManagedLedger.open(NAME, store, SlowStorage(held), LedgerSettings())
    try:
        yield ledger, held
    finally:
        held.resume.set()
        await ledger.close()


async def test_a_slow_read_of_a_moved_ledger_does_not_hold_the_ledgers_other_changes(
    held_ledger: tuple[ManagedLedger, HeldReads],
) -> None:
    ledger, held = held_ledger
    await ledger.append(b"e0")
    await ledger.roll_over()  # ledger 1 closed, its log still held for reads
    reading = asyncio.create_task(ledger.read(Position(1, 0)))
    await held.reading.wait()
    moving = asyncio.create_task(ledger.move_ledger(1, LOCAL, ELSEWHERE))
    await wait_until(lambda: ledger.ledgers[0].placement == ELSEWHERE, what="the move landed")
    try:
        await asyncio.wait_for(ledger.append(b"e1"), BOUND_S)
        await asyncio.wait_for(ledger.roll_over(), BOUND_S)
        await asyncio.wait_for(ledger.update_properties({"k": "v"}), BOUND_S)
        await asyncio.wait_for(ledger.settled_metadata_version(), BOUND_S)
    except TimeoutError:
        raise AssertionError(
            "a rollover waited for a read of another ledger: the move held the metadata "
            "lock until the read ended"
        ) from None
    assert ledger.ledger_ids == [1, 2, 3] and ledger.properties == {"k": "v"}
    assert 1 not in held.closed  # the read in flight still uses its log
    held.resume.set()
    assert (await reading)[0].payload == b"e0"  # (its read ends on its log)
    assert await moving is True
    assert held.closed.count(1) == 1  # closed once the read ended, and the move then ended


async def test_a_move_cancelled_while_its_cas_is_in_flight_is_recorded_and_lets_the_log_go(
    held_ledger: tuple[ManagedLedger, HeldReads], faults: FaultInjector
) -> None:
    ledger, held = held_ledger
    await ledger.append(b"e0")
    await ledger.roll_over()
    reading = asyncio.create_task(ledger.read(Position(1, 0)))
    await held.reading.wait()
    parked = faults.hold("txn", key_prefix=metadata_key(NAME))
    moving = asyncio.create_task(ledger.move_ledger(1, LOCAL, ELSEWHERE))
    await parked.wait_for(1)  # the move's CAS applied, its answer parked
    moving.cancel()
    parked.release()
    with pytest.raises(asyncio.CancelledError):
        await moving
    # landed and recorded: the old log let go (the read in flight closes it), the next
    # metadata change goes on from the move's version (not fenced by its own move)
    assert ledger.ledgers[0].placement == ELSEWHERE and 1 in ledger._logs.letting_go
    await ledger.update_properties({"k": "v"})
    held.resume.set()
    await reading
    assert held.closed.count(1) == 1 and not ledger._logs.letting_go
