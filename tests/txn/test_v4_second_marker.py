"""A v4 transaction gets exactly one marker in a topic, whatever races its end
(segtxn/broker/txn/markers.py, segtxn/broker/txn/v4checks.py). On both stores, with real
servers and files.

A buffer's snapshot taken while a marker was durable but not yet applied to the buffer's
memory (another transaction's marker completing the snapshot count in that window) covered
the marker's position and still listed its transaction as ongoing. A restart loaded it,
replayed only what followed, and found the transaction open: readers stopped before it
until the v4 checks' sweep ended it with a second marker, an abort if its coordinator no
longer knew it — a committed transaction, read by consumers already, was then aborted, and
readers from then on skipped its messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.entry import decode_entry, marker_entry
from segtxn.broker.settings import V4TxnSettings
from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.client import Client
from segtxn.coordinator.app import V4
from segtxn.ledger import ManagedLedger, Position
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "persistent://acme/v4/markers"
NAME = TopicName.parse(TOPIC)
FAST = V4TxnSettings(check_timeout_s=2.0, grace_s=0.5, max_timeout_s=1.0, sweep_s=0.1)
"""The sweep ends what it finds open within a test's patience."""


async def restart_broker(cluster: Cluster, snapshot_every: int = 2) -> None:
    """The broker again on the same store and files: fast v4 checks, a snapshot every
    ``snapshot_every`` markers."""
    settings = dataclasses.replace(
        cluster.broker.settings, v4_txns=FAST, txn_buffer_snapshot_every=snapshot_every
    )
    await cluster.broker.stop()
    cluster.broker = BrokerServer(settings, store=cluster.store)
    await cluster.broker.start()


def buffer(cluster: Cluster) -> MarkerTransactionBuffer:
    found = cluster.broker.service.topics[NAME].buffer
    assert isinstance(found, MarkerTransactionBuffer)
    return found


async def markers(ledger: ManagedLedger, txn: tuple[int, int]) -> list[str]:
    """The markers of ``txn`` in the topic's ledger, in order."""
    found: list[str] = []
    start: Position | None = ledger.first_position()
    while start is not None:
        entries = await ledger.read(start, max_entries=1000)
        if not entries:
            break
        for entry in entries:
            message = decode_entry(entry.payload)
            if message.marker is not None and tuple(message.txn or ()) == txn:
                found.append(message.marker)
        start = ledger.position_after(entries[-1].position)
    return found


async def rest(consumer: object) -> list[bytes]:
    """Everything the consumer is given until none comes for a bounded while."""
    out: list[bytes] = []
    while True:
        try:
            message = await consumer.receive(timeout_s=0.5)  # type: ignore[attr-defined]
        except TimeoutError:
            return out
        out.append(message.value)
        await consumer.acknowledge(message)  # type: ignore[attr-defined]


def hold_marker(ledger: ManagedLedger, txn: tuple[int, int]) -> tuple[asyncio.Event, asyncio.Event]:
    """Park ``txn``'s marker once it is durable, before its appender goes on: returns
    (durable, go)."""
    durable, go = asyncio.Event(), asyncio.Event()
    append: Callable[[bytes], object] = ledger.append

    async def held(payload: bytes) -> Position:
        at = await append(payload)  # type: ignore[misc]
        message = decode_entry(payload)
        if message.marker is not None and message.txn == txn:
            durable.set()
            await go.wait()
        return at  # type: ignore[no-any-return]

    ledger.append = held  # type: ignore[method-assign]
    return durable, go


