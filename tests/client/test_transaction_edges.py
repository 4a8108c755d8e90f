"""The client's transactional path at its edges, with real brokers and coordinators on
loopback (memory store): a call's own time limit while another starts the transaction; an
abort or a repeated commit after a commit whose answer was lost; pre-started transactions
of timeouts no longer used; batches the broker refuses whole; a v4 registration every
caller gave up on. Each failed before its fix (found by a review)."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import pytest

from segtxn.client import Client, ClientError, ErrorCategory, OutcomeUnknown, Timeout, prestart
from segtxn.client import coordinators as coordinators_module
from segtxn.client.coordinators import Coordinators
from segtxn.protocol.txn import TxnAction
from segtxn.topics import transactions as T
from tests.client.test_timeouts import SLACK_S, timed
from tests.cluster import Cluster
from tests.waiting import wait_until

pytestmark = pytest.mark.parametrize("cluster", ["memory"], indirect=True)

# --------------------------------------------------------------------------- start's limit


async def test_an_operation_joining_a_transactions_start_ends_within_its_own_limit(
    cluster: Cluster, client: Client
) -> None:
    """The first send of a transaction opens it (NEW_TXN) within *its* limit; an ack made
    meanwhile in the same transaction waits for that start within its own ``timeout_s``
    (docs/protocol.md: every call ends within its limit). It waited with no limit: with no
    coordinator answering, it ended at the send's limit."""
    topic = "topic://acme/review/start-limit"
    await client.admin.create_topic(topic, segments=1)
    consumer = await client.subscribe(topic, "sub", initial_position="earliest")
    plain = await client.create_producer(topic)
    await plain.send(b"input")
    message = await consumer.receive(timeout_s=10)
    producer = await client.create_producer(topic, send_timeout_s=6)
    await cluster.coordinator.stop()  # no coordinator answers NEW_TXN now

    txn = client.transaction()
    send = asyncio.create_task(timed(producer.send(b"out", txn=txn)))
    await wait_until(txn._starting.locked, what="the send opening the transaction")
    ack = await timed(consumer.acknowledge(message, txn=txn, timeout_s=0.5))
    assert isinstance(ack.error, Timeout), ack
    sent = await send
    assert isinstance(sent.error, Timeout), sent
    assert ack.elapsed_s < 0.5 + SLACK_S, (
        f"the ack with timeout_s=0.5 ended after {ack.elapsed_s:.1f} s "
        f"(the send that started the transaction: {sent.elapsed_s:.1f} s)"
    )


# ------------------------------------------------------------- abort after an unknown commit


def commit_replies_lost(monkeypatch: pytest.MonkeyPatch) -> list[TxnAction]:
    """END_TXN(COMMIT) reaches the coordinator and is decided, but its reply is lost (the
    client sees the Timeout a paused network gives); returns the actions asked."""
    asked: list[TxnAction] = []
    end = Coordinators.end

    async def lossy(self: Coordinators, txn: Any, action: TxnAction, *args: Any) -> None:
        asked.append(action)
        await end(self, txn, action, *args)
        if action is TxnAction.COMMIT:
            raise Timeout(f"END_TXN {txn}: reply lost", category=ErrorCategory.OUTCOME_UNKNOWN)

    monkeypatch.setattr(Coordinators, "end", lossy)
    return asked


