"""The waiters of an op-record step (``OpRecordWriter.write``): each resumes in the loop turn
after its step lands, and one whose caller is cancelled neither keeps its draft from
landing nor fails the others waiting on the same record.

Why the turn matters (issue 16): a transactional send's receipt leaves the broker only once
its writes record's step has landed and the waiter resumed; with the one-step commit that
step also carries the commit, and the client's ``commit()`` waits for those receipts after
the broker's answer. A shield over each waiter's future cost one more turn there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import pytest

from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.txn.buffer_records import WritesDraft
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.ledger import Position
from segtxn.metastore import MetadataStore, Op, Record, open_store
from segtxn.protocol.errors import ServerError
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T
from tests.test_aio import Turns
from tests.waiting import wait_until

TXN = TxnId(1 << 62, 1)
SEGMENT = "segment://acme/ops/orders/0"


class SteppingStore:
    """A store whose steps (``commit``) note the loop turn in which they return, and, while
    ``hold`` is set, each wait for its own release (``held``, in order); everything else is
    the real store's."""

    def __init__(self, store: MetadataStore, turns: Turns) -> None:
        self._store = store
        self._turns = turns
        self.hold = False
        self.held: list[asyncio.Event] = []
        self.landed_at: list[int] = []

    async def commit(self, ops: Sequence[Op]) -> list[Record | None]:
        if self.hold:
            release = asyncio.Event()
            self.held.append(release)
            await release.wait()
        result = await self._store.commit(ops)
        self.landed_at.append(self._turns.count)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[OpRecordWriter, SteppingStore, Turns, int]]:
    store = open_store("memory://")
    header = await store.put(T.header_key(TXN), b"open", partition_key=TXN.key)
    turns = Turns()
    stepping = SteppingStore(store, turns)
    writer = OpRecordWriter(cast(MetadataStore, stepping), BrokerMetrics())
    try:
        yield writer, stepping, turns, header.version
    finally:
        turns.stop()
        await writer.close()
        await store.close()


async def test_a_waiter_resumes_in_the_loop_turn_after_its_step_lands(
    setup: tuple[OpRecordWriter, SteppingStore, Turns, int],
) -> None:
    writer, stepping, turns, version = setup
    draft = WritesDraft(TXN, SEGMENT, Position(1, 0))
    await writer.write(TXN, version, draft)
    resumed_at = turns.count
    assert draft.durable == (Position(1, 0), Position(1, 0))
    assert stepping.landed_at and resumed_at - stepping.landed_at[-1] == 1  # (a shield: 2)


async def test_a_cancelled_waiter_neither_keeps_its_record_from_landing_nor_fails_the_others(
    setup: tuple[OpRecordWriter, SteppingStore, Turns, int],
) -> None:
    writer, stepping, _, version = setup
    draft = WritesDraft(TXN, SEGMENT, Position(1, 0))
    stepping.hold = True
    first = asyncio.create_task(writer.write(TXN, version, draft))
    await wait_until(lambda: len(stepping.held) == 1, what="the first step in flight")
    draft.extend(Position(1, 5))
    second = asyncio.create_task(writer.write(TXN, version, draft))  # for the next step
    cancelled_later = asyncio.create_task(writer.write(TXN, version, draft))
    await wait_until(lambda: writer.waiting(TXN) == 2, what="two waiting for the next step")
    first.cancel()  # a waiter of the step in flight
    with pytest.raises(asyncio.CancelledError):
        await first
    stepping.held[0].set()
    await wait_until(lambda: len(stepping.held) == 2, what="the next step in flight")
    assert draft.durable == (Position(1, 0), Position(1, 0)) and draft.failed is None
    cancelled_later.cancel()  # a waiter of the step in flight
    with pytest.raises(asyncio.CancelledError):
        await cancelled_later
    stepping.held[1].set()
    await asyncio.wait_for(second, timeout=10)
    assert draft.durable == (Position(1, 0), Position(1, 5)) and draft.failed is None
    record = await stepping.get(T.writes_key(TXN, SEGMENT))
    assert record is not None
    assert T.decode_op(record.value) == T.WritesRecord(SEGMENT, (1, 0), (1, 5))


async def test_the_steps_in_flight_are_counted_until_the_store_answers(
    setup: tuple[OpRecordWriter, SteppingStore, Turns, int],
) -> None:
    """``steps_in_flight`` (the ``segtxn_txn_metadata_store_op_steps_in_flight`` gauge) counts
    a step from the moment it is sent until the store answers, whatever the answer."""
    writer, stepping, _, version = setup
    assert writer.steps_in_flight == 0
    stepping.hold = True
    landing = asyncio.create_task(
        writer.write(TXN, version, WritesDraft(TXN, SEGMENT, Position(1, 0)))
    )
    await wait_until(lambda: len(stepping.held) == 1, what="the step in flight")
    assert writer.steps_in_flight == 1
    stepping.held[0].set()
    await asyncio.wait_for(landing, timeout=10)
    assert writer.steps_in_flight == 0
    stale = WritesDraft(TXN, f"{SEGMENT}-other", Position(2, 0))
    refused = asyncio.create_task(writer.write(TXN, version - 1, stale))  # a header check fails
    await wait_until(lambda: len(stepping.held) == 2, what="the refused step in flight")
    assert writer.steps_in_flight == 1
    stepping.held[1].set()
    with pytest.raises(ServerError):
        await asyncio.wait_for(refused, timeout=10)
    assert writer.steps_in_flight == 0
