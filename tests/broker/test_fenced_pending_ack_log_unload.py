"""A subscription's v4 pending-ack log fenced by another owner unloads its topic, once, as a
fence met by the topic's own ledger does; its next transactional ack works where the topic
is served then.

The pending-ack log (segtxn/broker/txn/pending_ack_log.py) is a managed ledger of its own,
opened by the subscription beside the topic's ledger. Its compaction changes the log's
metadata record (a rollover, the cursor's move, a trim), each change conditional on the
version its owner last wrote: another owner's open moves it. A compaction that met that
fence failed ("retried later") and nothing more: the topic stayed served here, every later
compaction failed again, the log grew without bound, and once a write of the log met the
fence the subscription's transactional acks failed for ever (retriable) on a broker that
may no longer own the topic. Now a fence proven by a change of a ledger's record stops that
ledger, and a retriable stop of the pending-ack log stops the topic's ledger too: the broker
lets the topic go and hangs up on its clients, who find it where it is served now.

Real components: the cluster's broker and coordinator on the in-memory store, files in
``tmp_path``; "another owner" changes the log's metadata record as an open by another
broker would.
"""

from __future__ import annotations

import logging

import pytest

from segtxn.broker.txn.pending_ack_log import MLPendingAckStore, pending_ack_log
from segtxn.client import Client
from segtxn.ledger.metadata import metadata_key
from segtxn.protocol.names import TopicName
from tests.broker.test_fenced_cursor_unload import record_let_go
from tests.broker.test_fenced_snapshot_unload import take_over
from tests.cluster import Cluster
from tests.txn.test_v4 import restart_broker
from tests.waiting import wait_until

TOPIC = "persistent://acme/v4/fenced-acks"
NAME = TopicName.parse(TOPIC)
LOG = pending_ack_log(TOPIC, "s")
COMPACT_ENTRIES = 4
"""A compaction once two transactions (an ack and a COMMIT each) were logged."""


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_a_pending_ack_log_fenced_by_another_owner_unloads_the_topic_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await restart_broker(cluster, txn_log_compact_entries=COMPACT_ENTRIES)
    service = cluster.broker.service
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        for i in range(6):
            await producer.send(b"m%d" % i)
        await producer.close()
        consumer = await client.subscribe(
            TOPIC, "s", initial_position="earliest", subscription_type="Shared"
        )
        received = [await consumer.receive(timeout_s=10) for _ in range(6)]
        txn = client.transaction()  # the log is opened by the subscription's first one
        await consumer.acknowledge(received[0], txn=txn)
        await txn.commit()
        topic = service.topics[NAME]
        pending = topic.subscriptions["s"].pending_acks
        assert isinstance(pending, MLPendingAckStore) and pending.ledger is not None
        let_go = record_let_go(monkeypatch)
        await take_over(cluster.store, LOG)
        with caplog.at_level(logging.WARNING):
            txn = client.transaction()  # its COMMIT makes a compaction due: it meets the fence
            await consumer.acknowledge(received[1], txn=txn)
            await txn.commit()
            await wait_until(
                lambda: service.topics.get(NAME) is not topic, what="the fenced topic unloaded"
            )
            await wait_until(lambda: not service.dropping, what="the unload done")
        said = [r.getMessage() for r in caplog.records]
        # (the cause names the log's metadata record, which the fence was met on)
        unloaded = [s for s in said if TOPIC in s and "unloading it" in s]
        assert len(unloaded) == 1 and metadata_key(LOG) in unloaded[0], said
        assert not [s for s in said if "incident" in s], said
        assert [t for t in let_go if t is topic] == [topic], let_go  # once
        # served again (here: its home did not move), the subscription's transactional
        # acks work: the consumer, sent on, receives m2 again and acknowledges it
        while (message := await consumer.receive(timeout_s=10)).value != b"m2":
            pass
        txn = client.transaction()
        await consumer.acknowledge(message, txn=txn)
        await txn.commit()
        reloaded = service.topics[NAME]
        assert reloaded is not topic
        stats = await client.admin.stats(TOPIC)
        assert stats["subscriptions"]["s"]["backlog"] == 3, stats
        await consumer.close()
