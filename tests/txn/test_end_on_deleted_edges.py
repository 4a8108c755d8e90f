"""A v4 transaction's end reaching a topic whose deletion stopped part-way (segtxn/broker/
v4ends.py, END_TXN_ON_PARTITION and END_TXN_ON_SUBSCRIPTION).

A deletion that stops part-way leaves its topic marked ``deleting``: never served again,
deleted by the next ``DELETE`` (segtxn/broker/deletemark.py). The broker answered a
transaction's end on it as any load of it, ``ServiceNotReady`` ("being deleted"), and the
coordinator retried that for its fan-out's time, then failed the end: the client's commit
or abort (its close, aborting what it left open) waited out its whole operation timeout
(30 s by default) and failed, until someone retried the DELETE. A marked topic goes with
everything the transaction wrote or acknowledged there, as a deleted one does, which the
coordinator already takes as done.

Real components: the cluster's broker and v4 coordinator on its store (memory and a real
etcd); the deletion is stopped by a store fault on the topic's de-duplication state.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from segtxn.broker import deletemark
from segtxn.broker.dedup_snapshots import PREFIX as DEDUP_PREFIX
from segtxn.client import Client, ServerError
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster, create_and_send

TOPIC = "persistent://acme/ends/deleting"
OTHER = "persistent://acme/ends/kept"


@pytest.mark.parametrize("action", ["commit", "abort"])
async def test_a_txn_ends_at_once_on_a_topic_whose_deletion_stopped_part_way(
    cluster: Cluster, action: str
) -> None:
    async with Client(cluster.url, operation_timeout_s=10) as client:
        producer = await create_and_send(client, TOPIC, b"m0")
        await client.admin.create_topic(OTHER)
        kept = await client.create_producer(OTHER)
        reader = await client.subscribe(OTHER, "r", initial_position="earliest")
        consumer = await client.subscribe(
            TOPIC, "s", initial_position="earliest", subscription_type="Shared"
        )
        message = await consumer.receive(timeout_s=10)
        txn = client.transaction()
        await consumer.acknowledge(message, txn=txn)  # a subscription participant
        await producer.send(b"m1", txn=txn)  # a partition participant
        await kept.send(b"kept", txn=txn)

        cluster.faults.fail("range", key_prefix=DEDUP_PREFIX + quote(TOPIC, safe=""), times=1)
        with pytest.raises(ServerError) as caught:
            await client.admin.delete_topic(TOPIC, force=True)
        assert "stopped part-way" in str(caught.value), caught.value
        assert await deletemark.marked(cluster.broker.service.catalog, TopicName.parse(TOPIC))

        await (txn.commit() if action == "commit" else txn.abort())  # Timeout before
        if action == "commit":
            assert (await reader.receive(timeout_s=10)).value == b"kept"
        await client.admin.delete_topic(TOPIC, force=True)  # (the retry finishes it)
