"""A subscription's v4 pending-ack log goes with the subscription, or its topic, whether the
subscription is loaded on the broker or not (segtxn/broker/subscriptions.py,
``Subscriptions.delete`` and ``Subscriptions.delete_subscription``).

Only the logs of the subscriptions loaded (``Topic.subscriptions``) were deleted. A reset
unloads its subscription until a consumer attaches again, and a subscription deletion that
failed deleting the log had unloaded it already: deleting the subscription (the retry), or
its topic, then left its log. A subscription made again under the name, on the topic or on
one created again under its name, replayed it: the old transaction's committed ack was
applied to the new cursor, and the first message was never delivered to it.

Real components: the cluster's broker and coordinator on its store (memory and a real etcd),
files in ``tmp_path``; the failure is a store fault on the log's metadata.
"""

from __future__ import annotations

import pytest

from segtxn.broker.txn.pending_ack_log import pending_ack_log
from segtxn.client import Client, ErrorCategory, ServerError
from segtxn.ledger.cursor import cursors_prefix
from segtxn.ledger.metadata import metadata_key
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster, create_and_send

TOPIC = "persistent://acme/orphans/t"
LOG = pending_ack_log(TOPIC, "s")


async def ack_m0_in_a_committed_txn(client: Client, cluster: Cluster) -> None:
    """Store m0 and m1, and acknowledge m0 on subscription ``s`` in a committed transaction
    (its log holds the ack and the COMMIT); no consumer is left attached."""
    producer = await create_and_send(client, TOPIC, b"m0", b"m1")
    await producer.close()
    consumer = await client.subscribe(
        TOPIC, "s", initial_position="earliest", subscription_type="Shared"
    )
    message = await consumer.receive(timeout_s=10)
    assert message.value == b"m0"
    txn = client.transaction()
    await consumer.acknowledge(message, txn=txn)
    await txn.commit()
    await consumer.close()
    assert await cluster.store.get(metadata_key(LOG)) is not None


async def first_value(client: Client) -> bytes:
    """What a new consumer of ``s``, made again from the earliest message, receives first."""
    consumer = await client.subscribe(
        TOPIC, "s", initial_position="earliest", subscription_type="Shared"
    )
    try:
        return (await consumer.receive(timeout_s=10)).value
    finally:
        await consumer.close()


async def test_a_reset_subscription_s_deletion_deletes_its_pending_ack_log(
    cluster: Cluster,
) -> None:
    async with Client(cluster.url) as client:
        await ack_m0_in_a_committed_txn(client, cluster)
        await client.admin.reset_subscription(TOPIC, "s", "earliest")  # unloaded until used
        assert "s" not in cluster.broker.service.topics[TopicName.parse(TOPIC)].subscriptions

        await client.admin.delete_subscription(TOPIC, "s")
        assert await cluster.store.get(metadata_key(LOG)) is None, "its log was left"
        assert await first_value(client) == b"m0"


async def test_a_reset_subscription_s_topic_deletion_deletes_its_pending_ack_log(
    cluster: Cluster,
) -> None:
    async with Client(cluster.url) as client:
        await ack_m0_in_a_committed_txn(client, cluster)
        await client.admin.reset_subscription(TOPIC, "s", "earliest")

        await client.admin.delete_topic(TOPIC, force=True)
        assert await cluster.store.get(metadata_key(LOG)) is None, "its log was left"
        producer = await create_and_send(client, TOPIC, b"new m0")  # created again
        await producer.close()
        assert await first_value(client) == b"new m0"


async def test_a_retried_subscription_deletion_deletes_the_log_the_failed_one_left(
    cluster: Cluster,
) -> None:
    async with Client(cluster.url) as client:
        await ack_m0_in_a_committed_txn(client, cluster)

        # the log's deletion fails (the subscription, closed, is unloaded by then)
        cluster.faults.fail("txn", key_prefix=cursors_prefix(LOG), times=1)
        with pytest.raises(ServerError) as caught:
            await client.admin.delete_subscription(TOPIC, "s")
        assert caught.value.category is ErrorCategory.RETRIABLE, caught.value
        assert await cluster.store.get(metadata_key(LOG)) is not None
        assert "s" not in cluster.broker.service.topics[TopicName.parse(TOPIC)].subscriptions

        await client.admin.delete_subscription(TOPIC, "s")  # the retry
        assert await cluster.store.get(metadata_key(LOG)) is None, "its log was left"
        assert "s" not in await client.admin.subscriptions(TOPIC)
        assert await first_value(client) == b"m0"
