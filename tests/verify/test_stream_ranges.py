"""Ranges against a real broker: a segment of many ledgers read in ranges, each entry
exactly once (directly and through Spark), and a range held by an open transaction fails
with a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.ledger import LedgerSettings
from segtxn.verify.ranges import COLUMNS, Range, SegmentReadTimeout, parse_position, read_range
from segtxn.verify.source import SegtxnReader
from segtxn.web import Listener
from tests.cluster import Cluster

PLAIN = "persistent://acme/ranges/big"


@pytest.fixture
async def small_ledgers(tmp_path: Path) -> AsyncIterator[BrokerServer]:
    """A broker whose ledgers roll over every 2 KiB: a few hundred messages make a segment of
    many ledgers."""
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    broker = BrokerServer(
        BrokerSettings(
            broker_id="b1",
            advertise_url=f"http://127.0.0.1:{listener.port}",
            store_url="memory://",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
            ledger=LedgerSettings(max_ledger_bytes=2048),
        ),
        listener=listener,
    )
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


@pytest.mark.timeout(180)
async def test_ranges_cover_a_segment_of_many_ledgers_exactly_once(
    small_ledgers: BrokerServer, spark: SparkSession
) -> None:
    url = small_ledgers.settings.advertise_url
    sent = [f"message-{i:04d}-{'x' * 60}".encode() for i in range(300)]
    async with Client(url) as client:
        await client.admin.create_topic(PLAIN)
        producer = await client.create_producer(PLAIN)
        for value in sent:
            await producer.send(value)
        last = (await client.admin.stats(PLAIN))["lastConfirmedPosition"]
    assert parse_position(last)[0] >= 5  # many ledgers

    reader = SegtxnReader({"url": url, "topic": PLAIN, "rangeEntries": "7"})
    plan = await reader._plan()
    ledger, entry = parse_position(last)
    assert len(plan) == ledger - 1 + -(-(entry + 1) // 7)  # one per earlier ledger; the last cut
    read: list[bytes] = []
    for part in plan:
        rows = await read_range(url, part, COLUMNS, 30)
        assert all(
            parse_position(part.start) <= (r[2], r[3]) <= parse_position(part.end) for r in rows
        )
        read += [r[COLUMNS.index("value")] for r in rows]
    assert read == sent  # in order, each once

    def spark_read() -> tuple[list[bytes], int]:
        frame = (
            spark.read.format("segtxn")
            .option("url", url)
            .option("topic", PLAIN)
            .option("rangeEntries", "7")
            .option("columns", "entry_id,value")
            .load()
        )
        assert frame.columns == ["entry_id", "value"]
        return [bytes(r["value"]) for r in frame.collect()], frame.rdd.getNumPartitions()

    values, partitions = await asyncio.to_thread(spark_read)
    assert partitions == len(plan)
    assert sorted(values) == sorted(sent)


async def test_a_range_held_by_an_open_transaction_times_out_clearly(
    client: Client, cluster: Cluster
) -> None:
    topic = "topic://acme/ranges/held"
    await client.admin.create_topic(topic, segments=1)
    producer = await client.create_producer(topic)
    for i in range(3):
        await producer.send(f"before-{i}".encode())
    txn = await client.transaction().start()
    await producer.send(b"undecided", txn=txn)
    await producer.send(b"after")
    stats = await client.admin.stats(topic)
    last = stats["segments"][0]["stats"]["lastConfirmedPosition"]
    part = Range("segment://acme/ranges/held/0", 0, "1:0", last, topic)

    with pytest.raises(
        SegmentReadTimeout,
        match=r"/0 1:0\.\.1:\d+ not read in 0.5 s \(read 3 messages, up to 1:2\): a "
        r"transaction still open",
    ) as caught:
        await read_range(cluster.url, part, ("value",), 0.5)
    assert isinstance(caught.value, TimeoutError)
    await txn.abort()
    rows = await read_range(cluster.url, part, ("value",), 30)
    assert rows == [(b"before-0",), (b"before-1",), (b"before-2",), (b"after",)]
