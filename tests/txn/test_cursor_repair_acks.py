"""Transactional acknowledgements across a cursor repair (docs/ledger.md, "Repairing a
damaged cursor"): a consumer acknowledges messages inside a transaction still open, the
subscription's cursor record is damaged and repaired (to the earliest retained entry),
and the transaction is committed or aborted, after the repair or before it.

What must hold, on a ``persistent://`` topic (v4: its pending-ack log) and a
``segment://`` one (v5: its acks op records): the commit and the abort end within a
bound, or fail at once with an error that says why (never an internal error); the topic
loads; a committed transaction's acks are applied to the repaired cursor (its messages
are not delivered again, everything else retained is), an aborted one's are released
(its messages come again); and no transaction holds an ack after it ended (every message
can be acknowledged, the backlog drains).

Real components: the test cluster (broker and coordinator) on the memory store and etcd.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import pytest

from segtxn.client import Client, Message
from segtxn.client.consumer import Consumer
from segtxn.client.transaction import Transaction
from segtxn.coordinator.app import V4 as V4_COORDINATOR
from segtxn.coordinator.txnlog import COMMITTED, COMMITTING
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.ledger.cursor import cursor_key
from segtxn.protocol.errors import PersistenceError, ServiceNotReady
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster, create_and_send
from tests.waiting import wait_until

SUB = "s"
GARBAGE = b"\xff{damaged"
COUNT = 6
TRIES = 4
"""The failed tries of a background commit a test waits for."""
END_BOUND_S = 30.0
"""Longer than the coordinator's fan-out timeout and the client's operation timeout: an end
still running then hangs."""


@dataclass(frozen=True)
class Case:
    topic: str
    """What the consumer subscribes to."""
    ledger: str
    """Whose cursor record is damaged and repaired (a ``topic://``'s segment)."""
    options: dict[str, Any]

    @property
    def name(self) -> TopicName:
        return TopicName.parse(self.ledger)

    async def subscribe(self, client: Client) -> Consumer:
        return await client.subscribe(self.topic, SUB, initial_position="earliest", **self.options)


V4 = Case("persistent://acme/repair-acks/v4", "persistent://acme/repair-acks/v4",
          {"subscription_type": "Failover"})  # fmt: skip
V5 = Case("topic://acme/repair-acks/v5", "segment://acme/repair-acks/v5/0", {})
CASES = {"v4": V4, "v5": V5}


async def _held_by_an_open_transaction(
    client: Client, case: Case, *, cumulative: bool = False
) -> Transaction:
    """m0..m5 stored, all received; m0 acknowledged plainly, m1 and m2 in a transaction
    left open (individually, or cumulatively up to m2); the consumer closed (the topic
    stays loaded). Returns the transaction."""
    if case is V4:
        await create_and_send(client, case.topic, *(b"m%d" % i for i in range(COUNT)))
    else:
        await client.admin.create_topic(case.topic, segments=1)
        producer = await client.create_producer(case.topic)
        for i in range(COUNT):
            await producer.send(b"m%d" % i, key="k")
        await producer.close()
    consumer = await case.subscribe(client)
    got = [await consumer.receive(timeout_s=10) for _ in range(COUNT)]
    await consumer.acknowledge(got[0])
    txn = client.transaction()
    if cumulative:
        await consumer.acknowledge_cumulative(got[2], txn=txn)
    else:
        for message in got[1:3]:
            await consumer.acknowledge(message, txn=txn)
    await consumer.close()
    return txn


async def _end(txn: Transaction, commit: bool) -> None:
    async with asyncio.timeout(END_BOUND_S):  # ends, or fails: never hangs
        await (txn.commit() if commit else txn.abort())


async def _delivered_again_then_drained(
    client: Client, cluster: Cluster, case: Case, expected: list[int]
) -> None:
    """A consumer gets exactly m<i> for each of ``expected``, in order; once it has
    acknowledged them, no transaction holds an ack and the subscription's backlog is 0."""
    consumer = await case.subscribe(client)
    delivered: list[Message] = [await consumer.receive(timeout_s=10) for _ in expected]
    assert [m.value for m in delivered] == [b"m%d" % i for i in expected]
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout_s=0.3)  # bounded absence: nothing more comes
    for message in delivered:
        await consumer.acknowledge(message)
    subscription = cluster.broker.service.topics[case.name].subscriptions[SUB]
    assert not subscription.pending_acks.transactions(), "an ended transaction holds acks"

    async def drained() -> bool:
        stats: dict[str, Any] = await client.admin.stats(case.ledger)
        return bool(stats["subscriptions"][SUB]["backlog"] == 0)

    await wait_until(drained, timeout=10, what="the subscription's backlog drained")
    await consumer.close()


