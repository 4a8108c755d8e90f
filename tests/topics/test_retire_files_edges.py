"""Retiring sealed segments when one segment's ledger file is not its own (another
cluster's, a wrong restore): ledger deletes refuse such a file (LedgerMismatch, nothing
deleted), and the sweep must go on to the other segments rather than stop at it."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest

from segtxn.broker.retire import retire_segments
from segtxn.client import Client
from segtxn.ledger import FileLogStorage
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.topics.test_retire import LATER_MS

FOREIGN, OURS = "topic://acme/retire/a", "topic://acme/retire/b"  # swept in this order


async def _split_and_consume(client: Client, topic: str) -> None:
    """Segment 0 of ``topic`` sealed by a split, all of it acknowledged by ``s``."""
    await client.admin.create_topic(topic, segments=1)
    await client.admin.create_subscription(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic)
    for i in range(2):
        await producer.send(f"{topic}-{i}".encode(), key=f"k{i}")
    await client.admin.split(topic, 0)
    await producer.close()
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    for _ in range(2):
        await consumer.acknowledge(await consumer.receive(timeout_s=10))
    await consumer.close()


async def test_a_segment_with_a_foreign_file_is_left_and_the_sweep_goes_on(
    cluster: Cluster, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    for topic in (FOREIGN, OURS):
        await _split_and_consume(client, topic)
    foreign, ours = (TopicName.parse(t).segment_name(0) for t in (FOREIGN, OURS))
    storage = FileLogStorage(Path(cluster.broker.settings.ledger_url.removeprefix("file://")))
    # a wrong restore put another ledger's file (its own nonce) under the first one's name
    path = storage.path(str(foreign), 1)
    copy = path.with_suffix(".restored")
    shutil.copyfile(storage.path(str(ours), 1), copy)
    os.replace(copy, path)
    held = path.read_bytes()

    with caplog.at_level(logging.ERROR):
        assert await retire_segments(service, LATER_MS) == [ours]
    assert path.read_bytes() == held  # left as it is
    assert not (storage.root / quote(str(ours), safe="")).exists()  # the other one went
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(str(foreign) in m and "nonce" in m for m in errors), errors