async def test_a_snapshot_taken_while_a_marker_is_applied_never_reopens_it(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A's commit marker is durable and held there; B's commit is the second marker since
    the last snapshot, so the buffer snapshots then. After a restart, with A's coordinator
    gone (it no longer knows A, as after it forgot an ended transaction), A is committed:
    nothing open for the sweep to end, one marker, its message read by every reader."""
    caplog.set_level(logging.INFO, logger="segtxn.broker.txn.v4checks")
    await restart_broker(cluster)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        async with client.transaction() as warm_up:  # the first marker since a snapshot
            await producer.send(b"w", txn=warm_up)
        a, b = client.transaction(), client.transaction()
        await producer.send(b"a", txn=a)
        await producer.send(b"b", txn=b)
        ledger = cluster.broker.service.topics[NAME].ledger
        durable, go = hold_marker(ledger, a.wire_id)
        committing = asyncio.create_task(a.commit())
        await asyncio.wait_for(durable.wait(), 10)
        await b.commit()  # the second marker: a snapshot is taken
        log_ = await cluster.broker.service.snapshots.get(NAME.tenant, NAME.namespace)
        snapshot = None

        async def snapshotted() -> bool:
            nonlocal snapshot
            snapshot = await log_.latest(TOPIC)
            return snapshot is not None

        await wait_until(snapshotted, what="the snapshot B's marker started")
        go.set()
        await committing
        await producer.send(b"after")
        expected = [b"w", b"a", b"b", b"after"]
        assert await rest(consumer) == expected
        await cluster.coordinator.app[V4].stop()  # nobody knows A any more

        await restart_broker(cluster)
        again = await client.subscribe(TOPIC, "again", initial_position="earliest")
        checks = cluster.broker.service.v4_checks
        await wait_until(lambda: not checks.tracked, what="nothing left open for the sweep")
        assert await rest(again) == expected  # A stays committed
        ledger = cluster.broker.service.topics[NAME].ledger
        assert await markers(ledger, a.wire_id) == ["COMMIT"]  # never a second one
        assert buffer(cluster).ongoing == set()
    ended_here = [r.getMessage() for r in caplog.records if "by this broker" in r.getMessage()]
    assert ended_here == []


@pytest.mark.parametrize("snapshot", [False, True], ids=["replayed-whole", "from-a-snapshot"])
async def test_a_second_marker_left_in_a_ledger_changes_nothing(
    cluster: Cluster, snapshot: bool
) -> None:
    """A ledger written before the fix above may hold a second marker of a transaction,
    the opposite of its first (the sweep's abort of a committed one). The first decides, as
    a live buffer refuses a second END: a committed transaction is never aborted after
    consumers read it, and an aborted one is never shown, whether the restart replays the
    ledger whole or from a snapshot taken between the two markers."""
    await restart_broker(cluster, snapshot_every=100)  # no snapshot but the test's
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        committed, aborted = client.transaction(), client.transaction()
        await producer.send(b"c", txn=committed)
        await producer.send(b"a", txn=aborted)
        await committed.commit()
        await aborted.abort()
        if snapshot:
            await buffer(cluster).snapshot()
        ledger = cluster.broker.service.topics[NAME].ledger
        now_ms = int(time.time() * 1000)
        for txn, second in ((committed, "ABORT"), (aborted, "COMMIT")):  # as a sweep wrote
            await ledger.append(marker_entry(txn.wire_id, second, now_ms))
        await producer.send(b"after")
        assert await rest(consumer) == [b"c", b"after"]

        await restart_broker(cluster, snapshot_every=100)
        again = await client.subscribe(TOPIC, "again", initial_position="earliest")
        assert await rest(again) == [b"c", b"after"]
        recovered = buffer(cluster)
        assert recovered.recovery["snapshot"] == int(snapshot)
        assert recovered.ongoing == set()
        assert recovered.visible(committed.id, Position(0, 0))
        assert not recovered.visible(aborted.id, Position(0, 0))


async def test_the_coordinators_end_after_the_sweeps_writes_no_second_marker(
    cluster: Cluster,
) -> None:
    """The coordinator decided COMMIT, and its END_TXN_ON_PARTITION is held back past the
    transaction's timeout and grace: the sweep commits it on the topic; the END landing
    after finds it ended and writes nothing."""
    await restart_broker(cluster)
    participants = cluster.coordinator.app[V4].participants
    assert participants is not None  # the coordinator has started
    fan_out = participants.call
    go = asyncio.Event()
    held = 0

    async def late(txn: object, action: object, topic: str, path: str) -> None:
        nonlocal held
        held += 1
        await go.wait()
        await fan_out(txn, action, topic, path)  # type: ignore[arg-type]

    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        txn = client.transaction(timeout_s=1.0)
        await producer.send(b"x", txn=txn)
        participants.call = late  # type: ignore[method-assign]
        try:
            committing = asyncio.create_task(txn.commit(timeout_s=30))
            await wait_until(lambda: held == 1, what="the END held back")
            await wait_until(lambda: not buffer(cluster).ongoing, what="the sweep's commit")
            go.set()
            await committing
        finally:
            participants.call = fan_out  # type: ignore[method-assign]
        assert await txn.status() == "COMMITTED"
        ledger = cluster.broker.service.topics[NAME].ledger
        assert await markers(ledger, txn.wire_id) == ["COMMIT"]
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        assert await rest(consumer) == [b"x"]