@pytest.mark.parametrize("cumulative", [False, True], ids=["individual", "cumulative"])
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
@pytest.mark.parametrize("protocol", ["v4", "v5"])
async def test_a_transactions_acks_survive_a_repair_of_their_cursor(
    client: Client, cluster: Cluster, protocol: str, commit: bool, cumulative: bool
) -> None:
    """The record damaged under the loaded topic, repaired to the earliest (the repair
    unloads the topic), then the transaction ends. Its acks were held again when the
    topic loaded (v4: its log replayed; v5: its records read). Committed: m1, m2 stay
    acknowledged, and m0 (whose plain ack the repair forgot; a cumulative commit up to m2
    acknowledges it again) and m3..m5 come again. Aborted: every message comes again."""
    case = CASES[protocol]
    txn = await _held_by_an_open_transaction(client, case, cumulative=cumulative)
    assert case.name in cluster.broker.service.topics
    await cluster.store.put(cursor_key(case.ledger, SUB), GARBAGE)

    repaired = await client.admin.repair_cursor(case.ledger, SUB)
    assert repaired["start"].endswith(":0")
    await _end(txn, commit)

    expected = ([3, 4, 5] if cumulative else [0, 3, 4, 5]) if commit else list(range(COUNT))
    await _delivered_again_then_drained(client, cluster, case, expected)


@pytest.mark.parametrize("loaded", [True, False], ids=["loaded", "unloaded"])
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
@pytest.mark.parametrize("protocol", ["v4", "v5"])
async def test_a_transaction_ended_before_the_repair_ends_or_says_why_and_ends_after_it(
    client: Client, cluster: Cluster, protocol: str, commit: bool, loaded: bool
) -> None:
    """The transaction ends while the record is damaged (the topic still loaded from
    before, or not). v5 ends at once (its outcome is its header's; the acks are applied
    when the segment loads). A v4 end that needs the cursor fails at once with
    PersistenceError naming the record and its repair: unloaded, the topic does not load;
    loaded, the commit's cursor save is refused by the damaged record's version (that was
    an internal error, its cause only in the broker's log). The same end after the
    repair ends; its acks are applied or released as after a repair."""
    case = CASES[protocol]
    txn = await _held_by_an_open_transaction(client, case)
    if not loaded:
        await cluster.broker.service.unload(case.name)
    key = cursor_key(case.ledger, SUB)
    await cluster.store.put(key, GARBAGE)

    if case is V4 and (commit or not loaded):
        with pytest.raises(PersistenceError) as refused:
            await _end(txn, commit)
        assert key in str(refused.value)
        assert "segtxn topics repair-cursor" in str(refused.value)
        await client.admin.repair_cursor(case.ledger, SUB)
        await _end(txn, commit)  # the same end again
    else:
        await _end(txn, commit)
        await client.admin.repair_cursor(case.ledger, SUB)

    expected = [0, 3, 4, 5] if commit else list(range(COUNT))
    await _delivered_again_then_drained(client, cluster, case, expected)


