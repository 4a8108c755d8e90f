"""The continuous check: what it decides online, first on records handed to it, then as a
Spark stream over a live broker's topics, clean and then doctored."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from segtxn.client import Client
from segtxn.verify.history import FileHistory, HistoryStore, InputRecord, OutputRecord, encode
from segtxn.verify.history_topic import open_history
from segtxn.verify.processor import Topics
from segtxn.verify.stream_check import (
    BatchReport,
    OnlineCheck,
    Outcomes,
    Record,
    run_frame,
    start_check,
)
from tests.cluster import Cluster
from tests.waiting import wait_until


def out(key: str, seq: int, txn: str, n: int) -> Record:
    return Record("out-a", key, seq, f"segment://t/o/0@1:{n}", txn)


async def test_decides_order_duplicates_and_aborted_reads_across_batches(tmp_path: Path) -> None:
    history = FileHistory(tmp_path, "p1")
    check = OnlineCheck(Outcomes(tmp_path), window=2)
    clean = [Record("input", "k", s, f"in@1:{s}") for s in range(3)]
    clean += [out("k", 0, "1:1", 0), out("k", 1, "1:1", 1)]
    assert check.batch(0, clean).found == {"aborted_read": 0, "duplicate": 0, "order_violation": 0}
    assert check.batch(0, clean).rows == 0  # Spark ran batch 0 again: checked already
    assert check.batch(1, []).pending == 1  # 1:1 has not ended in a history yet
    history.record("ended", txn="1:1", outcome="committed")
    history.record("ended", txn="1:2", outcome="timed_out")
    report = check.batch(2, [out("k", 2, "1:2", 2), out("k", 1, "1:3", 3)])
    assert report.found == {"aborted_read": 1, "duplicate": 1, "order_violation": 1}
    assert report.pending == 1  # 1:3
    assert check.samples["aborted_read"] == [
        "txn=1:2, outcome=timed_out, topic=out-a, key=k, seq=2, txn=1:2, id=segment://t/o/0@1:2"
    ]
    assert "before=2" in check.samples["order_violation"][0]
    # the window keeps the two highest seqs: a copy of 0 is an order violation, not a duplicate
    report = check.batch(3, [out("k", 0, "1:4", 4), Record("input", "k", 1, "in@1:9")])
    assert report.found == {"aborted_read": 0, "duplicate": 0, "order_violation": 2}
    assert check.anomalies == 5
    await history.close()


def test_gives_up_on_the_oldest_pending_transactions(tmp_path: Path) -> None:
    check = OnlineCheck(Outcomes(tmp_path), max_pending=2)
    report = check.batch(0, [out(f"k{i}", 0, f"1:{i}", i) for i in range(5)])
    assert report.pending == 2 and check.undecided == 3


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)  # Spark's time is the cost
@pytest.mark.parametrize("store", list(HistoryStore))
@pytest.mark.timeout(300)
async def test_a_stream_finds_nothing_on_clean_data_then_each_doctored_anomaly(
    client: Client, cluster: Cluster, spark: SparkSession, tmp_path: Path, store: HistoryStore
) -> None:
    """The outcomes come from history files, or from the history topic as a fourth stream."""
    topics = Topics.for_run("online")
    for topic in (topics.input, topics.out_a, topics.out_b, topics.history):
        await client.admin.create_topic(topic, segments=2)
    feeder = await client.create_producer(topics.input)
    outputs = {t: await client.create_producer(t) for t in (topics.out_a, topics.out_b)}
    history = await open_history(store, "p1", run_dir=tmp_path, topic=topics.history, client=client)
    in_topic = store is HistoryStore.TOPICS
    reports: list[BatchReport] = []
    lock = threading.Lock()

    def keep(report: BatchReport) -> None:
        with lock:
            reports.append(report)

    def seen() -> int:
        with lock:
            return sum(r.rows for r in reports)

    async def process(
        key: str, seq: int, *, commit: bool = True, txn_id: str | None = None
    ) -> None:
        """An input and, in a transaction, its output in both output topics."""
        input_id = await feeder.send(encode(InputRecord(key, seq)), key=key)
        txn = await client.transaction().start()
        name = txn_id or str(txn.id)
        for producer in outputs.values():
            record = OutputRecord(key, seq, str(input_id), name, "p1")
            await producer.send(encode(record), key=key, txn=txn)
        await (txn.commit() if commit else txn.abort())
        history.record("ended", txn=name, outcome="committed" if commit else "aborted")

    check = OnlineCheck(Outcomes(None if in_topic else tmp_path / "history"))

    def start() -> StreamingQuery:  # Spark plans in a thread: the loop serves the broker
        frame = run_frame(spark, cluster.url, topics, history=in_topic)
        return start_check(frame, check, tmp_path / "ckpt", keep, trigger_s=0.2)

    query = await asyncio.to_thread(start)
    try:
        for seq in range(3):
            for key in ("k0", "k1"):
                await process(key, seq)
        await process("k0", 3, commit=False)  # invisible: no anomaly
        await wait_until(lambda: seen() >= 6 * 3 + 1, timeout=150, what="the clean records")
        assert check.anomalies == 0, check.samples

        # doctored: a second copy of k1's output 2, k2's output 4 after its 5, and an output
        # of a transaction the history says was aborted
        for producer in outputs.values():
            for key, seq in (("k1", 2), ("k2", 5), ("k2", 4)):
                record = OutputRecord(key, seq, f"segment://x/y/z/0@1:{seq}", "9:9", "p1")
                await producer.send(encode(record), key=key)
        history.record("ended", txn="9:8", outcome="aborted")
        await outputs[topics.out_a].send(
            encode(OutputRecord("k0", 9, "segment://x/y/z/0@1:2", "9:8", "p1")), key="k0"
        )
        history.record("ended", txn="9:9", outcome="committed")
        await wait_until(lambda: seen() >= 6 * 3 + 1 + 7, timeout=150, what="the doctored ones")
        await wait_until(lambda: check.counts["aborted_read"] == 1, timeout=30, what="the abort")
    finally:
        await asyncio.to_thread(query.stop)
        await history.close()
    assert check.counts == {"aborted_read": 1, "duplicate": 2, "order_violation": 4}
    # in out-a and out-b each: k1:2 again is a duplicate and out of order (2 after 2), k2:4
    # after k2:5 out of order
    assert any("key=k1, seq=2" in s for s in check.samples["duplicate"])
    assert json.dumps(check.samples)  # plain text samples for the report
