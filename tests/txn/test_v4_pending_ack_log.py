"""A subscription's v4 pending-ack log (segtxn/broker/txn/pending_ack_log.py) keeps the acks
of the transactions still open and drops the rest: it stays bounded however many
transactions acknowledge through it, a restarted broker holds exactly the open ones' acks
again, and a crash at any step of a compaction loses none of them.

A real broker and coordinator (tests/cluster.py), real files.
"""

from __future__ import annotations

import asyncio

import pytest

from segtxn.aio import CANCEL_GRACE_S
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore, pending_ack_log
from segtxn.client import Client
from segtxn.client.messages import Message
from segtxn.client.transaction import Transaction
from segtxn.ledger import Position
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.protocol.names import TopicName
from segtxn.stopping import LAST_STEP_S, Stopping
from tests.cluster import Cluster
from tests.compaction import (
    CURSOR_MOVED,
    STEPS,
    WITHOUT_PROPERTIES,
    Killed,
    kill,
    stored_ledgers,
)
from tests.txn.test_v4 import metric, restart_broker
from tests.waiting import wait_until

TOPIC = "persistent://acme/v4/acks"
COMPACT_ENTRIES = 20


async def pending_acks(cluster: Cluster) -> MLPendingAckStore:
    topic = await cluster.broker.service.serve(TopicName.parse(TOPIC))
    store = (await topic.subscription("s")).pending_acks
    assert isinstance(store, MLPendingAckStore)
    return store


def position(message: Message) -> Position:
    return Position(message.message_id.ledger_id, message.message_id.entry_id)


async def setup(client: Client, messages: int) -> list[Message]:
    await client.admin.create_topic(TOPIC)
    consumer = await client.subscribe(
        TOPIC, "s", initial_position="earliest", subscription_type="Shared"
    )
    producer = await client.create_producer(TOPIC)
    for i in range(messages):
        await producer.send(f"m{i}".encode())
    received = [await consumer.receive(timeout_s=10) for _ in range(messages)]
    client.__dict__["consumer"] = consumer  # (kept for the test's acks)
    return received


async def test_the_pending_ack_log_stays_bounded_and_keeps_the_open_acks(
    cluster: Cluster,
) -> None:
    await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
    async with Client(cluster.url) as client:
        received = await setup(client, 150)
        consumer = client.__dict__["consumer"]
        held: dict[Transaction, Message] = {}
        for message in received[:3]:  # three transactions stay open, holding one ack each
            txn = client.transaction()
            await consumer.acknowledge(message, txn=txn)
            held[txn] = message
        pending = await pending_acks(cluster)
        largest = 0
        for message in received[3:]:  # each: its ack logged, then its COMMIT
            txn = client.transaction()
            await consumer.acknowledge(message, txn=txn)
            await txn.commit()
            largest = max(largest, pending.log_entries)
        compactions = metric(cluster, 'segtxn_txn_v4_log_compactions_total{log="pending_ack"')
        entries = metric(cluster, "segtxn_txn_v4_pending_ack_log_entries")
        now = pending.log_bytes
        print(f"at most {largest} entries ({now} bytes now), {compactions:.0f} compactions")
        # 2 entries a transaction, 3 kept, and a compaction runs in the background
        assert largest <= COMPACT_ENTRIES + 3 + 4
        assert compactions >= (2 * 147) // (COMPACT_ENTRIES + 4)
        assert entries == pending.log_entries
        await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
        pending = await pending_acks(cluster)
        assert pending.transactions() == {t.id for t in held}
        assert all(pending.is_pending(position(m)) for m in held.values())
        assert not any(pending.is_pending(position(m)) for m in received[3:])
        for txn in held:
            await txn.commit()
        stats = await client.admin.stats(TOPIC)
        assert stats["subscriptions"]["s"]["backlog"] == 0


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
@pytest.mark.parametrize("step", sorted(set(STEPS) - WITHOUT_PROPERTIES))
async def test_a_crash_at_each_step_of_a_compaction_keeps_the_open_acks(
    cluster: Cluster, step: str
) -> None:
    async with Client(cluster.url) as client:
        received = await setup(client, 16)
        consumer = client.__dict__["consumer"]
        for message in received[6:]:  # ten ended ones: what the compaction drops
            txn = client.transaction()
            await consumer.acknowledge(message, txn=txn)
            await txn.commit()
        pending = await pending_acks(cluster)
        assert pending._log is not None
        await pending._log.close()  # reopened at the next ack, on a new ledger: the
        pending._log = None  # compaction's trim then deletes two
        held: dict[Transaction, list[Message]] = {}
        for i in range(3):  # three open transactions, two acks each
            txn = client.transaction()
            held[txn] = received[2 * i : 2 * i + 2]
            for message in held[txn]:
                await consumer.acknowledge(message, txn=txn)
        log_ = pending._log
        assert log_ is not None
        STEPS[step](log_, log_._storage, 1)
        with pytest.raises(Killed):
            await pending.compact()
        await kill(log_)
        pending._log = None  # (dead: the broker's stop must not close it cleanly)

        await restart_broker(cluster)  # the next process
        pending = await pending_acks(cluster)
        assert pending.transactions() == {t.id for t in held}
        for messages in held.values():
            assert all(pending.is_pending(position(m)) for m in messages)
        assert pending._log is not None
        if step in CURSOR_MOVED:
            assert pending.log_entries == 3  # one re-logged op per open transaction
        name = pending._log.ledger.name
        assert stored_ledgers(pending._log._storage, name) == set(pending._log.ledger.ledger_ids)
        for txn in held:
            await txn.commit()
        stats = await client.admin.stats(TOPIC)
        assert stats["subscriptions"]["s"]["backlog"] == 0