async def test_a_v4_end_whose_cursor_another_owner_saved_is_retried_then_applied(
    client: Client, cluster: Cluster
) -> None:
    """The loaded topic's cursor record rewritten whole by another owner (a record that
    reads, as a broker that took the topic over saves it): this broker's END save is
    refused. The topic is moving, not damaged, so the END answers ServiceNotReady, which
    the coordinator retries, not PersistenceError, which fails the client's END_TXN at
    once; and this broker lets the topic go by itself (its cursor is stale, and only a
    load reads the record: ``CursorOverwritten``), after which the same END loads it and
    applies the acks."""
    txn = await _held_by_an_open_transaction(client, V4)
    service = cluster.broker.service
    topic = service.topics[V4.name]
    key = cursor_key(V4.ledger, SUB)
    record = await cluster.store.get(key)
    assert record is not None
    await cluster.store.put(key, record.value)  # another owner's save: a new version
    end = (
        f"{cluster.url}/admin/v2/persistent/acme/repair-acks/v4/subscription/{SUB}/txn/{txn.id}/end"
    )
    with pytest.raises(ServiceNotReady):
        await client.connector.request("POST", end, params={"action": "COMMIT"})

    await wait_until(
        lambda: service.topics.get(V4.name) is not topic and not service.dropping,
        what="the topic let go of",
    )
    await client.connector.request("POST", end, params={"action": "COMMIT"})
    subscription = cluster.broker.service.topics[V4.name].subscriptions[SUB]
    assert not subscription.pending_acks.transactions(), "the commit's acks are still held"


