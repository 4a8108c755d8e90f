"""A group-commit writer that stopped (a halt, a failed write) under backpressure: every
append waiting for room settles, none lands in a queue nobody drains, and the ledger's
close (which waits for the writer to be idle) returns."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.ledger import ManagedLedger, Position
from segtxn.ledger.errors import WriteFailed
from segtxn.ledger.fencing import OwnerChanged
from tests.ledger.conftest import OpenLedger
from tests.ledger.held import hold_writes
from tests.waiting import wait_until

WAITERS = 8


async def _full_queue_and_waiters(
    ledger: ManagedLedger,
) -> tuple[list[asyncio.Task[Position]], list[asyncio.Task[Position]]]:
    """One batch being written (held), the queue full behind it, and ``WAITERS`` appends
    waiting for room: one inside the admission lock, the others for the lock."""
    writer = ledger._writer
    head = asyncio.create_task(ledger.append(b"h" * 10))
    await wait_until(lambda: writer._queued_bytes == 0 and not writer.idle.is_set())
    queued = asyncio.create_task(ledger.append(b"q" * 10))  # max_pending_bytes reached
    await wait_until(lambda: writer._queued_bytes == 10)
    waiters = [asyncio.create_task(ledger.append(b"w" * 6)) for _ in range(WAITERS)]
    await wait_until(lambda: writer._admitting == WAITERS)
    return [head, queued], waiters


async def test_a_halt_under_backpressure_settles_every_append_and_close_returns(
    open_ledger: OpenLedger,
) -> None:
    """An ack's save proves another owner while the topic is busy: the halt fails what is
    queued, and each append that then finds room must fail too (it used to be queued
    behind a writer that had ended: never answered, and the ledger's close waited for an
    idle writer for ever, so the topic's unload never ended)."""
    ledger = await open_ledger(max_pending_bytes=10)
    told: list[WriteFailed] = []
    ledger.on_write_failure.append(told.append)
    gate = hold_writes(ledger)
    (head, queued), waiters = await _full_queue_and_waiters(ledger)

    ledger.fenced(OwnerChanged("proved by a cursor save"))
    gate.set()

    async with asyncio.timeout(10):
        outcomes = await asyncio.gather(queued, *waiters, return_exceptions=True)
    assert all(isinstance(o, WriteFailed) and o.retriable for o in outcomes), outcomes
    assert isinstance(await head, Position)  # written before the halt: acknowledged
    assert len(told) == 1
    async with asyncio.timeout(10):  # it waited for an idle writer for ever
        assert await ledger.close() is False  # its last ledger is for recovery to judge


async def test_a_failed_write_under_backpressure_settles_every_append_and_close_returns(
    open_ledger: OpenLedger,
) -> None:
    """The same after a write that failed (the writer's task ends): the appends waiting
    for room are refused, not queued where no task drains them."""
    ledger = await open_ledger(max_pending_bytes=10)
    told: list[WriteFailed] = []
    ledger.on_write_failure.append(told.append)
    gate = hold_writes(ledger)
    current = ledger._current
    assert current is not None
    held = current.append_batch

    def fails(payloads: object) -> None:
        held(payloads)  # type: ignore[arg-type]
        raise OSError(28, "No space left on device")

    current.append_batch = fails  # type: ignore[method-assign]
    (head, queued), waiters = await _full_queue_and_waiters(ledger)

    gate.set()

    async with asyncio.timeout(10):
        outcomes = await asyncio.gather(head, queued, *waiters, return_exceptions=True)
    assert all(isinstance(o, WriteFailed) and o.retriable for o in outcomes), outcomes
    assert len(told) == 1
    async with asyncio.timeout(10):
        assert await ledger.close() is False


async def test_a_fence_after_a_damaging_write_is_told_too(open_ledger: OpenLedger) -> None:
    """A write failed for good (not retriable: its owner keeps the topic, refusing
    appends); a save then proves another owner: that is told as well, retriable, so the
    owner lets the ledger go instead of keeping a topic another broker serves."""
    ledger = await open_ledger()
    told: list[WriteFailed] = []
    ledger.on_write_failure.append(told.append)
    current = ledger._current
    assert current is not None

    def damaged(payloads: object) -> None:
        raise OSError(5, "Input/output error")

    current.append_batch = damaged  # type: ignore[method-assign]
    with pytest.raises(WriteFailed):
        await ledger.append(b"lost")
    assert [t.retriable for t in told] == [False]

    ledger.fenced(OwnerChanged("proved by a cursor save"))
    ledger.fenced(OwnerChanged("proved again"))

    assert [t.retriable for t in told] == [False, True]
    with pytest.raises(WriteFailed) as refused:
        await ledger.append(b"refused")
    assert refused.value.retriable
