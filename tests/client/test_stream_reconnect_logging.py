"""A consumer's stream told to retry while it reconnects (segtxn/client/stream.py): the
broker's answer is logged, at WARNING the first time it says something new and at DEBUG
when it says it again, so a consumer kept waiting by a broker is visible in the logs
instead of reconnecting in silence.

Real components: the cluster's broker and coordinator on its store (memory and a real etcd),
files in ``tmp_path``; the consumer is kept out by an unload held at its last step (the
store's fault hold), during which the broker tells it to retry.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from segtxn.broker.dedup_snapshots import PREFIX as DEDUP_PREFIX
from segtxn.client import Client
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "persistent://acme/stream/told-to-retry"


def _told(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "segtxn.client.stream"
        and r.levelno == level
        and "being unloaded" in r.getMessage()
    ]


async def test_a_consumer_told_to_retry_while_it_reconnects_says_so_once_at_warning(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        closing = cluster.faults.hold("txn", key_prefix=DEDUP_PREFIX, before=True)
        unloading = asyncio.create_task(service.unload(TopicName.parse(TOPIC)))
        try:
            with caplog.at_level(logging.DEBUG):
                await closing.wait_for(1)  # the consumer is hung up on; the unload holds
                await wait_until(
                    lambda: len(_told(caplog, logging.DEBUG)) >= 1, what="told to retry again"
                )
                closing.release()
                await unloading
                producer = await client.create_producer(TOPIC)
                await producer.send(b"after")
                assert (await consumer.receive(timeout_s=10)).value == b"after"
        finally:
            closing.release()
            await asyncio.gather(unloading, return_exceptions=True)
        warned = _told(caplog, logging.WARNING)
        assert len(warned) == 1, warned
        assert TOPIC in warned[0] and "ServiceNotReady" in warned[0], warned
