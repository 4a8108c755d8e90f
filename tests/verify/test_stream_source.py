"""``spark.readStream.format("segtxn")`` against a live broker: committed entries only, each
in exactly one micro-batch, across micro-batches, a restart from the checkpoint, a split and
a merge.

The cluster runs on the embedded store only: the stream reads through a broker's reader
and admin API, which are the same on either store, and each Spark query costs seconds on
the shared cores.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from segtxn.client import Client
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/stream/events"
pytestmark = [
    pytest.mark.parametrize("cluster", ["memory"], indirect=True),
    pytest.mark.timeout(300),
]


class Batches:
    """A foreachBatch sink that keeps each micro-batch's rows by batch id: a batch Spark
    runs again after a restart replaces its first run (the idempotent sink Spark's
    exactly-once asks for)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_id: dict[int, list[dict[str, Any]]] = {}

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = [r.asDict() for r in frame.collect()]
        with self._lock:
            self.by_id[batch_id] = rows

    def rows(self) -> list[tuple[int, dict[str, Any]]]:
        with self._lock:
            return [(b, r) for b in sorted(self.by_id) for r in self.by_id[b]]

    def values(self) -> list[bytes]:
        return [bytes(r["value"]) for _, r in self.rows()]


def start(
    spark: SparkSession, url: str, checkpoint: Path, sink: Batches, *, available_now: bool = False
) -> StreamingQuery:
    stream = spark.readStream.format("segtxn").option("url", url).option("topic", TOPIC).load()
    writer = stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="200 milliseconds").start()


async def test_committed_entries_exactly_once_across_batches_and_a_restart(
    client: Client, cluster: Cluster, spark: SparkSession, tmp_path: Path
) -> None:
    await client.admin.create_topic(TOPIC, segments=2)
    producer = await client.create_producer(TOPIC)
    one = [f"one-{i}".encode() for i in range(6)]
    for i, value in enumerate(one):
        await producer.send(value, key=f"k{i}")
    sink = Batches()
    query = await asyncio.to_thread(start, spark, cluster.url, tmp_path / "ckpt", sink)
    try:
        await wait_until(lambda: len(sink.values()) >= len(one), timeout=120, what="batch one")
        first_batches = set(sink.by_id)
        async with client.transaction() as txn:
            await producer.send(b"two-committed", key="k1", txn=txn)
        aborted = await client.transaction().start()
        await producer.send(b"two-aborted", key="k2", txn=aborted)
        await aborted.abort()
        two = [b"two-committed"] + [f"two-{i}".encode() for i in range(4)]
        for value in two[1:]:
            await producer.send(value, key=value.decode())
        await wait_until(
            lambda: len(sink.values()) >= len(one) + len(two), timeout=120, what="batch two"
        )
    finally:
        await asyncio.to_thread(query.stop)
    assert sorted(sink.values()) == sorted(one + two)
    later = [b for b, r in sink.rows() if bytes(r["value"]) in two]
    assert min(later) > max(first_batches)  # a micro-batch after the first ones

    three = [f"three-{i}".encode() for i in range(3)]
    for value in three:
        await producer.send(value, key=value.decode())
    again = Batches()
    query = await asyncio.to_thread(
        start, spark, cluster.url, tmp_path / "ckpt", again, available_now=True
    )
    await asyncio.to_thread(query.awaitTermination, 120)
    assert query.exception() is None
    new = [b for b in again.by_id if b not in sink.by_id]
    assert sorted(v for b in new for v in (bytes(r["value"]) for r in again.by_id[b])) == sorted(
        three
    )
    for b in again.by_id.keys() & sink.by_id.keys():  # one Spark ran again: the same rows
        assert again.by_id[b] == sink.by_id[b]
    assert all(r["topic"] == TOPIC for _, r in again.rows())


async def test_follows_a_split_and_a_merge_in_key_order(
    client: Client, cluster: Cluster, spark: SparkSession, tmp_path: Path
) -> None:
    await client.admin.create_topic(TOPIC, segments=2)
    producer = await client.create_producer(TOPIC)
    keys = [f"k{i}" for i in range(8)]
    seq = 0

    async def send_round() -> None:
        nonlocal seq
        for key in keys:
            await producer.send(json.dumps([key, seq]).encode(), key=key)
        seq += 1

    sink = Batches()
    query = await asyncio.to_thread(start, spark, cluster.url, tmp_path / "ckpt", sink)
    try:
        for _ in range(3):
            await send_round()
        await wait_until(lambda: len(sink.values()) >= 3 * len(keys), timeout=120, what="start")
        await client.admin.split(TOPIC, 0)  # 0 -> 2, 3
        for _ in range(3):
            await send_round()
        await client.admin.merge(TOPIC, 3, 1)  # 3 + 1 -> 4
        for _ in range(3):
            await send_round()
        await wait_until(lambda: len(sink.values()) >= 9 * len(keys), timeout=120, what="all")
    finally:
        await asyncio.to_thread(query.stop)

    rows = sorted(
        sink.rows(), key=lambda br: (br[0], br[1]["segment"], br[1]["ledger_id"], br[1]["entry_id"])
    )
    records = [tuple(json.loads(bytes(r["value"]))) for _, r in rows]
    assert sorted(records) == sorted((k, s) for k in keys for s in range(9))  # exactly once
    for key in keys:  # in the order the topic holds a key: batches, then (segment, position)
        assert [s for k, s in records if k == key] == list(range(9))
    segments = {r["segment"] for _, r in rows}
    assert {0, 1, 4} <= segments and segments & {2, 3}
    # the offset the last micro-batch read to, as Spark logged it before running the batch
    # (its progress report may not be out yet when the query stops)
    logged = (tmp_path / "ckpt" / "offsets" / str(max(sink.by_id))).read_text().splitlines()
    offset = json.loads(logged[2])  # "v1", the batch's metadata, then the source's offset
    assert offset["segments"]["0"]["done"] and offset["segments"]["3"]["done"]
    assert offset["segments"]["1"]["done"] and not offset["segments"]["4"]["done"]
