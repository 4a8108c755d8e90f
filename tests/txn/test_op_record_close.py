"""The op-record writer's close (``OpRecordWriter.close``, at a broker's stop) answers every
caller waiting on it: a step in flight gets a short while to end with its real outcome,
and what it has not answered by then, and every draft queued for a later step, is refused
as ServiceNotReady "the broker is stopping".

It cancelled its steps in flight and dropped the queued drafts: their callers waited for
ever, past the broker's stop, for an answer nothing would give. A transactional send's
publish task runs its append to its end (``txn-append-...``, shielded: segtxn/aio.py), so
the cancel of its connection's handler at the stop did not end it: it, the handler and the
connection's sender were left pending after the broker stopped.

Real components: the in-memory store, its steps held by the test (``SteppingStore``); a
broker and coordinator on the memory store and a real etcd, the step held by the fault
injector.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import cast

import pytest

from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.txn import commits, opclean, oprecords
from segtxn.broker.txn.buffer_records import ORPHANS, WritesDraft
from segtxn.broker.txn.oprecords import OpRecordWriter
from segtxn.client import Client, Timeout
from segtxn.ledger import Position
from segtxn.metastore import MetadataStore, open_store
from segtxn.protocol import txnops
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnState
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.test_aio import Turns
from tests.txn.test_op_record_waiters import SEGMENT, TXN, SteppingStore
from tests.waiting import wait_until

TOPIC = "topic://acme/ops/closing"
ANSWERED_S = 5.0
"""How long a test gives a waiter to be answered once the writer closed (it was never)."""


@pytest.fixture
async def setup() -> AsyncIterator[tuple[OpRecordWriter, SteppingStore, int]]:
    store = open_store("memory://")
    header = await store.put(T.header_key(TXN), b"open", partition_key=TXN.key)
    turns = Turns()
    stepping = SteppingStore(store, turns)
    writer = OpRecordWriter(cast(MetadataStore, stepping), BrokerMetrics())
    try:
        yield writer, stepping, header.version
    finally:
        turns.stop()
        for held in stepping.held:
            held.set()
        await writer.close()
        await store.close()


async def refused_as_stopping(waiter: asyncio.Task[None]) -> None:
    with pytest.raises(ServerError) as refused:
        await asyncio.wait_for(waiter, ANSWERED_S)
    assert refused.value.name is ErrorName.SERVICE_NOT_READY, refused.value
    assert "stopping" in refused.value.message, refused.value.message


async def test_a_step_cut_by_the_close_answers_its_waiters_and_the_queued_ones(
    setup: tuple[OpRecordWriter, SteppingStore, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, stepping, version = setup
    monkeypatch.setattr(oprecords, "STEP_END_WAIT_S", 0.05, raising=False)
    draft = WritesDraft(TXN, SEGMENT, Position(1, 0))
    stepping.hold = True
    first = asyncio.create_task(writer.write(TXN, version, draft))
    await wait_until(lambda: len(stepping.held) == 1, what="the first step in flight")
    later = WritesDraft(TXN, f"{SEGMENT}-other", Position(2, 0))
    queued = asyncio.create_task(writer.write(TXN, version, later))
    await wait_until(lambda: writer.waiting(TXN) == 1, what="one waiting for the next step")

    await writer.close()  # the step in flight does not end within the bound
    await refused_as_stopping(first)
    await refused_as_stopping(queued)
    assert len(stepping.held) == 1, "a step was begun after the close"
    assert draft.failed is not None and later.failed is not None  # (its outcome is unknown)


async def test_a_step_ending_within_the_bound_gives_its_waiters_its_outcome(
    setup: tuple[OpRecordWriter, SteppingStore, int],
) -> None:
    writer, stepping, version = setup
    draft = WritesDraft(TXN, SEGMENT, Position(1, 0))
    stepping.hold = True
    first = asyncio.create_task(writer.write(TXN, version, draft))
    await wait_until(lambda: len(stepping.held) == 1, what="the first step in flight")
    later = WritesDraft(TXN, f"{SEGMENT}-other", Position(2, 0))
    queued = asyncio.create_task(writer.write(TXN, version, later))
    await wait_until(lambda: writer.waiting(TXN) == 1, what="one waiting for the next step")

    closing = asyncio.create_task(writer.close())
    stepping.held[0].set()  # the step in flight lands as the writer closes
    await asyncio.wait_for(closing, ANSWERED_S)
    await asyncio.wait_for(first, ANSWERED_S)  # its real outcome: landed
    assert draft.durable == (Position(1, 0), Position(1, 0)) and draft.failed is None
    assert await stepping.get(T.writes_key(TXN, SEGMENT)) is not None
    await refused_as_stopping(queued)  # no step begins once the writer closes
    assert len(stepping.held) == 1


async def test_a_write_after_the_close_is_refused_at_once(
    setup: tuple[OpRecordWriter, SteppingStore, int],
) -> None:
    writer, stepping, version = setup
    await writer.close()
    draft = WritesDraft(TXN, SEGMENT, Position(1, 0))
    await refused_as_stopping(asyncio.create_task(writer.write(TXN, version, draft)))
    assert not stepping.landed_at, "a step ran after the close"


async def test_a_broker_stopping_with_a_step_in_flight_leaves_no_send_waiting(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a broker: a transactional send whose op-record step is in flight (held) as
    the broker stops. The stop ends, and the send's publish task with it (no task is left
    waiting: the suite's leaked-task guard). The orphaning of its entry (slowed here) ends
    within the stop: the stop returned while it still wrote, and the publish task ended
    after it (or was cut by the store's close)."""
    monkeypatch.setattr(oprecords, "STEP_END_WAIT_S", 0.05, raising=False)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC, segments=1)
        producer = await client.create_producer(TOPIC, send_timeout_s=1.0)
        txn = await client.transaction().start()
        held = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1, before=True)
        cluster.faults.delay("txn", 1.0, key_prefix=ORPHANS)  # it outlived the store's close
        sending = await producer.send_async(b"m", txn=txn)
        await held.wait_for(1)  # the step is in flight, parked
        await asyncio.wait_for(cluster.broker.stop(), 30)
        publishing = [t for t in asyncio.all_tasks() if t.get_name().startswith("publish-")]
        assert not publishing, publishing
        with pytest.raises(Timeout):  # the broker is gone: the client gives the send up
            await sending


