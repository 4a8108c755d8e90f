"""The v4 checks' sweep (segtxn/broker/txn/v4checks.py) racing what else ends a transaction
or closes its participants. On both stores, with real servers and files; the races are
made with events (the coordinator's END held back, a marker's append parked), never with
sleeps.

A transaction wrote to two topics; its coordinator decided COMMIT, and its END is held back
past the transaction's timeout: the sweep commits it on each topic, one after the other.

1. The coordinator's END lands on the second topic while the sweep ends the first: the
   sweep's end there then finds it ended and does nothing, yet the sweep logged it at
   WARNING as "committed ... by this broker" and counted it in
   ``segtxn_txn_v4_ended_by_broker_total``: an operator was told the broker ended a
   transaction its coordinator had ended.
2. The second topic is unloaded while the sweep ends the first (before the sweep reaches
   it, or while the sweep ends it there): the sweep's end on the closed instance raised
   ``LedgerClosed`` (its marker's append), not a ``ServerError``, out of the sweep round,
   which failed (logged with a traceback) and left the rest of the round undone. The
   closed instance is now passed over (DEBUG); the reloaded one recovers the transaction
   open, and the next round ends it there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.entry import decode_entry
from segtxn.broker.settings import V4TxnSettings
from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.client import Client, Transaction
from segtxn.coordinator.app import V4
from segtxn.ledger import ManagedLedger, Position
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import ContendedLock, wait_until

T1 = "persistent://acme/v4sweep/t1"
T2 = "persistent://acme/v4sweep/t2"
MANUAL = V4TxnSettings(check_timeout_s=2.0, grace_s=0.0, max_timeout_s=1.0, sweep_s=3600)
"""No grace, and no sweep but the test's own (``sweep()``), run when it chooses."""


async def restart_broker(cluster: Cluster) -> None:
    """The broker again on the same store and files, with the sweep left to the test."""
    settings = dataclasses.replace(cluster.broker.settings, v4_txns=MANUAL)
    await cluster.broker.stop()
    cluster.broker = BrokerServer(settings, store=cluster.store)
    await cluster.broker.start()


def buffer(cluster: Cluster, topic: str) -> MarkerTransactionBuffer:
    found = cluster.broker.service.topics[TopicName.parse(topic)].buffer
    assert isinstance(found, MarkerTransactionBuffer)
    return found


def ledger(cluster: Cluster, topic: str) -> ManagedLedger:
    return cluster.broker.service.topics[TopicName.parse(topic)].ledger


class ParkedMarkers:
    """Park the markers of one transaction appended to a topic's ledger (:attr:`parked`),
    until :attr:`go`: once they are durable, before their appender goes on, or (``before``)
    before they are appended."""

    def __init__(self, ledger: ManagedLedger, txn: tuple[int, int], *, before: bool) -> None:
        self.parked, self.go = asyncio.Event(), asyncio.Event()
        append: Callable[[bytes], Awaitable[Position]] = ledger.append

        async def park(payload: bytes) -> None:
            message = decode_entry(payload)
            if message.marker is not None and message.txn == txn:
                self.parked.set()
                await self.go.wait()

        async def parked(payload: bytes) -> Position:
            if before:
                await park(payload)
            at = await append(payload)
            if not before:
                await park(payload)
            return at

        ledger.append = parked  # type: ignore[method-assign]


async def markers(ledger: ManagedLedger, txn: tuple[int, int]) -> list[str]:
    """The markers of ``txn`` in a topic's ledger, in order."""
    found: list[str] = []
    start = ledger.first_position()
    while start is not None and (entries := await ledger.read(start, max_entries=1000)):
        for entry in entries:
            message = decode_entry(entry.payload)
            if message.marker is not None and message.txn == txn:
                found.append(message.marker)
        start = ledger.position_after(entries[-1].position)
    return found


class HeldEnds:
    """The coordinator's END_TXN_ON_PARTITION calls, held back per topic until let go."""

    def __init__(self, cluster: Cluster) -> None:
        participants = cluster.coordinator.app[V4].participants
        assert participants is not None  # the coordinator has started
        self._participants = participants
        self._fan_out = participants.call
        self.released = {T1: asyncio.Event(), T2: asyncio.Event()}
        self.held = 0
        """Calls held so far: one per topic once the coordinator has decided."""

        async def late(txn: object, action: object, topic: str, path: str) -> None:
            self.held += 1
            await self.released[topic].wait()
            await self._fan_out(txn, action, topic, path)  # type: ignore[arg-type]

        participants.call = late  # type: ignore[method-assign]

    def restore(self) -> None:
        for released in self.released.values():
            released.set()
        self._participants.call = self._fan_out  # type: ignore[method-assign]


async def past_its_timeout(cluster: Cluster, txn: Transaction) -> None:
    """Wait until the broker's sweep takes ``txn`` for due (no grace)."""
    tracked = cluster.broker.service.v4_checks._tracked[txn.id]
    assert tracked.deadline_ms is not None
    deadline_ms = tracked.deadline_ms
    await wait_until(lambda: time.time() * 1000 > deadline_ms, what="the transaction's timeout")


def ended_here(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "by this broker" in r.getMessage()]