async def test_a_v4_commit_recovery_finishes_once_the_cursor_is_repaired(
    client: Client, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit refused with PersistenceError (the loaded topic's cursor record damaged)
    stays COMMITTING; the coordinator that takes its id over finishes it in the background
    and meets the same refusal, again and again, until an operator repairs the record;
    then it is COMMITTED with no client asking again, its acks applied. Its tries say so
    once at WARNING (the others at DEBUG: many transactions stuck on one cursor must not
    flood the log), and once at INFO when it went through. Recovery gave up at the first
    PersistenceError: the decision was logged but never reached the subscription, whose
    acks stayed held until a client ended the transaction again or another take-over; and
    every try was a WARNING, twice (the fan-out's and the loop's)."""
    caplog.set_level(logging.DEBUG, logger="segtxn.coordinator")
    txn = await _held_by_an_open_transaction(client, V4)
    key = cursor_key(V4.ledger, SUB)
    await cluster.store.put(key, GARBAGE)
    with pytest.raises(PersistenceError):
        await _end(txn, commit=True)
    assert await txn.status() == COMMITTING

    await cluster.coordinator.app[V4_COORDINATOR].stop()  # the process goes; its log stays
    caplog.clear()
    successor = CoordinatorV4(cluster.store, cluster.coordinator.settings)
    await successor.start()
    retried = f"txn {txn.id}: finishing its COMMIT failed ({TRIES} in a row): ServerError: "

    def said(level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == level and r.getMessage().startswith(f"txn {txn.id}: ")
        ]

    def state() -> str | None:
        held = successor.held.get(txn.id.most)
        meta = None if held is None else held.txns.get(txn.id.least)
        return None if meta is None else meta.state

    try:
        await wait_until(
            lambda: any(
                r.getMessage().startswith(f"{retried}PersistenceError") and key in r.getMessage()
                for r in caplog.records
            ),
            timeout=10,  # (its tries follow each other within 0.5 s)
            what=f"the recovered commit refused {TRIES} times",
        )
        assert state() == COMMITTING
        assert len(said(logging.WARNING)) == 1, said(logging.WARNING)
        assert not said(logging.ERROR)
        await client.admin.repair_cursor(V4.ledger, SUB)  # the operator's repair
        await wait_until(lambda: state() == COMMITTED, timeout=END_BOUND_S, what="COMMITTED")
        assert len(said(logging.WARNING)) == 1, said(logging.WARNING)
        (went_through,) = [m for m in said(logging.INFO) if "failures in a row" in m]
        assert went_through.startswith(f"txn {txn.id}: finishing its COMMIT"), went_through
        await _delivered_again_then_drained(client, cluster, V4, [0, 3, 4, 5])
    finally:
        await successor.stop()


def _finishing(txn: Transaction) -> list[asyncio.Task[Any]]:
    """The coordinator's background tasks finishing ``txn`` (CoordinatorV4._resume)."""
    name = f"v4-finish-{txn.id.least:x}"
    return [t for t in asyncio.all_tasks() if t.get_name() == name and not t.done()]


async def test_a_v4_commit_refused_by_a_participant_is_finished_by_the_coordinator(
    client: Client, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's commit refused with PersistenceError (the loaded topic's cursor record
    damaged) was logged: the answer says so (COMMITTING, the coordinator applying it), and
    the coordinator goes on in the background, one loop however often the client asks
    again, until the operator's repair lets it through: COMMITTED, its acks applied, with
    no client asking. The answer was the participant's refusal alone, and nothing went on:
    the transaction stayed COMMITTING until the client asked again or a take-over. The
    client's refusals and the loop's tries are one WARNING in all."""
    caplog.set_level(logging.DEBUG, logger="segtxn.coordinator")
    txn = await _held_by_an_open_transaction(client, V4)
    key = cursor_key(V4.ledger, SUB)
    await cluster.store.put(key, GARBAGE)
    for _ in range(2):  # the client asks again: the same answer, still one loop
        with pytest.raises(PersistenceError) as refused:
            await _end(txn, commit=True)
        message = str(refused.value)
        assert key in message and "segtxn topics repair-cursor" in message, message
        assert "COMMITTING" in message and "goes on" in message, message
        assert len(_finishing(txn)) == 1
    tried = f"txn {txn.id}: finishing its COMMIT failed ({TRIES} in a row)"
    await wait_until(
        lambda: any(r.getMessage().startswith(tried) for r in caplog.records),
        what=f"the coordinator's commit refused {TRIES} times",
    )
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.getMessage().startswith(f"txn {txn.id}: ")
    ]
    assert len(warnings) == 1, warnings
    assert await txn.status() == COMMITTING

    await client.admin.repair_cursor(V4.ledger, SUB)  # the operator's repair; nobody asks
    await wait_until(
        lambda: cluster.coordinator.app[V4_COORDINATOR].status(txn.id).state == COMMITTED,
        timeout=END_BOUND_S,
        what="COMMITTED by the coordinator alone",
    )
    await wait_until(lambda: not _finishing(txn), what="the coordinator's finishing ended")
    await _delivered_again_then_drained(client, cluster, V4, [0, 3, 4, 5])


async def test_a_v4_commit_asked_again_after_the_repair_ends_the_coordinators_loop(
    client: Client, cluster: Cluster
) -> None:
    """The client asks again once the record is repaired: its END_TXN succeeds, and the
    coordinator's loop for it ends (the transaction is final), whoever of the two got
    through first: it is committed once (one final state logged), its acks applied."""
    txn = await _held_by_an_open_transaction(client, V4)
    await cluster.store.put(cursor_key(V4.ledger, SUB), GARBAGE)
    with pytest.raises(PersistenceError):
        await _end(txn, commit=True)
    assert len(_finishing(txn)) == 1
    coordinator = cluster.coordinator.app[V4_COORDINATOR]
    committed = coordinator.counters["committed"]

    await client.admin.repair_cursor(V4.ledger, SUB)
    await _end(txn, commit=True)  # the client asks again
    assert coordinator.status(txn.id).state == COMMITTED
    await wait_until(lambda: not _finishing(txn), what="the coordinator's loop ended")
    assert coordinator.counters["committed"] == committed + 1
    await _delivered_again_then_drained(client, cluster, V4, [0, 3, 4, 5])