async def test_a_close_during_a_compactions_rollover_records_the_clean_close(
    cluster: Cluster,
) -> None:
    """A broker's stop closes each subscription's pending-ack log, cancelling a compaction
    in flight. Cancelled while its rollover's CAS was in flight (landed, answer not yet
    back), the ledger took the rollover for failed, and the close's own write then found
    it: LedgerFenced "a rollover of its own landed though it seemed to fail" (seen in CI
    under load), and the log's clean close was lost."""
    await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
    async with Client(cluster.url) as client:
        received = await setup(client, 40)
        consumer = client.__dict__["consumer"]
        open_txns = {client.transaction(): received[0]}  # holds its ack across the close
        await consumer.acknowledge(received[0], txn=next(iter(open_txns)))
        pending = await pending_acks(cluster)
        key = metadata_key(pending_ack_log(TOPIC, "s"))
        rollover = cluster.faults.hold("txn", key_prefix=key)  # the log's next metadata write
        for message in received[1:]:  # an ack or a COMMIT starts it (the next one would
            txn = client.transaction()  # wait for its end)
            await consumer.acknowledge(message, txn=txn)
            if pending._compaction is not None:
                open_txns[txn] = message
                break
            await txn.commit()
            if pending._compaction is not None:
                break
        compaction = pending._compaction
        assert compaction is not None, "no compaction started"
        await rollover.wait_for(1)  # applied in the store, its answer parked
        closing = asyncio.create_task(pending.close())
        await wait_until(lambda: compaction.done() or compaction.cancelling() > 0)
        rollover.release()
        await closing  # raised LedgerFenced
        record = await cluster.store.get(key)
        assert record is not None
        assert decode(record.value).ledgers[-1].entries is not None, "no clean close recorded"

        await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
        pending = await pending_acks(cluster)
        assert pending.transactions() == {t.id for t in open_txns}
        assert all(pending.is_pending(position(m)) for m in open_txns.values())
        for txn in open_txns:
            await txn.commit()
        await wait_until(lambda: not pending.transactions(), what="the commit applied")


