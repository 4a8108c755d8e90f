"""Every name limit holds on every layer beneath it (issue 15; segtxn/protocol/limits.py).

A topic whose tenant, namespace and name are at their length limits, a subscription at its
limit, on a broker whose id is at its limit: created, produced to in a transaction and
without, read, acknowledged in a transaction (v4's pending-ack log and the namespace's
snapshot log are files named after them), stat-ed, given properties, trimmed and deleted -
on the embedded store and on etcd. The longest ledger directory this makes is exactly the
file system's 255 bytes: the limits are the real bound, and one character more is refused
before anything is created.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client, ServerError
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.limits import (
    FILE_NAME_BYTES,
    MAX_BROKER_ID,
    MAX_LOCAL_NAME,
    MAX_NAMESPACE,
    MAX_SUBSCRIPTION,
    MAX_TENANT,
    MAX_TOPIC_PARTS,
    PENDING_ACK_LOG_OVERHEAD,
    SEGMENT_LEDGER_OVERHEAD,
    SNAPSHOT_LOG_OVERHEAD,
    storage_length,
)
from segtxn.protocol.names import InvalidTopicName, TopicName
from tests.cluster import start_on_free_ports

BROKER_ID = "b" * MAX_BROKER_ID
# three spellings of names at their limits (storage lengths: "=" and ":" count 3)
AT_LIMIT = [
    ("t" * MAX_TENANT, "n" * MAX_NAMESPACE, "l" * (MAX_TOPIC_PARTS - 128), "s" * 64),
    ("t" * 6, "n" * 6, "l" * MAX_LOCAL_NAME, "s" + ":" * 21),
    ("t" + "=" * 21, "n" * 64, "x" * (MAX_TOPIC_PARTS - 64 - 64), "s=" * 16),
]


def test_the_limits_fit_the_file_names_they_bound() -> None:
    assert PENDING_ACK_LOG_OVERHEAD + MAX_TOPIC_PARTS + MAX_SUBSCRIPTION == FILE_NAME_BYTES
    assert SNAPSHOT_LOG_OVERHEAD + MAX_TENANT + MAX_NAMESPACE + MAX_BROKER_ID <= FILE_NAME_BYTES
    assert SEGMENT_LEDGER_OVERHEAD + MAX_TOPIC_PARTS + 18 <= FILE_NAME_BYTES
    for tenant, namespace, local, subscription in AT_LIMIT:
        assert storage_length(tenant + namespace + local) == MAX_TOPIC_PARTS
        assert storage_length(subscription) == MAX_SUBSCRIPTION
        persistent = f"persistent://{tenant}/{namespace}/{local}"
        pending_ack = f"{persistent}-{subscription}__transaction_pending_ack"
        assert len(quote(pending_ack, safe="")) == FILE_NAME_BYTES
        snapshot = f"persistent://{tenant}/{namespace}/__transaction_buffer_snapshot@{BROKER_ID}"
        assert len(quote(snapshot, safe="")) <= FILE_NAME_BYTES


@pytest.mark.parametrize(
    "name",
    [
        f"persistent://{'t' * 65}/n/l",
        f"persistent://t/{'n' * 65}/l",
        f"persistent://t/n/{'l' * 129}",
        f"persistent://{'t' * 64}/{'n' * 64}/{'l' * 13}",
        f"topic://t{'=' * 22}/n/l",
        f"persistent://t{'=' * 21}/{'n' * 64}/{'l' * 13}",
    ],
)
def test_one_character_more_is_an_invalid_topic_name(name: str) -> None:
    with pytest.raises(InvalidTopicName, match="at most"):
        TopicName.parse(name)


@pytest.fixture(params=["memory", "etcd"])
async def limit_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A broker whose id is at its limit (it names the namespace's snapshot log) and a
    coordinator, on one store; snapshots after every marker, so a commit writes one."""
    if request.param == "memory":
        url = "memory://"
    else:
        server: EtcdServer = request.getfixturevalue("etcd_server")
        url = server.url(f"/limits-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    store = open_store(url)

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        broker = BrokerServer(
            BrokerSettings(
                broker_id=BROKER_ID,
                advertise_url=f"http://127.0.0.1:{port}",
                ledger_url=f"file://{tmp_path / 'ledgers'}",
                txn_buffer_snapshot_every=1,
            ),
            store=store,
        )
        coordinator = CoordinatorServer(
            CoordinatorSettings(
                advertise_url=f"http://127.0.0.1:{txn_port}",
                v4_coordinator_ids=1,
                ledger_url=f"file://{tmp_path / 'txn-logs'}",
            ),
            store=store,
        )
        return broker, coordinator

    # on two ports held from the pick on (none another process could take first)
    broker, coordinator = await start_on_free_ports(servers)
    try:
        yield broker.settings.advertise_url
    finally:
        await coordinator.stop()
        await broker.stop()
        await store.close()


@pytest.mark.parametrize("names", AT_LIMIT)
async def test_a_persistent_topic_at_every_limit_lives_on_every_layer(
    limit_cluster: str, tmp_path: Path, names: tuple[str, str, str, str]
) -> None:
    tenant, namespace, local, subscription = names
    topic = f"persistent://{tenant}/{namespace}/{local}"
    async with Client(limit_cluster) as client:
        await client.admin.create_topic(topic)
        consumer = await client.subscribe(topic, subscription, initial_position="earliest")
        producer = await client.create_producer(topic, name="p" * 128)
        await producer.send(b"plain", key="k", properties={"a": "b"})
        async with client.transaction() as txn:  # v4: markers, and a snapshot of the buffer
            await producer.send(b"in a transaction", txn=txn)
        for expected in (b"plain", b"in a transaction"):
            message = await consumer.receive(timeout_s=10)
            assert message.value == expected
            async with client.transaction() as txn:  # the subscription's pending-ack log
                await consumer.acknowledge(message, txn=txn)
        stats = await client.admin.stats(topic)
        assert stats["subscriptions"][subscription]["backlog"] == 0
        await client.admin.update_properties(topic, {"owner": "limits"})
        assert (await client.admin.properties(topic))["owner"] == "limits"
        await client.admin.trim(topic)
        assert topic in await client.admin.list_topics("persistent", tenant, namespace)
        await consumer.close()
        await producer.close()
        longest = max(len(p.name) for p in (tmp_path / "ledgers").iterdir())
        assert longest == FILE_NAME_BYTES  # the pending-ack log: the bound is exact
        await client.admin.delete_topic(topic, force=True)
        assert topic not in await client.admin.list_topics("persistent", tenant, namespace)
    left = [p.name for p in (tmp_path / "ledgers").iterdir()]
    assert all(len(name) < FILE_NAME_BYTES for name in left)  # the log went with its topic


@pytest.mark.parametrize("names", AT_LIMIT[:2])
async def test_a_scalable_topic_at_every_limit_lives_on_every_layer(
    limit_cluster: str, names: tuple[str, str, str, str]
) -> None:
    tenant, namespace, local, subscription = names
    topic = f"topic://{tenant}/{namespace}/{local}"
    async with Client(limit_cluster) as client:
        await client.admin.create_topic(topic, segments=2)
        consumer = await client.subscribe(topic, subscription, initial_position="earliest")
        producer = await client.create_producer(topic)
        async with client.transaction() as txn:  # v5: op records keyed by segment
            for key in ("a", "b", "c", "d"):
                await producer.send(key.encode(), key=key, txn=txn)
        received = []
        async with client.transaction() as txn:
            for _ in range(4):
                message = await consumer.receive(timeout_s=10)
                received.append(message.value)
                await consumer.acknowledge(message, txn=txn)
        assert sorted(received) == [b"a", b"b", b"c", b"d"]
        await client.admin.split(topic, 0)
        stats = await client.admin.stats(topic)
        assert stats["activeSegments"] == 3
        await client.admin.update_properties(topic, {"owner": "limits"})
        await consumer.close()
        await producer.close()
        await client.admin.delete_topic(topic, force=True)
        with pytest.raises(ServerError) as gone:
            await client.admin.stats(topic)
        assert gone.value.name is ErrorName.TOPIC_NOT_FOUND


async def test_a_scalable_topic_of_256_segments_is_created_and_deleted(
    limit_cluster: str,
) -> None:
    """More homes than one store step (etcd: 128 operations) takes, both ways."""
    async with Client(limit_cluster) as client:
        await client.admin.create_topic("topic://acme/limits/wide", segments=256)
        assert (await client.admin.stats("topic://acme/limits/wide"))["activeSegments"] == 256
        await client.admin.delete_topic("topic://acme/limits/wide")
        assert await client.admin.list_topics("topic", "acme", "limits") == []
        with pytest.raises(ServerError) as too_many:
            await client.admin.create_topic("topic://acme/limits/wider", segments=257)
        assert too_many.value.name is ErrorName.INVALID_ARGUMENT
