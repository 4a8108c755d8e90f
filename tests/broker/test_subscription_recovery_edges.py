"""A subscription whose pending acks fail to recover (segtxn/broker/subscriptions.py,
``Subscriptions.subscription``): what it opened (its v4 pending-ack log, its dispatcher) is
closed again, so the next load of the topic opens them afresh, rather than finding the log's
file held by the failed attempt ("... is held by another writer") until the broker restarts.

Real components: the cluster's broker and coordinator on its store (memory and a real etcd),
files in ``tmp_path``; the failure is a store fault on the topic's cursors.
"""

from __future__ import annotations

import logging

import pytest

from segtxn.broker.txn.pending_ack_log import pending_ack_log
from segtxn.client import Client, ServerError
from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.metadata import metadata_key
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster, create_and_send

TOPIC = "persistent://acme/recover/failing"


async def test_a_subscription_failing_to_recover_its_pending_acks_leaves_nothing_open(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        await create_and_send(client, TOPIC, b"m0", b"m1")
        consumer = await client.subscribe(
            TOPIC, "s", initial_position="earliest", subscription_type="Shared"
        )
        message = await consumer.receive(timeout_s=10)
        txn = client.transaction()
        await consumer.acknowledge(message, txn=txn)  # the subscription's v4 log holds it
        await txn.commit()
        await consumer.close()
        assert await cluster.store.get(metadata_key(pending_ack_log(TOPIC, "s"))) is not None
        await service.unload(name)

        # recovering "s" re-applies the committed ack to its cursor: that write fails once
        injected = cluster.faults.injected
        cluster.faults.fail("txn", key_prefix=cursors_prefix(TOPIC), times=1)
        with caplog.at_level(logging.DEBUG):
            with pytest.raises(ServerError):
                await client.admin.stats(TOPIC)
            assert cluster.faults.injected == injected + 1
            assert name not in service.topics

            await client.admin.stats(TOPIC)  # loads again, its pending-ack log too
            again = await client.subscribe(
                TOPIC, "s", initial_position="earliest", subscription_type="Shared"
            )
            assert (await again.receive(timeout_s=10)).value == b"m1"
        writers = [r.getMessage() for r in caplog.records if "another writer" in r.getMessage()]
        assert not writers, writers
