"""A topic's deletion that fails part-way (segtxn/broker/topic.py, ``Topic.delete``): the
topic is let go cleanly, its ledger closed, and the client is told to retry; a persistent
topic is not served again meanwhile (segtxn/broker/deletemark.py), and the retry finishes
its deletion.

Real components: the cluster's broker and coordinator on its store (memory and a real etcd),
files in ``tmp_path``; the failure is a store fault on one v4 pending-ack log's metadata.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path
from urllib.parse import quote

import pytest

from segtxn.broker import datacheck
from segtxn.broker.dedup_snapshots import PREFIX as DEDUP_PREFIX
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore, pending_ack_log
from segtxn.client import Client, ErrorCategory, ServerError
from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster, acked_in_txn, create_and_send

TOPIC = "persistent://acme/delete/failing"


async def test_a_delete_failing_part_way_lets_the_topic_go_cleanly_and_a_retry_finishes_it(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    log_ = pending_ack_log(TOPIC, "s")
    async with Client(cluster.url) as client:
        await create_and_send(client, TOPIC, b"m0")
        await acked_in_txn(client, TOPIC, "s", commit=False)  # its v4 log holds it
        assert await cluster.store.get(metadata_key(log_)) is not None
        old = service.topics[name]

        cluster.faults.fail("txn", key_prefix=metadata_key(log_), times=1)
        with caplog.at_level(logging.INFO):
            with pytest.raises(ServerError) as caught:
                await client.admin.delete_topic(TOPIC, force=True)
            assert caught.value.category is ErrorCategory.RETRIABLE, caught.value
            assert service.topics.get(name) is not old, "the half-deleted instance is served"
            assert old.ledger.is_closing, "its ledger was left open"

            # it is not served again (its deletion began: its record is marked), and a
            # retry finishes the deletion, without loading it (no second writer refused)
            with pytest.raises(ServerError) as refused:
                await client.admin.stats(TOPIC)
            assert "being deleted" in str(refused.value), refused.value
            await client.admin.delete_topic(TOPIC, force=True)
        assert name not in service.topics
        said = str(caught.value)
        assert f"{TOPIC}: its deletion stopped part-way" in said and "retry" in said, said
        assert await cluster.store.get(metadata_key(log_)) is None
        assert await cluster.store.get(metadata_key(TOPIC)) is None
        writers = [r.getMessage() for r in caplog.records if "another writer" in r.getMessage()]
        assert not writers, writers


# ---------------------------------------------------------------------------------------
# A forced deletion hangs up on the topic's clients, which reconnect at once. The deletion
# did not keep the topic from loading meanwhile: a client arriving while the ledger was
# still open was refused by its file's lock ("... is held by another writer", an ERROR),
# and one arriving after the ledger was deleted loaded the topic afresh, empty, served
# while the rest of the deletion went on.


async def test_clients_hung_up_on_by_a_forced_delete_are_told_to_retry_until_it_is_done(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        await client.subscribe(TOPIC, "s", initial_position="earliest")
        late = cluster.faults.hold("range", key_prefix=DEDUP_PREFIX + quote(TOPIC, safe=""))
        deleting = asyncio.create_task(client.admin.delete_topic(TOPIC, force=True))
        try:
            with caplog.at_level(logging.DEBUG):
                await late.wait_for(1)  # its ledger is deleted; its de-duplication state next
                # the consumer hung up on reconnects meanwhile, as any client may ask
                with pytest.raises(ServerError) as refused:
                    await service.serve(name)
                assert "being unloaded" in str(refused.value), refused.value
                assert name not in service.topics and not service.is_loading(name)
                late.release()
                await deleting
        finally:
            late.release()
            await asyncio.gather(deleting, return_exceptions=True)
        loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded")]
        assert not loaded, loaded  # never loaded afresh while it was being deleted
        assert name not in service.topics
        assert await cluster.store.get(metadata_key(TOPIC)) is None
        assert await service.catalog.home_of(name) is None
        writers = [r.getMessage() for r in caplog.records if "another writer" in r.getMessage()]
        assert not writers, writers


# ---------------------------------------------------------------------------------------
# A deletion first checks every file it would delete (Topic.check_deletable), which reads
# the store. An unload of the topic meanwhile (an idle unload, a drain) went unnoticed: the
# deletion went on with the instance it had checked, closed by then, and took out of the
# broker's topics whatever was there, an instance a client had loaded again since, left
# open (its ledger's file locks held) and never closed, while its data was deleted under it.


async def test_a_topic_unloaded_while_its_deletion_checks_it_is_not_deleted_under_a_reload(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    log_ = pending_ack_log(TOPIC, "s")
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        consumer = await client.subscribe(
            TOPIC, "s", initial_position="earliest", subscription_type="Shared"
        )
        producer = await client.create_producer(TOPIC)
        await producer.send(b"m0")
        message = await consumer.receive(timeout_s=10)
        txn = client.transaction()
        await consumer.acknowledge(message, txn=txn)  # the subscription's v4 log holds it
        await txn.abort()
        await consumer.close()
        await producer.close()

        checking = cluster.faults.hold("range", key_prefix=metadata_key(log_))
        deleting = asyncio.create_task(client.admin.delete_topic(TOPIC, force=True))
        try:
            with caplog.at_level(logging.INFO):
                await checking.wait_for(1)  # the deletion checks the subscription's log
                await service.unload(name)
                await client.admin.stats(TOPIC)  # a client loads it again meanwhile
                reloaded = service.topics[name]
                checking.release()
                outcome = (await asyncio.gather(deleting, return_exceptions=True))[0]
        finally:
            checking.release()
            await asyncio.gather(deleting, return_exceptions=True)
        # refused, nothing deleted: the reloaded instance is served, and a retry deletes it
        assert isinstance(outcome, ServerError), outcome
        assert outcome.category is ErrorCategory.RETRIABLE, outcome
        said = str(outcome)
        assert "unloaded" in said and "nothing was deleted" in said and "retry" in said, said
        assert service.topics.get(name) is reloaded, "the reloaded instance was dropped"
        assert not reloaded.ledger.is_closing
        await client.admin.delete_topic(TOPIC, force=True)
        assert name not in service.topics
        assert reloaded.ledger.is_closing, "the reloaded instance was left open"
        assert await cluster.store.get(metadata_key(TOPIC)) is None
        assert await cluster.store.get(metadata_key(log_)) is None
        writers = [r.getMessage() for r in caplog.records if "another writer" in r.getMessage()]
        assert not writers, writers


# ---------------------------------------------------------------------------------------
# A deletion that stopped after its ledger went (here deleting its de-duplication state
# failed) left the topic's record: its next client loaded it again, with a new ledger,
# empty, and was served (a producer's sends stored, acknowledged, then deleted by the
# retried deletion).


async def test_a_delete_stopped_after_its_ledger_went_refuses_the_topic_until_a_retry_ends_it(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    dedup_state = DEDUP_PREFIX + quote(TOPIC, safe="")
    async with Client(cluster.url) as client:
        await create_and_send(client, TOPIC, b"m0")
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        assert (await consumer.receive(timeout_s=10)).value == b"m0"

        cluster.faults.fail("range", key_prefix=dedup_state, times=1)
        with caplog.at_level(logging.INFO):
            with pytest.raises(ServerError) as caught:
                await client.admin.delete_topic(TOPIC, force=True)
            assert caught.value.category is ErrorCategory.RETRIABLE, caught.value
            assert "stopped part-way" in str(caught.value), caught.value
            stopped = len(caplog.records)

            # its clients, hung up on, and any other are refused: never served it empty
            with pytest.raises(ServerError) as refused:
                await client.admin.stats(TOPIC)
            assert refused.value.category is ErrorCategory.RETRIABLE, refused.value
            assert "being deleted" in str(refused.value), refused.value
            assert name not in service.topics
            assert await cluster.store.get(metadata_key(TOPIC)) is None, "a new ledger was made"

            await client.admin.delete_topic(TOPIC, force=True)  # the retry finishes it
            loaded = [r.getMessage() for r in caplog.records[stopped:]]
            assert not [m for m in loaded if m.startswith(f"loaded {TOPIC}")], loaded
        with pytest.raises(ServerError) as gone:
            await client.admin.stats(TOPIC)
        assert gone.value.name == "TopicNotFound", gone.value
        assert await service.catalog.get(name) is None
        assert await service.catalog.home_of(name) is None
        assert not (await cluster.store.list_prefix(dedup_state)).records
        assert name not in service.topics


# ---------------------------------------------------------------------------------------
# A deletion that stopped part-way through its ledger (its logs deleted, its cursors and
# metadata record not yet) left a topic refused for its missing files, and the retried
# deletion, which loaded it to delete it, was refused the same way: it never finished.


async def test_a_delete_stopped_inside_its_ledger_is_finished_by_a_retry(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        await create_and_send(client, TOPIC, b"m0")
        await client.subscribe(TOPIC, "s", initial_position="earliest")

        cluster.faults.fail("range", key_prefix=cursors_prefix(TOPIC), times=1)
        with caplog.at_level(logging.INFO):
            with pytest.raises(ServerError) as caught:
                await client.admin.delete_topic(TOPIC, force=True)
            assert "stopped part-way" in str(caught.value), caught.value
            assert await cluster.store.get(metadata_key(TOPIC)) is not None  # files gone
            await datacheck.check_data(service)  # (as a restart does: not refused)
            assert name not in service.refused

            await client.admin.delete_topic(TOPIC, force=True)  # the retry finishes it
        assert await cluster.store.get(metadata_key(TOPIC)) is None
        assert not (await cluster.store.list_prefix(cursors_prefix(TOPIC))).records
        assert await service.catalog.get(name) is None
        assert name not in service.topics and name not in service.refused


# ---------------------------------------------------------------------------------------
# The same for a segment of a scalable topic being deleted: its record, marked deleting,
# stayed until every segment was deleted, and a segment whose deletion stopped after its
# ledger went loaded again, afresh and empty, for the next client (or the retried deletion).


async def test_a_segment_whose_delete_stopped_after_its_ledger_went_is_not_served_afresh(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    scalable = "topic://acme/delete/scaled"
    segment = TopicName.parse(scalable).segment_name(0)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(scalable, segments=1)
        producer = await client.create_producer(scalable)
        await producer.send(b"m0")
        await producer.close()
        assert segment in service.topics

        dedup_state = DEDUP_PREFIX + quote(str(segment), safe="")
        cluster.faults.fail("range", key_prefix=dedup_state, times=1)
        with caplog.at_level(logging.INFO):
            with pytest.raises(ServerError) as caught:
                await client.admin.delete_topic(scalable, force=True)
            assert caught.value.category is ErrorCategory.RETRIABLE, caught.value
            assert await cluster.store.get(metadata_key(str(segment))) is None  # it went
            stopped = len(caplog.records)

            with pytest.raises(ServerError) as refused:
                await service.serve(segment)
            assert "being deleted" in str(refused.value), refused.value
            assert await cluster.store.get(metadata_key(str(segment))) is None, "made again"

            await client.admin.delete_topic(scalable, force=True)  # the retry finishes it
            loaded = [r.getMessage() for r in caplog.records[stopped:]]
            assert not [m for m in loaded if m.startswith(f"loaded {segment}")], loaded
        assert await service.catalog.get(TopicName.parse(scalable)) is None
        assert not (await cluster.store.list_prefix(dedup_state)).records
        assert segment not in service.topics


# ---------------------------------------------------------------------------------------
# A topic marked deleting is refused to every client until a DELETE finishes it, and each
# refused load logged a WARNING: a client retrying every few hundred ms (nobody retrying
# the DELETE) flooded the broker's log with the same line.


def refusals(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    """The broker's log lines at ``level`` saying a load was refused as being deleted."""
    said = [r for r in caplog.records if r.name == "segtxn.broker.service" and r.levelno == level]
    return [m for m in (r.getMessage() for r in said) if "being deleted" in m]


