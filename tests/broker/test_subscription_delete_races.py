"""A subscription's deletion and a consumer attaching to it at the same time
(segtxn/broker/subscriptions.py, ``Subscriptions.delete_subscription`` and
``Subscriptions.subscription``).

The deletion checked "no consumer" and then awaited (the check of its v4 pending-ack log's
files: a store read, a thread) without taking the lock a consumer attaching takes. After a
reset the subscription is unloaded; a consumer attaching meanwhile loaded it again and
opened its log, and the deletion went on with what it had seen before: it deleted the open
log's files and record and the cursor under the live consumer, and the subscription's later
close failed. Either the deletion is refused (a consumer attached: ConsumerBusy, nothing
deleted) or it goes first, whole, and the consumer attaches afterwards; never a log or
cursor deleted under a loaded subscription.

A topic's deletion (``Topic.delete``, ``Subscriptions.delete``) did not wait for a
subscription's load in flight either: the log the load opened was deleted and written
afresh by it, left behind the deleted topic. Nor did its unload (``Topic.close``): the load
opened the log after the topic was closed, beside the instance loaded again meanwhile.

Real components: the cluster's broker and coordinator on its store (memory and a real etcd),
files in ``tmp_path``; the interleaving is a held store read of the log's metadata.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from segtxn.broker.dispatch import Subscription
from segtxn.broker.topic import Topic
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore, pending_ack_log
from segtxn.client import Client, ServerError
from segtxn.ledger import ManagedLedger
from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.metadata import metadata_key
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster, acked_in_txn, create_and_send
from tests.waiting import ContendedLock, wait_until

TOPIC = "persistent://acme/subrace/t"
LOG = pending_ack_log(TOPIC, "s")


async def test_a_consumer_attaching_while_its_subscription_is_deleted_keeps_its_log(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0", b"m1")
        await producer.close()
        consumer = await acked_in_txn(client, TOPIC, "s", commit=True)  # its v4 log is made
        await consumer.close()
        assert await cluster.store.get(metadata_key(LOG)) is not None
        await client.admin.reset_subscription(TOPIC, "s", "earliest")  # unloaded until used
        topic = cluster.broker.service.topics[TopicName.parse(TOPIC)]
        assert "s" not in topic.subscriptions

        # a consumer attaching to the topic says so, and whether it must wait for the
        # subscriptions' lock (then goes on as it would)
        attaching = asyncio.Event()
        kept_out: list[bool] = []
        original = topic.registry.subscription

        async def subscription(name: str, *, initial: str = "latest") -> Subscription:
            kept_out.append(topic.registry._lock.locked())
            attaching.set()
            return await original(name, initial=initial)

        monkeypatch.setattr(topic.registry, "subscription", subscription)

        held = cluster.faults.hold("range", key_prefix=metadata_key(LOG))  # the deletion's check
        deleting = asyncio.create_task(client.admin.delete_subscription(TOPIC, "s"))
        await held.wait_for(1)
        subscribing = asyncio.create_task(
            client.subscribe(TOPIC, "s", initial_position="earliest", subscription_type="Shared")
        )
        await asyncio.wait_for(attaching.wait(), 10)
        if not kept_out[0]:  # it attaches before the deletion goes on
            await asyncio.wait_for(asyncio.shield(subscribing), 10)
        held.release()

        refused: ServerError | None = None
        try:
            await deleting
        except ServerError as e:
            refused = e
        consumer = await subscribing
        loaded = topic.subscriptions.get("s")
        assert loaded is not None and loaded.consumers
        # the consumer's subscription has its cursor and its log, whichever went first
        assert "s" in topic.ledger.cursors, "its cursor was deleted under the consumer"
        if refused is not None:
            assert "has consumers" in str(refused), refused
            assert await cluster.store.get(metadata_key(LOG)) is not None, (
                "its log was deleted under the consumer"
            )
        message = await consumer.receive(timeout_s=10)
        if refused is None:  # deleted whole first: made anew from m0, no old ack replayed
            assert message.value == b"m0", message.value
        txn = client.transaction()  # its log takes a transactional ack
        await consumer.acknowledge(message, txn=txn)
        await txn.commit()
        assert await cluster.store.get(metadata_key(LOG)) is not None
        await consumer.close()
        await loaded.close()  # its log's clean close
        del topic.subscriptions["s"]
        assert "s" in await client.admin.subscriptions(TOPIC)


async def test_a_topic_deleted_while_a_subscription_loads_deletes_its_log_after_the_load(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A topic's deletion (``Topic.delete``) while a consumer loads a subscription that a
    reset unloaded: the deletion deleted the subscription's log as the load opened it, and
    the consumer was told its data was damaged (PersistenceError: "its file is missing"),
    or got an internal error (the log's clean close fenced), instead of being told to
    retry. The deletion now waits for the load, which lets go of the subscription (the
    topic is leaving), then deletes everything."""
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await producer.close()
        consumer = await acked_in_txn(client, TOPIC, "s", commit=True)  # its v4 log is made
        await consumer.close()
        await client.admin.reset_subscription(TOPIC, "s", "earliest")  # unloaded until used
        topic = cluster.broker.service.topics[TopicName.parse(TOPIC)]
        lock = ContendedLock()
        monkeypatch.setattr(topic.registry, "_lock", lock)

        held = cluster.faults.hold("range", key_prefix=metadata_key(LOG))  # the load's open
        subscribing = asyncio.create_task(
            client.subscribe(TOPIC, "s", initial_position="earliest", subscription_type="Shared")
        )
        await held.wait_for(1)
        deleting = asyncio.create_task(client.admin.delete_topic(TOPIC, force=True))
        contended = asyncio.create_task(lock.contended.wait())
        await asyncio.wait({deleting, contended}, timeout=10, return_when="FIRST_COMPLETED")
        assert deleting.done() or contended.done(), "the deletion neither ended nor waited"
        held.release()

        await deleting
        contended.cancel()
        try:
            consumer = await subscribing
        except ServerError as e:  # told to retry, it found the topic gone
            assert "does not exist" in str(e), e
        else:
            await consumer.close()
        assert await cluster.store.get(metadata_key(LOG)) is None, "its log was left"
        assert TopicName.parse(TOPIC) not in cluster.broker.service.topics
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert not errors, errors