async def test_an_abort_after_an_unknown_commit_does_not_say_the_transaction_cannot_commit(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """commit() raised Timeout (OUTCOME_UNKNOWN) and the application gives the transaction
    up with abort(), which the coordinator refuses: the commit had landed. abort() finds
    out and raises ClientError naming COMMITTED. It raised the coordinator's
    InvalidTxnStatus (ABORTABLE: "start again"), left the transaction COMMITTING and had
    its inputs delivered again: processed twice, the first output committed."""
    topic = "topic://acme/review/abort-after-unknown"
    asked = commit_replies_lost(monkeypatch)
    async with Client(cluster.url, one_step_commit=False) as client:
        await client.admin.create_topic(topic, segments=1)
        producer = await client.create_producer(topic)
        txn = client.transaction()
        await producer.send(b"output", txn=txn)
        with pytest.raises(Timeout) as unknown:
            await txn.commit()
        assert unknown.value.category is ErrorCategory.OUTCOME_UNKNOWN
        assert txn.state == "COMMITTING"
        assert await txn.status() == "COMMITTED"  # what really happened

        outcome = await timed(txn.abort())
        assert asked == [TxnAction.COMMIT, TxnAction.ABORT]
        error = outcome.error
        assert not (
            error is not None and getattr(error, "category", None) is ErrorCategory.ABORTABLE
        ), f"abort() of a committed transaction raised {error!r} (ABORTABLE), state {txn.state}"
        assert isinstance(error, ClientError) and txn.state == "COMMITTED", (error, txn.state)
        assert "COMMITTED" in str(error)
        assert txn.committed_by == "coordinator"


# --------------------------------------------------------------------------- commit again after GC


async def test_a_commit_repeated_after_its_header_was_collected_is_not_reported_aborted(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """END_TXN(COMMIT) landed but its reply was lost: commit() raised Timeout
    (OUTCOME_UNKNOWN, "commit() may be called again"). Called again once the coordinator's
    GC sweep has deleted the final header (``gc_retention_s`` after the participants cleaned
    its op records), END_TXN answers TransactionNotFound: in COMMITTING that says nothing
    about the outcome, so commit() raises OutcomeUnknown and the state stays COMMITTING. It
    was taken for an abort (ABORTED, inputs delivered again), with the output committed."""
    topic = "topic://acme/review/gc-after-unknown"
    commit_replies_lost(monkeypatch)
    async with Client(cluster.url, one_step_commit=False) as client:
        await client.admin.create_topic(topic, segments=1)
        reader = await client.subscribe(topic, "check", initial_position="earliest")
        producer = await client.create_producer(topic)
        txn = client.transaction()
        await producer.send(b"output", txn=txn)
        with pytest.raises(Timeout):
            await txn.commit()
        assert txn.state == "COMMITTING"
        seen = await reader.receive(timeout_s=10)
        assert seen.value == b"output"  # it committed

        async def ops_cleaned() -> bool:
            return not (await cluster.store.list_prefix(T.ops_prefix(txn.id))).records

        await wait_until(ops_cleaned, what="the participants cleaned the op records")
        later_ms = int(time.time() * 1000) + 24 * 3600 * 1000  # past any retention
        assert await cluster.coordinator.coordinator.sweep_gc(now_ms=later_ms) >= 1

        outcome = await timed(txn.commit())
        assert txn.state == "COMMITTING", (
            f"a committed transaction (its output was delivered) is reported {txn.state} "
            f"after commit() again raised {outcome.error!r}"
        )
        assert isinstance(outcome.error, OutcomeUnknown), outcome
        assert outcome.error.category is ErrorCategory.OUTCOME_UNKNOWN


# --------------------------------------------------------------------------- pre-start leak


async def test_spares_of_a_timeout_no_longer_used_are_aborted_and_forgotten(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Client(prestart_transactions=True)`` keeps spares for the most recently used
    kinds of transaction (protocol and ``timeout_s``) only: an application whose
    transactions' ``timeout_s`` varies (a remaining budget, say) kept one kind, with
    transactions held OPEN at the coordinator, for every value it ever used."""
    monkeypatch.setattr(prestart, "PRESTART_MAX_AGE_S", 3600.0)  # none goes stale here
    kinds = coordinators_module.MAX_SPARE_KINDS
    async with Client(cluster.url, prestart_transactions=True) as client:
        for i in range(2 * kinds):
            txn = await client.transaction(timeout_s=30.0 + i).start()
            await txn.commit()
        coordinators = client._coordinators
        assert coordinators is not None
        spares = coordinators._spares
        assert len(spares) == kinds

        async def only_kept_ones_open() -> bool:
            if any(s._opening is not None for s in spares.values()) or coordinators._aborting:
                return False
            kept = sum(len(s._ready) for s in spares.values())
            return len(await cluster.coordinator.coordinator.list_open()) == kept

        await wait_until(only_kept_ones_open, what="the spares of retired kinds aborted")


# ------------------------------------------------------------- batches past the protocol's limit


async def test_a_batch_is_never_larger_than_the_broker_takes(client: Client) -> None:
    """A producer's ``batch_max_messages`` is held to the protocol's 1000 sends per
    ``send_batch`` (docs/protocol.md, "Limits"): a producer allowed more wrote batches the
    broker refused whole with an ``InvalidMessage`` naming no seq, so no send of them was
    answered (each a Timeout, OUTCOME_UNKNOWN though nothing was stored). ``max_pending``
    above it is fine: the batches are cut at the limit."""
    topic = "topic://acme/review/batch-limit"
    await client.admin.create_topic(topic, segments=1)
    with pytest.raises(ValueError, match=r"batch_max_messages must be in 1\.\.1000"):
        await client.create_producer(topic, batch_max_messages=3000)
    producer = await client.create_producer(topic, max_pending=3000, send_timeout_s=10)
    futures = [await producer.send_async(b"m%d" % i, key="k") for i in range(1500)]
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert not failed, f"{len(failed)} of 1500 sends failed, e.g. {failed[0]!r}"


# --------------------------------------------------------------------------- v4 registration task


async def test_a_registration_given_up_by_its_send_leaves_no_unretrieved_error(
    cluster: Cluster,
) -> None:
    """A v4 send registers its topic (ADD_PARTITION) in a task shared by concurrent sends
    (segtxn/client/registrations.py); each caller waits within its own limit. When every
    caller gave up first and the call then fails (no coordinator within the operation
    timeout), its error is taken in and the registration forgotten; asyncio logged "Task
    exception was never retrieved" with a traceback (tests/client/test_unretrieved_errors.py
    holds the client to logging none)."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    topic = "persistent://acme/review/registration"
    try:
        async with Client(cluster.url, operation_timeout_s=1.5, request_timeout_s=0.3) as client:
            await client.admin.create_topic(topic)
            producer = await client.create_producer(topic, send_timeout_s=0.3)
            txn: Any = await client.transaction().start("v4")
            await cluster.coordinator.stop()
            with pytest.raises(Timeout):
                await producer.send(b"x", txn=txn)
            registration = txn._registrations._made[f"partition {topic}"]
            await wait_until(registration.done, what="the registration call ended")
            del registration, txn
            gc.collect()  # an error nobody retrieved is reported when its task is freed
    finally:
        loop.set_exception_handler(None)
    unretrieved = [c for c in reported if "never retrieved" in str(c.get("message"))]
    assert not unretrieved, f"{unretrieved[0]['message']}: {unretrieved[0].get('exception')!r}"
