"""Retention through the broker: the admin trim, and issue 14 end to end (a standalone
SIGKILLed and restarted on its data directory, then trimmed, then read from earliest)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from segtxn.client import Client
from segtxn.ledger import RetentionPolicy
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName
from tests import processes
from tests.broker.conftest import StartBroker

AT_ONCE = RetentionPolicy(retention_time_s=0, retention_bytes=0)  # the most eager policy


async def test_trim_deletes_consumed_ledgers_and_keeps_unsubscribed_ones(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(retention=AT_ONCE)
    consumed, unread = "persistent://acme/ret/consumed", "persistent://acme/ret/unread"
    async with Client(broker.settings.advertise_url) as client:
        for topic in (consumed, unread):
            await client.admin.create_topic(topic)
        consumer = await client.subscribe(consumed, "s", initial_position="earliest")
        for topic in (consumed, unread):
            producer = await client.create_producer(topic)
            for i in range(3):
                await producer.send(f"old-{i}".encode())
        for _ in range(3):
            await consumer.acknowledge(await consumer.receive(timeout_s=10))
        await consumer.close()
        for topic in (consumed, unread):  # a reload closes the ledger written so far
            await broker.service.unload(TopicName.parse(topic))
        assert await client.admin.trim(consumed) == {
            "trimmedLedgers": [1],
            "trimmedEntries": 3,
            "firstRetained": None,  # nothing written since
        }
        kept = await client.admin.trim(unread)
        assert kept["trimmedEntries"] == 0  # no subscription: nothing consumed it
        reader = await client.create_reader(unread, start="earliest")
        assert [(await reader.receive(timeout_s=10)).value for _ in range(3)] == [
            b"old-0",
            b"old-1",
            b"old-2",
        ]


@pytest.mark.slow
async def test_readers_get_every_acknowledged_message_after_sigkills_and_retention(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """Issue 14: outputs of a scalable topic, written (plainly and in committed
    transactions), the standalone SIGKILLed twice and restarted on its data directory (each
    reopen recovers and closes the segments' ledgers), then retention applied with the most
    eager policy: a checkpoint consumer from earliest still gets every acknowledged message,
    while a subscription's consumed data does go."""
    store = etcd_server.url(f"/retention-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    server = processes.standalone(
        "--store", store, "--data-dir", str(tmp_path / "data"),
        "--retention-time", "0", "--retention-size", "0",
    )  # fmt: skip
    output, consumed = "topic://acme/ret/output", "persistent://acme/ret/consumed"
    sent: list[bytes] = []
    try:
        server.start()
        await server.ready()
        for round_ in range(2):
            async with Client(server.url) as client:
                if round_ == 0:
                    await client.admin.create_topic(output, segments=2)
                    await client.admin.create_topic(consumed)
                producer = await client.create_producer(output)
                for i in range(40):
                    sent.append(f"r{round_}-plain-{i}".encode())
                    await producer.send(sent[-1], key=f"k{i}")
                async with client.transaction() as txn:
                    for i in range(20):
                        sent.append(f"r{round_}-txn-{i}".encode())
                        await producer.send(sent[-1], key=f"k{i}", txn=txn)
                if round_ == 0:  # a subscription that consumed everything it was sent
                    subscription = await client.subscribe(
                        consumed, "s", initial_position="earliest"
                    )
                    await (await client.create_producer(consumed)).send(b"done")
                    await subscription.acknowledge(await subscription.receive(timeout_s=30))
            server.kill()
            server.start()  # same data dir, same ports
            await server.ready()
        async with Client(server.url) as client:
            trimmed = await client.admin.trim(output)  # loads (recovers) each segment first
            assert sorted(trimmed["segments"]) == ["0", "1"]
            assert all(s["trimmedEntries"] == 0 for s in trimmed["segments"].values()), trimmed
            assert (await client.admin.trim(consumed))["trimmedEntries"] == 1
            reader = await client.checkpoint_consumer(output)
            got = [(await reader.receive(timeout_s=30)).value for _ in range(len(sent))]
        assert sorted(got) == sorted(sent)
    finally:
        server.stop()
