"""A segment's recovery with two transactions' acks records on the same messages: an aborted
one's, whose deletion had not happened yet, and a later one's that acknowledged the same
messages after that abort released them, and committed. The committed acknowledgment holds.

Found by the soak (seed 104024, cluster-replicated): the aborted record was applied after
the committed one because its key sorted after it, took the positions back, and its release
delivered the messages again, which a processor then committed a second time (duplicates
and order violations downstream)."""

from __future__ import annotations

import logging

import pytest

from segtxn.client import Client
from segtxn.ledger.cursor import cursor_key
from segtxn.protocol.names import TopicName
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/ackrec/orders"
SEGMENT = TopicName.parse(TOPIC).segment_name(0)


async def test_a_commits_acks_hold_over_an_earlier_aborted_record_of_the_same_messages(
    client: Client, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(3):
        await producer.send(f"m{i}".encode(), key="k")
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    received = [await consumer.receive(timeout_s=10) for _ in range(3)]
    # the one that commits is opened first, so its records' keys sort before the aborted
    # one's: a recovery taking records by key order applies the abort last
    committing = await client.transaction().start()
    aborting = await client.transaction().start()
    assert T.ops_prefix(committing.id) < T.ops_prefix(aborting.id)
    for message in received:
        await consumer.acknowledge(message, txn=aborting)
    stuck = cluster.faults.count("txn", key_prefix=T.ops_prefix(aborting.id))
    cluster.faults.fail("txn", key_prefix=T.ops_prefix(aborting.id), times=None)
    await aborting.abort()  # released: delivered again; its record's deletion keeps failing
    again = [await consumer.receive(timeout_s=10) for _ in range(3)]
    assert [m.value for m in again] == [b"m0", b"m1", b"m2"]
    await wait_until(lambda: stuck.calls >= 1, what="the aborted record's deletion tried")
    cluster.faults.fail("txn", key_prefix=cursor_key(str(SEGMENT), "s"), times=None)
    for message in again:
        await consumer.acknowledge(message, txn=committing)
    await committing.commit()  # applied in memory; the cursor save that would hold it fails
    await consumer.close()
    await producer.close()
    with caplog.at_level(logging.INFO, logger="segtxn.broker.handoff"):
        await cluster.broker.service.unload(SEGMENT)  # its close cannot save the cursor
    assert "closed without a clean close" in caplog.text  # so both records stay, as in a crash
    assert await cluster.store.list_prefix(T.ops_prefix(aborting.id))
    assert await cluster.store.list_prefix(T.ops_prefix(committing.id))
    cluster.faults.clear()
    producer = await client.create_producer(TOPIC)
    await producer.send(b"m3", key="k")
    reloaded = await client.subscribe(TOPIC, "s", initial_position="earliest")
    assert (await reloaded.receive(timeout_s=10)).value == b"m3"  # m0..m2 stay consumed