async def test_a_participant_its_coordinators_end_reached_meanwhile_is_not_counted_as_ended_here(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="segtxn.broker.txn.v4checks")
    await restart_broker(cluster)
    checks = cluster.broker.service.v4_checks
    async with Client(cluster.url) as client:
        for topic in (T1, T2):
            await client.admin.create_topic(topic)
        producers = [await client.create_producer(topic) for topic in (T1, T2)]
        txn = client.transaction(timeout_s=1.0)
        for producer in producers:
            await producer.send(b"x", txn=txn)
        parked = {t: ParkedMarkers(ledger(cluster, t), txn.wire_id, before=False) for t in (T1, T2)}
        locks = {t: ContendedLock() for t in (T1, T2)}
        for topic, lock in locks.items():  # (the sends left the transaction's lock there)
            buffer(cluster, topic)._locks[txn.id] = lock
        held = HeldEnds(cluster)
        committing: asyncio.Task[None] | None = None
        sweeping: asyncio.Task[int] | None = None
        try:
            committing = asyncio.create_task(txn.commit(timeout_s=30))
            await wait_until(lambda: held.held == 2, what="COMMIT decided, its END held back")
            await past_its_timeout(cluster, txn)
            sweeping = asyncio.create_task(checks.sweep())
            await wait_until(
                lambda: any(p.parked.is_set() for p in parked.values()),
                what="the sweep's first marker",
            )
            first = next(t for t, p in parked.items() if p.parked.is_set())
            second = T2 if first == T1 else T1
            held.released[second].set()  # the coordinator's END on the second topic
            await asyncio.wait_for(parked[second].parked.wait(), 10)  # its marker, durable
            parked[first].go.set()  # the sweep goes on to the second topic: its END waits
            await asyncio.wait_for(locks[second].contended.wait(), 10)  # for the coordinator's
            parked[second].go.set()
            assert await asyncio.wait_for(sweeping, 10) == 1
            held.released[first].set()  # (the sweep has ended it there: nothing to do)
            await asyncio.wait_for(committing, 30)
        finally:
            held.restore()
            for p in parked.values():
                p.go.set()
            await asyncio.gather(
                *(t for t in (committing, sweeping) if t is not None), return_exceptions=True
            )
    said = ended_here(caplog)
    assert len(said) == 1 and f"committed on {first} by this broker" in said[0], said
    counted = cluster.broker.service.metrics.txn_v4_ended_here.values
    assert sum(counted.values()) == 1, counted


@pytest.mark.parametrize("while_ending", [False, True], ids=["before-it-gets-there", "while-there"])
async def test_a_participant_unloaded_during_a_sweep_is_passed_over_and_ended_once_reloaded(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, while_ending: bool
) -> None:
    caplog.set_level(logging.DEBUG, logger="segtxn.broker.txn.v4checks")
    await restart_broker(cluster)
    service = cluster.broker.service
    checks = service.v4_checks
    async with Client(cluster.url) as client:
        for topic in (T1, T2):
            await client.admin.create_topic(topic)
        producers = [await client.create_producer(topic) for topic in (T1, T2)]
        txn = client.transaction(timeout_s=1.0)
        for producer in producers:
            await producer.send(b"x", txn=txn)
        parked = {t: ParkedMarkers(ledger(cluster, t), txn.wire_id, before=True) for t in (T1, T2)}
        held = HeldEnds(cluster)
        committing: asyncio.Task[None] | None = None
        sweeping: asyncio.Task[int] | None = None
        try:
            committing = asyncio.create_task(txn.commit(timeout_s=30))
            await wait_until(lambda: held.held == 2, what="COMMIT decided, its END held back")
            await past_its_timeout(cluster, txn)
            sweeping = asyncio.create_task(checks.sweep())
            await wait_until(
                lambda: any(p.parked.is_set() for p in parked.values()),
                what="the sweep at its first topic",
            )
            first = next(t for t, p in parked.items() if p.parked.is_set())
            second = T2 if first == T1 else T1
            if while_ending:
                parked[first].go.set()
                await asyncio.wait_for(parked[second].parked.wait(), 10)  # the sweep there
            await service.unload(TopicName.parse(second))
            for p in parked.values():
                p.go.set()
            assert await asyncio.wait_for(sweeping, 10) == 1  # the round went on, and ended
            await service.serve(TopicName.parse(second))  # reloaded: it recovers it open
            assert txn.id in checks.tracked
            assert await checks.sweep() == 1
            for released in held.released.values():
                released.set()
            await asyncio.wait_for(committing, 30)
        finally:
            held.restore()
            for p in parked.values():
                p.go.set()
            await asyncio.gather(
                *(t for t in (committing, sweeping) if t is not None), return_exceptions=True
            )
        for topic in (T1, T2):
            assert await markers(ledger(cluster, topic), txn.wire_id) == ["COMMIT"], topic
            assert buffer(cluster, topic).ongoing == set()
    said = ended_here(caplog)
    assert len(said) == 2, said
    assert f"committed on {first} by this broker" in said[0], said
    assert f"committed on {second} by this broker" in said[1], said
    others = [
        r.getMessage()
        for r in caplog.records
        if r.name == "segtxn.broker.txn.v4checks" and r.levelno >= logging.WARNING
    ]
    assert others == said, others  # no failed round, no failed end
    passed_over = "was closed while it was ended" if while_ending else "passed over"
    assert any(
        second in r.getMessage() and passed_over in r.getMessage() for r in caplog.records
    ), caplog.text