async def test_a_stop_step_closing_a_pending_ack_log_ends_in_its_time_while_the_store_is_silent(
    cluster: Cluster,
) -> None:
    """The close cancels the compaction (its rollover's CAS in flight: it ends within the
    grace), then closes the log in a ``finally``, with a clean-close CAS: a second
    metadata change under the one cancel of the stop's step. Made once that cancel was
    taken, it had no grace at all: with the store silent, the step never ended (the
    broker's stop, the CLI's --shutdown-timeout, held for ever). It now gets the grace of
    the cancel the close unwinds from (segtxn.aio.run_to_end)."""
    await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
    async with Client(cluster.url) as client:
        received = await setup(client, 40)
        consumer = client.__dict__["consumer"]
        held_txn = client.transaction()
        await consumer.acknowledge(received[0], txn=held_txn)
        pending = await pending_acks(cluster)
        key = metadata_key(pending_ack_log(TOPIC, "s"))
        silent = cluster.faults.hold("txn", key_prefix=key, times=None)  # every write's answer
        step: asyncio.Task[None] | None = None
        try:
            for message in received[1:]:
                txn = client.transaction()
                await consumer.acknowledge(message, txn=txn)
                if pending._compaction is not None:
                    break
                await txn.commit()
                if pending._compaction is not None:
                    break
            assert pending._compaction is not None, "no compaction started"
            await silent.wait_for(1)  # the rollover's CAS applied, its answer parked
            stopping = Stopping("a broker's stop", limit_s=0)  # its step gets LAST_STEP_S
            step = asyncio.create_task(stopping.step("closing the log", pending.close()))
            bound = LAST_STEP_S + 2 * CANCEL_GRACE_S + 2.0  # (2: slack on a loaded machine)
            done, _ = await asyncio.wait({step}, timeout=bound)
            assert step in done, (
                "the stop's step closing the pending-ack log did not end in its time: the "
                "clean close, made after its cancel was taken, waits for the store"
            )
        finally:
            silent.release()
            cluster.faults.clear()
            if step is not None:
                await asyncio.gather(step, return_exceptions=True)
            # (its log closed under it, the subscription is served again by a new broker)
            await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)


async def test_a_close_run_while_its_caller_unwinds_from_a_cancel_ends_within_one_grace(
    cluster: Cluster,
) -> None:
    """A topic's close cut by a cancel closes its subscriptions in its handler
    (segtxn/broker/topic.py), so a pending-ack log's close runs while its caller unwinds
    from that cancel. The close cancels its compaction (the rollover's CAS in flight), waits
    for it, then writes its clean close. The compaction's cancel was a new one, with a grace
    of its own, and the clean close's write then began the grace of the caller's cancel:
    with the store silent, the close ended two graces after the cancel. One cancel, one
    grace (segtxn.aio.cancel): both changes now share it."""
    await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
    async with Client(cluster.url) as client:
        received = await setup(client, 40)
        consumer = client.__dict__["consumer"]
        await consumer.acknowledge(received[0], txn=client.transaction())
        pending = await pending_acks(cluster)
        key = metadata_key(pending_ack_log(TOPIC, "s"))
        silent = cluster.faults.hold("txn", key_prefix=key, times=None)  # every write's answer
        closing: asyncio.Task[None] | None = None
        try:
            for message in received[1:]:
                txn = client.transaction()
                await consumer.acknowledge(message, txn=txn)
                if pending._compaction is not None:
                    break
                await txn.commit()
                if pending._compaction is not None:
                    break
            assert pending._compaction is not None, "no compaction started"
            await silent.wait_for(1)  # the rollover's CAS applied, its answer parked
            waiting = asyncio.Event()

            async def closes_when_cancelled() -> None:
                try:
                    waiting.set()
                    await asyncio.Event().wait()
                finally:
                    await pending.close()

            closing = asyncio.create_task(closes_when_cancelled())
            await waiting.wait()
            loop = asyncio.get_running_loop()
            cancelled_at = loop.time()
            closing.cancel()
            await asyncio.wait({closing}, timeout=2 * CANCEL_GRACE_S + 2.0)
            took = loop.time() - cancelled_at
            assert closing.done(), "the close did not end in two graces"
            assert took < 1.5 * CANCEL_GRACE_S, (
                f"the close ended {took:.2f} s after its caller's cancel: a grace for each "
                "of its two metadata changes, not one for the cancel"
            )
        finally:
            silent.release()
            cluster.faults.clear()
            if closing is not None:
                await asyncio.gather(closing, return_exceptions=True)
            await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
