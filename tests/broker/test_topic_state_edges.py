"""A topic's state at its edges: what a ``persistent://`` topic deleted and created again
under its name recovers. Real brokers and a real coordinator (memory store and real etcd),
real ledger files; each failed before its fix (a review's suspicions)."""

from __future__ import annotations

import pytest

from segtxn.broker.txn.snapshots import SnapshotLog
from segtxn.client import Client
from segtxn.ledger import LedgerError, Position
from tests.cluster import Cluster
from tests.txn.test_v4 import end, loaded, nothing_more, receive_all, restart_broker

V4_TOPIC = "persistent://acme/v4/reborn"


# ---------------------------------------------------------------------- 1


@pytest.mark.parametrize("tombstoned", [True, False], ids=["tombstoned", "tombstone-failed"])
async def test_a_v4_topic_created_again_never_loads_the_deleted_ones_snapshot(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tombstoned: bool
) -> None:
    """A v4 topic's transaction-buffer snapshot is kept in its namespace's snapshot log
    under the topic's name. The topic is deleted and created again under that name: its
    new ledger's positions start where the old one's did, so the old snapshot (its
    position past every entry of the new topic, an aborted transaction of the old one)
    must not be loaded. Loaded, recovery skipped the new topic's entries: its open
    transaction was not known, and what it sent was delivered before its commit.

    The deletion tombstones the snapshot in this broker's log; when that write fails (or
    the snapshot is in another broker's log, the topic having moved), the snapshot's
    incarnation keeps it from being loaded."""
    if not tombstoned:

        async def fail(self: SnapshotLog, topic: str) -> None:
            raise LedgerError("injected: the tombstone was not written")

        monkeypatch.setattr(SnapshotLog, "forget", fail)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(V4_TOPIC)
        producer = await client.create_producer(V4_TOPIC)
        old = client.transaction()
        for i in range(5):
            await producer.send(f"old-{i}".encode(), txn=old)
        await old.abort()
        await producer.close()
        first = await loaded(cluster, V4_TOPIC)
        await first.snapshot()  # holds `old` as aborted, at the old ledger's end
        await client.admin.delete_topic(V4_TOPIC, force=True)
        gone = await (await cluster.broker.service.snapshots.get("acme", "v4")).latest(V4_TOPIC)
        assert (gone is None) is tombstoned

        await client.admin.create_topic(V4_TOPIC)
        producer = await client.create_producer(V4_TOPIC)
        open_ = client.transaction()
        await producer.send(b"uncommitted", txn=open_)
        await producer.send(b"plain")
        await restart_broker(cluster)  # the topic is recovered from its ledger
        kept = await (await cluster.broker.service.snapshots.get("acme", "v4")).latest(V4_TOPIC)
        assert (kept is None) is tombstoned  # the tombstone is replayed too
        again = await loaded(cluster, V4_TOPIC)
        assert again.recovery["snapshot"] == 0  # none of this topic's own
        assert again.ongoing == {open_.id}
        assert again.visible(old.id, Position(0, 0))  # not aborted here: unknown here
        await client.close(timeout_s=0)  # leaves `open_` open
    async with Client(cluster.url) as client:
        consumer = await client.subscribe(V4_TOPIC, "s", initial_position="earliest")
        await nothing_more(consumer)  # the open transaction holds everything after it
        await end(client, str(open_.id), "COMMIT")
        assert await receive_all(consumer, 2) == [b"uncommitted", b"plain"]