async def test_a_one_step_commit_asked_after_the_close_is_answered_at_once(
    setup: tuple[OpRecordWriter, SteppingStore, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was registered as if the writer still ran, and answered "not here" only when its
    wait for its operations ended (``COMMIT_WAIT_S``, made long here so that a wait shows):
    a client's END_TXN held for nothing by a stopping broker."""
    writer, stepping, version = setup
    monkeypatch.setattr(commits, "COMMIT_WAIT_S", 3600.0)
    await writer.close()
    now_ms = int(time.time() * 1000)
    header = T.TxnHeader(TxnState.OPEN, timeout_ms=now_ms + 3_600_000, created_ms=now_ms)
    digest = txnops.add(0, "op-0")
    answer = await asyncio.wait_for(
        writer.commit(TXN, 1, digest, header=header, version=version), ANSWERED_S
    )
    assert not answer.committed and "stopping" in answer.reason, answer
    assert not stepping.landed_at, "a step ran after the close"


async def test_a_close_cancelled_while_a_send_settles_still_closes_its_clean_up(
    setup: tuple[OpRecordWriter, SteppingStore, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's stop past its time limit cancels the writer's close as it waits for a
    refused send's orphaning (``settled_by``): the clean-up task was left running past the
    stop, on a store about to be closed."""
    writer, _, _ = setup
    monkeypatch.setattr(opclean, "CLEAN_LINGER_S", 60.0)  # its task waits for more
    writer.discard(["/txn-op/gone"])
    assert cleaning_tasks(), "no clean-up task to close"
    orphaned = asyncio.Event()
    settling = asyncio.create_task(orphaned.wait(), name="txn-append-held")
    writer.settled_by(settling)
    closing = asyncio.create_task(writer.close())
    await wait_until(lambda: writer.closed, what="the close begun")  # (waits for it now)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(closing, ANSWERED_S)
    try:
        assert not cleaning_tasks(), "the clean-up task outlived the writer's close"
    finally:
        orphaned.set()
        await settling


def cleaning_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "op-records-clean" and not t.done()]