async def fail_a_delete(client: Client, cluster: Cluster) -> None:
    """Create the topic and delete it, its deletion stopped part-way (it stays marked)."""
    producer = await create_and_send(client, TOPIC, b"m0")
    await producer.close()  # (its reconnections would be refused too: counted with the test's)
    cluster.faults.fail("range", key_prefix=DEDUP_PREFIX + quote(TOPIC, safe=""), times=1)
    with pytest.raises(ServerError) as caught:
        await client.admin.delete_topic(TOPIC, force=True)
    assert "stopped part-way" in str(caught.value), caught.value


async def test_a_marked_topic_s_refused_loads_are_a_warning_once_then_debug(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        await fail_a_delete(client, cluster)
        with caplog.at_level(logging.DEBUG):
            for _ in range(5):  # a client retrying
                with pytest.raises(ServerError) as refused:
                    await service.serve(name)
                assert "being deleted" in str(refused.value), refused.value
            assert len(refusals(caplog, logging.WARNING)) == 1, refusals(caplog, logging.WARNING)
            assert len(refusals(caplog, logging.DEBUG)) == 4, refusals(caplog, logging.DEBUG)

            await client.admin.delete_topic(TOPIC, force=True)  # finished
            await fail_a_delete(client, cluster)  # made again, and marked again: said again
            for _ in range(3):
                with pytest.raises(ServerError):
                    await service.serve(name)
        assert len(refusals(caplog, logging.WARNING)) == 2, refusals(caplog, logging.WARNING)
        assert len(refusals(caplog, logging.DEBUG)) == 6, refusals(caplog, logging.DEBUG)


# ---------------------------------------------------------------------------------------
# The same inside a subscription's v4 pending-ack log: a deletion that stopped part-way
# through the log's files (its oldest deleted, its metadata record not yet) left a log the
# retried deletion opened to delete it, and opening it was refused for the missing files
# (LedgerMissing): the topic, marked deleting, could never be deleted.


@pytest.mark.parametrize("deleted", ["its oldest files", "every file"])
async def test_a_delete_stopped_inside_a_pending_ack_log_is_finished_by_a_retry(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, deleted: str
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    log_ = pending_ack_log(TOPIC, "s")
    async with Client(cluster.url) as client:
        producer = await create_and_send(client, TOPIC, b"m0", b"m1")
        await producer.close()
        consumer = await client.subscribe(
            TOPIC, "s", initial_position="earliest", subscription_type="Shared"
        )
        received = [await consumer.receive(timeout_s=10) for _ in range(2)]
        await consumer.acknowledge(received[0], txn=client.transaction())  # held: left open
        pending = (await service.serve(name)).subscriptions["s"].pending_acks
        assert isinstance(pending, MLPendingAckStore) and pending._log is not None
        await pending._log.close()  # the next ack opens it again, on a new ledger
        pending._log = None
        await consumer.acknowledge(received[1], txn=client.transaction())
        await consumer.close()
        found = await cluster.store.get(metadata_key(log_))
        assert found is not None
        ids = [info.id for info in decode(found.value).ledgers]
        assert len(ids) >= 2, ids

        cluster.faults.fail("txn", key_prefix=metadata_key(log_), times=1)
        with pytest.raises(ServerError) as caught:
            await client.admin.delete_topic(TOPIC, force=True)
        assert "stopped part-way" in str(caught.value), caught.value
        # what a deletion stopped part-way through the log's files (oldest first) leaves
        for ledger_id in ids[:-1] if deleted == "its oldest files" else ids:
            service.storage.delete(log_, ledger_id)

        with caplog.at_level(logging.INFO):
            await client.admin.delete_topic(TOPIC, force=True)  # the retry finishes it
        assert await cluster.store.get(metadata_key(log_)) is None
        assert not (await cluster.store.list_prefix(cursors_prefix(log_))).records
        assert not [i for i in ids if service.storage.exists(log_, i)]
        assert await cluster.store.get(metadata_key(TOPIC)) is None
        assert await service.catalog.get(name) is None
        assert name not in service.topics and name not in service.refused


# ---------------------------------------------------------------------------------------
# A file the deletion could not unlink (permission denied, an I/O error) raised an OSError,
# not a LedgerError: the deletion was not turned into the retriable "stopped part-way"
# answer, and the client got a 500 UnknownError with an incident id, for a deletion that
# had marked the topic and deleted part of it already.


@pytest.fixture
def undeletable(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Paths whose unlink fails with EACCES (as on a read-only or damaged volume) while
    they are in the set returned; every other unlink is done."""
    refused: set[str] = set()
    unlink = Path.unlink

    def refusing(path: Path, missing_ok: bool = False) -> None:
        if str(path) in refused:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refusing)
    return refused


@pytest.mark.parametrize("whose", ["the topic's ledger", "a pending-ack log"])
async def test_a_file_that_cannot_be_unlinked_stops_a_delete_retriably_naming_it(
    cluster: Cluster, undeletable: set[str], whose: str
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    log_ = pending_ack_log(TOPIC, "s")
    async with Client(cluster.url) as client:
        await create_and_send(client, TOPIC, b"m0")
        await acked_in_txn(client, TOPIC, "s", commit=False)  # its v4 log holds it
        ledger = TOPIC if whose == "the topic's ledger" else log_
        found = await cluster.store.get(metadata_key(ledger))
        assert found is not None
        first = decode(found.value).ledgers[0].id
        path = service.storage.where(ledger, first)
        undeletable.add(path)

        for attempt in ("the first", "the retry"):  # (the retry finishes the marked topic)
            with pytest.raises(ServerError) as caught:
                await client.admin.delete_topic(TOPIC, force=True)
            said = str(caught.value)
            assert caught.value.category is ErrorCategory.RETRIABLE, (attempt, said)
            assert path in said and "Permission denied" in said, (attempt, said)
            assert "incident" not in said, (attempt, said)

        undeletable.clear()  # (the operator fixed the volume)
        await client.admin.delete_topic(TOPIC, force=True)
        assert not service.storage.exists(ledger, first)
        assert await cluster.store.get(metadata_key(ledger)) is None
        assert await service.catalog.get(name) is None


async def test_a_pending_ack_log_that_cannot_be_unlinked_stops_a_subscription_s_delete_retriably(
    cluster: Cluster, undeletable: set[str]
) -> None:
    service = cluster.broker.service
    log_ = pending_ack_log(TOPIC, "s")
    async with Client(cluster.url) as client:
        await create_and_send(client, TOPIC, b"m0")
        consumer = await client.subscribe(
            TOPIC, "s", initial_position="earliest", subscription_type="Shared"
        )
        message = await consumer.receive(timeout_s=10)
        txn = client.transaction()
        await consumer.acknowledge(message, txn=txn)
        await txn.abort()
        await consumer.close()
        found = await cluster.store.get(metadata_key(log_))
        assert found is not None
        first = decode(found.value).ledgers[0].id
        path = service.storage.where(log_, first)
        undeletable.add(path)

        with pytest.raises(ServerError) as caught:
            await client.admin.delete_subscription(TOPIC, "s")
        said = str(caught.value)
        assert caught.value.category is ErrorCategory.RETRIABLE, said
        assert path in said and "Permission denied" in said and "incident" not in said, said

        undeletable.clear()
        await client.admin.delete_subscription(TOPIC, "s")
        assert not service.storage.exists(log_, first)
        assert await cluster.store.get(metadata_key(log_)) is None
        assert "s" not in await client.admin.subscriptions(TOPIC)
