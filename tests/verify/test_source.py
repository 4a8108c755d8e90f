"""The ``segtxn`` Spark data source against a real cluster: committed data only, one
partition per segment, clear errors for bad options."""

from __future__ import annotations

import asyncio

import pytest
from pyspark.sql import SparkSession

from segtxn.client import Client
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster

TOPIC = "topic://acme/spark/events"
PLAIN = "persistent://acme/spark/plain"


def read(spark: SparkSession, url: str, topic: str) -> tuple[list[tuple[int, str, bytes]], int]:
    frame = spark.read.format("segtxn").option("url", url).option("topic", topic).load()
    rows = [(r["segment"], r["key"], bytes(r["value"])) for r in frame.collect()]
    return rows, frame.rdd.getNumPartitions()


@pytest.mark.timeout(180)
async def test_reads_committed_messages_one_partition_per_segment(
    client: Client, cluster: Cluster, spark: SparkSession
) -> None:
    await client.admin.create_topic(TOPIC, segments=2)
    producer = await client.create_producer(TOPIC)
    for i in range(10):
        await producer.send(f"plain-{i}".encode(), key=f"k{i}")
    async with client.transaction() as txn:
        await producer.send(b"committed", key="k1", txn=txn)
    aborted = await client.transaction().start()
    await producer.send(b"aborted", key="k2", txn=aborted)
    await aborted.abort()
    await client.admin.split(TOPIC, 0)
    await producer.send(b"after-split", key="k3")

    rows, partitions = await asyncio.to_thread(read, spark, cluster.url, TOPIC)
    assert partitions == 4  # segments 0 and 1, and 0's children 2 and 3
    values = sorted(value for _, _, value in rows)
    assert values == sorted(
        [f"plain-{i}".encode() for i in range(10)] + [b"after-split", b"committed"]
    )
    layout = await client.connector.lookup(TopicName.parse(TOPIC))
    for segment, key, _ in rows:  # each row in the segment that covered its key then
        assert segment in {s["id"] for s in layout["segments"]}
        assert key is not None


async def test_reads_a_persistent_topic(
    client: Client, cluster: Cluster, spark: SparkSession
) -> None:
    await client.admin.create_topic(PLAIN)
    producer = await client.create_producer(PLAIN)
    for i in range(5):
        await producer.send(f"m{i}".encode())
    rows, partitions = await asyncio.to_thread(read, spark, cluster.url, PLAIN)
    assert partitions == 1
    assert [value for _, _, value in rows] == [f"m{i}".encode() for i in range(5)]


async def test_bad_options_fail_with_a_clear_message(cluster: Cluster, spark: SparkSession) -> None:
    def load(**options: str) -> None:
        reader = spark.read.format("segtxn")
        for name, value in options.items():
            reader = reader.option(name, value)
        reader.load().collect()

    with pytest.raises(Exception, match="option 'url' is required"):
        await asyncio.to_thread(load, topic=TOPIC)
    with pytest.raises(Exception, match="option 'topic' is required"):
        await asyncio.to_thread(load, url=cluster.url)
    with pytest.raises(Exception, match=r"does not exist|TopicNotFound"):
        await asyncio.to_thread(load, url=cluster.url, topic="topic://acme/spark/nothing")