async def test_a_consumer_attaching_while_its_subscription_is_reset_receives(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset checked "no consumer", awaited the cursor's save, then closed the loaded
    subscription to rebuild it: a consumer that attached meanwhile was left on the closed
    one and received nothing more. The reset now holds the lock a consumer attaching takes."""
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0", b"m1")
        await producer.close()
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        await consumer.acknowledge(await consumer.receive(timeout_s=10))
        await consumer.close()
        topic = cluster.broker.service.topics[TopicName.parse(TOPIC)]
        assert "s" in topic.subscriptions  # loaded, no consumer
        lock = ContendedLock()
        monkeypatch.setattr(topic.registry, "_lock", lock)

        held = cluster.faults.hold("txn", key_prefix=cursors_prefix(TOPIC))  # the reset's save
        resetting = asyncio.create_task(client.admin.reset_subscription(TOPIC, "s", "earliest"))
        await held.wait_for(1)
        subscribing = asyncio.create_task(client.subscribe(TOPIC, "s"))
        contended = asyncio.create_task(lock.contended.wait())
        await asyncio.wait({subscribing, contended}, timeout=10, return_when="FIRST_COMPLETED")
        assert subscribing.done() or contended.done(), "the consumer neither attached nor waited"
        held.release()
        await resetting
        contended.cancel()
        consumer = await subscribing
        assert (await consumer.receive(timeout_s=10)).value == b"m0"  # from the earliest
        await consumer.close()


async def test_a_v4_end_asked_while_its_subscription_is_deleted_does_not_make_it_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """END_TXN_ON_SUBSCRIPTION (from the v4 coordinator) found the subscription's cursor,
    then waited for the subscriptions' lock a deletion held; once the deletion ended it made
    the subscription anew, empty, at the latest message: a deleted subscription came back.
    It now finds the subscription gone under the lock and has nothing to apply."""
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await producer.close()
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        await consumer.close()
        topic = cluster.broker.service.topics[TopicName.parse(TOPIC)]
        lock = ContendedLock()
        monkeypatch.setattr(topic.registry, "_lock", lock)

        held = cluster.faults.hold("range", key_prefix=metadata_key(LOG))  # the deletion's check
        deleting = asyncio.create_task(client.admin.delete_subscription(TOPIC, "s"))
        await held.wait_for(1)
        url = f"{cluster.url}/admin/v2/persistent/acme/subrace/t/subscription/s/txn/0:5/end"
        async with aiohttp.ClientSession() as session:
            ending = asyncio.create_task(session.post(url, params={"action": "ABORT"}))
            await asyncio.wait_for(lock.contended.wait(), 10)  # it waits for the deletion
            held.release()
            await deleting
            async with await ending as answer:
                assert answer.status == 204, await answer.text()
        assert "s" not in await client.admin.subscriptions(TOPIC), "the subscription came back"
        assert "s" not in topic.ledger.cursors and "s" not in topic.subscriptions


async def test_a_topic_unloaded_while_a_subscription_loads_lets_go_of_its_log_first(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A topic's unload (``Topic.close``) while a consumer loads a subscription that a reset
    unloaded: the unload did not wait for the load, which opened the subscription's v4
    pending-ack log after the topic was closed. The topic loaded again meanwhile (for the
    next client) had opened that log: the old load's open was refused ("... is held by
    another writer") and the consumer got an internal error (logged at ERROR) instead of
    being told to retry; the other way round, the new instance's load was refused. The
    unload now waits for the load, which lets go of its subscription (the topic leaving),
    and the consumer, told to retry, attaches to the topic loaded again."""
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0", b"m1")
        await producer.close()
        consumer = await acked_in_txn(client, TOPIC, "s", commit=True)  # its v4 log is made
        await consumer.close()
        await client.admin.reset_subscription(TOPIC, "s", "earliest")  # unloaded until used
        old = service.topics[name]
        lock = ContendedLock()
        monkeypatch.setattr(old.registry, "_lock", lock)

        held = cluster.faults.hold("range", key_prefix=metadata_key(LOG))  # the load's open
        subscribing = asyncio.create_task(
            client.subscribe(TOPIC, "s", initial_position="earliest", subscription_type="Shared")
        )
        await held.wait_for(1)
        unloading = asyncio.create_task(service.unload(name))
        contended = asyncio.create_task(lock.contended.wait())
        await asyncio.wait({unloading, contended}, timeout=10, return_when="FIRST_COMPLETED")
        assert unloading.done() or contended.done(), "the unload neither ended nor waited"
        if unloading.done():  # it left the load behind: the topic is loaded again meanwhile
            await service.serve(name)
        held.release()
        await unloading
        contended.cancel()

        try:
            consumer = await subscribing  # told to retry, it attaches to the topic loaded again
        except ServerError as e:
            pytest.fail(f"the consumer was refused: {type(e).__name__}: {e}")
        new = service.topics[name]
        assert new is not old and new.subscriptions["s"].consumers
        assert not old.subscriptions and not lock.locked(), "the unloaded topic kept a load"
        message = await consumer.receive(timeout_s=10)
        txn = client.transaction()  # the log, the new instance's, takes a transactional ack
        await consumer.acknowledge(message, txn=txn)
        await txn.commit()
        await consumer.close()
        await wait_until(lambda: not new.subscriptions["s"].consumers, what="the consumer gone")
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert not errors, errors


async def test_an_unload_cancelled_as_it_waits_for_a_load_closes_the_loaded_subscriptions(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unload (``Topic.close``) cancelled as it waits for a subscription's load in flight
    (a broker's stop out of time) still closes the subscriptions loaded: left open, one's
    v4 pending-ack log held its file, and the topic's next load was refused ("... is held
    by another writer") until the broker restarted."""
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await producer.close()
        kept = await acked_in_txn(client, TOPIC, "k", commit=True)  # "k": loaded, its log open
        await kept.close()
        old = service.topics[name]
        lock = ContendedLock()
        monkeypatch.setattr(old.registry, "_lock", lock)

        held = cluster.faults.hold("range", key_prefix=metadata_key(LOG))  # "s"'s load
        subscribing = asyncio.create_task(
            client.subscribe(TOPIC, "s", initial_position="earliest", subscription_type="Shared")
        )
        await held.wait_for(1)
        unloading = asyncio.create_task(service.unload(name))
        await asyncio.wait_for(lock.contended.wait(), 10)  # it waits for the load
        unloading.cancel()
        await asyncio.gather(unloading, return_exceptions=True)
        assert "k" in old.subscriptions
        held.release()

        consumer = await subscribing  # told to retry: the topic loads again, "k" with it
        assert (await consumer.receive(timeout_s=10)).value == b"m0"
        await consumer.close()
        assert service.topics[name] is not old
        assert "k" in service.topics[name].subscriptions


async def test_an_unload_cancelled_with_the_store_silent_closes_every_loaded_subscription(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with the store silent on the first subscription's clean close: that close
    gets the cancel's grace and is cut past it (``run_to_end`` raises the cancel), and the
    next subscription's close was skipped (only ``Exception`` was caught): its v4
    pending-ack log stayed open, its writer task running, its file locked ("... is held by
    another writer" on the next load) until the broker restarted. Every loaded subscription
    is closed, the cancel raised after the last."""
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await producer.close()
        for sub in ("a", "b"):  # loaded, their logs open, closed in this order
            await (await acked_in_txn(client, TOPIC, sub, commit=True)).close()
        old = service.topics[name]
        assert list(old.subscriptions) == ["a", "b"]
        lock = ContendedLock()
        monkeypatch.setattr(old.registry, "_lock", lock)

        held = cluster.faults.hold("range", key_prefix=metadata_key(LOG))  # "s"'s load
        subscribing = asyncio.create_task(
            client.subscribe(TOPIC, "s", initial_position="earliest", subscription_type="Shared")
        )
        await held.wait_for(1)
        silent = cluster.faults.hold("txn", key_prefix=metadata_key(pending_ack_log(TOPIC, "a")))
        unloading = asyncio.create_task(service.unload(name))
        await asyncio.wait_for(lock.contended.wait(), 10)  # it waits for the load
        unloading.cancel()
        await asyncio.gather(unloading, return_exceptions=True)
        assert silent.parked == 1, "a's clean close was not the one held"
        still_open = [s for s in ("a", "b") if not _pending_ack_ledger(old, s)._closed]
        silent.release()
        held.release()
        assert not still_open, f"left open by the cancelled unload: {still_open}"

        consumer = await subscribing  # told to retry: the topic loads again, "a" and "b" too
        await consumer.close()
        assert {"a", "b"} <= set(service.topics[name].subscriptions)


def _pending_ack_ledger(topic: Topic, subscription: str) -> ManagedLedger:
    pending_acks = topic.subscriptions[subscription].pending_acks
    assert isinstance(pending_acks, MLPendingAckStore) and pending_acks._log is not None
    return pending_acks._log.ledger


async def test_an_unload_cut_by_a_cancel_still_closes_the_transaction_buffer(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with a v4 transaction open on the topic: the cancel the subscriptions'
    close raised skipped the transaction buffer's close (and publishing's settle), so the
    v4 checks kept tracking the closed buffer as a participant of that transaction (its
    sweep would end it there, on a closed ledger, beside the topic's new instance)."""
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await (await acked_in_txn(client, TOPIC, "a", commit=True)).close()
        txn = client.transaction()
        await producer.send(b"open", txn=txn)  # the buffer is a participant of txn
        await producer.close()
        old = service.topics[name]
        buffer: object = old.buffer
        tracked = service.v4_checks._tracked
        assert any(buffer in t.participants for t in tracked.values())
        lock = ContendedLock()
        monkeypatch.setattr(old.registry, "_lock", lock)

        held = cluster.faults.hold("range", key_prefix=metadata_key(LOG))  # "s"'s load
        subscribing = asyncio.create_task(
            client.subscribe(TOPIC, "s", initial_position="earliest", subscription_type="Shared")
        )
        await held.wait_for(1)
        silent = cluster.faults.hold("txn", key_prefix=metadata_key(pending_ack_log(TOPIC, "a")))
        unloading = asyncio.create_task(service.unload(name))
        await asyncio.wait_for(lock.contended.wait(), 10)  # it waits for the load
        unloading.cancel()
        await asyncio.gather(unloading, return_exceptions=True)
        left = [t for t in tracked.values() if buffer in t.participants]
        cluster.faults.clear()
        silent.release()
        held.release()
        assert not left, "the closed buffer is still tracked as a participant"

        consumer = await subscribing
        await consumer.close()
        await txn.abort()
