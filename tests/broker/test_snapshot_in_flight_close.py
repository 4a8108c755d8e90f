"""A topic's close waits for its snapshots in flight a bounded time (segtxn.aio.settle).

A topic's close waited, without a bound, for the de-duplication snapshot (publishing's
``settle``) and the v4 transaction buffer's snapshot (``MarkerTransactionBuffer.close``) in
flight: a write whose answer never came (the store silent, or the answer lost) held the
close, an unload, and a broker's stop for ever; so did the close's own final
de-duplication snapshot, once its parts were closed. The close now waits
:data:`~segtxn.aio.SETTLE_S` at most, then cancels the snapshot (a reload replays from the
previous one) and goes on. On both stores; the write's answer is parked, never given.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from segtxn.aio import CANCEL_GRACE_S, SETTLE_S
from segtxn.broker.dedup_snapshots import PREFIX as DEDUP_PREFIX
from segtxn.broker.topic import Topic
from segtxn.broker.txn.snapshots import snapshot_log
from segtxn.client import Client
from segtxn.ledger.metadata import metadata_key
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.txn.test_v4 import restart_broker

TOPIC = "persistent://acme/settle/t"
BOUND_S = SETTLE_S + CANCEL_GRACE_S + 2.0  # (2: slack on a loaded machine)


def topic(cluster: Cluster) -> Topic:
    return cluster.broker.service.topics[TopicName.parse(TOPIC)]


async def closes_in_its_time(cluster: Cluster) -> None:
    closing = asyncio.create_task(topic(cluster).close())
    done, _ = await asyncio.wait({closing}, timeout=BOUND_S)
    assert closing in done, (
        f"the topic's close did not end within {BOUND_S:.0f} s: it waits for a snapshot "
        "whose write the store never answers"
    )
    await closing
    assert topic(cluster).ledger.is_closing
    cluster.broker.service.topics.pop(TopicName.parse(TOPIC))


async def test_a_close_does_not_wait_for_ever_for_a_dedup_snapshot_in_flight(
    cluster: Cluster,
) -> None:
    await restart_broker(cluster, dedup_snapshot_every=1)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC, name="p")
        held = cluster.faults.hold("txn", key_prefix=DEDUP_PREFIX)  # the next write's answer
        try:
            await producer.send(b"m0")  # its snapshot starts
            async with asyncio.timeout(10):
                await held.wait_for(1)
            await closes_in_its_time(cluster)
        finally:
            held.release()
            cluster.faults.clear()


async def test_a_close_does_not_wait_for_ever_for_its_final_dedup_snapshot(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The close's own last de-duplication snapshot, taken once its parts are closed, had no
    bound of its own either: an unload (a move, a drain) has no time limit above it."""
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC, name="p")
        await producer.send(b"m0")  # (no periodic snapshot: one every 1000 messages)
        held = cluster.faults.hold("txn", key_prefix=DEDUP_PREFIX)  # the final one's write
        try:
            with caplog.at_level(logging.WARNING):
                await closes_in_its_time(cluster)
            assert held.parked == 1
        finally:
            held.release()
            cluster.faults.clear()
    assert any(
        "no final de-duplication snapshot" in r.getMessage() and r.levelno == logging.WARNING
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


async def test_a_close_does_not_wait_for_ever_for_a_transaction_buffer_snapshot_in_flight(
    cluster: Cluster,
) -> None:
    await restart_broker(cluster, txn_buffer_snapshot_every=1)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        txn = client.transaction()
        await producer.send(b"m0", txn=txn)
        log_key = metadata_key(snapshot_log("acme", "settle", cluster.broker.settings.broker_id))
        held = cluster.faults.hold("txn", key_prefix=log_key)  # the snapshot log's creation
        try:
            await txn.commit()  # its marker starts a snapshot
            async with asyncio.timeout(10):
                await held.wait_for(1)
            await closes_in_its_time(cluster)
        finally:
            held.release()
            cluster.faults.clear()
