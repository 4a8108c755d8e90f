"""The checker on runs recorded in topics, end to end in ``local[2]``: every history event goes
through the history writer into a real broker's history topic, the data into the run's three
topics, and the checker reads all of it back through the ``segtxn`` data source, with no file
of the run anywhere. The runs are test_checker's clean run and its doctored ones (one per
anomaly kind), so both history stores are held to the same cases."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pyspark.sql import Row, SparkSession

from segtxn.client import Client, TopicEnded
from segtxn.protocol.names import TopicName
from segtxn.verify.checker import (
    ANOMALIES,
    Frames,
    RunNotRecorded,
    anomaly_frames,
    check,
    history_lines,
    load_topics,
    sample_entries,
)
from segtxn.verify.history import HistoryStore, InputRecord, OutputRecord, encode
from segtxn.verify.history_topic import HISTORY_SEGMENTS, TopicHistory, TopicTail
from segtxn.verify.locate import locate
from segtxn.verify.processor import Topics
from segtxn.verify.workload import RunInfo
from tests.cluster import Cluster
from tests.verify.runs import Run, input_id
from tests.verify.test_checker import INJECTIONS, aborted_read
from tests.waiting import wait_until

pytestmark = pytest.mark.parametrize("cluster", ["etcd"], indirect=True)
ROOT = Path(__file__).resolve().parents[2]


async def create_topics(client: Client, run: str) -> Topics:
    topics = Topics.for_run(run)
    for topic in (topics.input, topics.out_a, topics.out_b):
        await client.admin.create_topic(topic, segments=1)
    await client.admin.create_topic(topics.history, segments=HISTORY_SEGMENTS)
    return topics


async def record(client: Client, cluster: Cluster, run: Run, name: str) -> dict[str, str]:
    """Store ``run`` the way the workload leaves a run recorded in topics: its inputs and
    outputs in the run's topics, in the order of the positions the test gave them; every
    client's events through its :class:`TopicHistory`; the orchestrator's ``run`` event last.
    The test's made-up input ids become the ones the broker gave (returned: made-up -> real)."""
    topics = await create_topics(client, name)
    real: dict[str, str] = {}
    feeder = await client.create_producer(topics.input)
    for _, _, _, made_up, key, seq in sorted(run.inputs, key=lambda row: row[:3]):
        real[made_up] = str(await feeder.send(encode(InputRecord(key, seq)), key=key))
    for out, topic in (("a", topics.out_a), ("b", topics.out_b)):
        producer = await client.create_producer(topic)
        for row in sorted((o for o in run.outputs if o[0] == out), key=lambda o: o[1:4]):
            in_key, in_seq, in_id, txn, processor = row[5:]
            value = OutputRecord(in_key, in_seq, real.get(in_id, in_id), txn, processor)
            await producer.send(encode(value), key=in_key)
    histories: dict[str, TopicHistory] = {}
    for event in run.events:
        fields = {k: v for k, v in event.items() if v is not None and k not in ("kind", "client")}
        if "id" in fields:
            fields["id"] = real.get(fields["id"], fields["id"])
        if "inputs" in fields:
            fields["inputs"] = [{**i, "id": real.get(i["id"], i["id"])} for i in fields["inputs"]]
        writer = histories.get(event["client"])
        if writer is None:
            writer = await TopicHistory.open(client, topics.history, event["client"])
            histories[event["client"]] = writer
        writer.record(event["kind"], **fields)
    info = RunInfo(
        url=cluster.url,
        run=name,
        topics={"input": topics.input, "out_a": topics.out_a, "out_b": topics.out_b},
        config={"history": HistoryStore.TOPICS.value},
        started=0.0,
        drained=True,
        ended=10.0,
        leftover=[real.get(i, i) for i in run.leftover],
        fed=sum(1 for e in run.events if e["kind"] == "sent"),
    )
    orchestrator = await TopicHistory.open(client, topics.history, "orchestrator")
    info.record(orchestrator)
    for writer in [*histories.values(), orchestrator]:
        await writer.close()
    return real


@pytest.mark.timeout(900)  # every query and the stats, on a shared machine
async def test_a_clean_run_recorded_in_topics_passes(
    client: Client, cluster: Cluster, spark: SparkSession
) -> None:
    await record(client, cluster, Run.clean(), "clean")
    frames = await asyncio.to_thread(load_topics, spark, cluster.url, "clean")
    assert frames.info is not None and frames.info.drained and frames.run_dir is None
    report = await asyncio.to_thread(check, frames)
    assert report.counts == dict.fromkeys(ANOMALIES, 0)
    assert report.stats["transactions"] == {"committed": 2, "aborted": 1}
    assert (report.stats["inputs_sent"], report.stats["outputs_visible"]) == (3, 6)


@pytest.mark.timeout(600)
async def test_an_anomalys_places_in_a_history_topic_are_its_clients_events(
    client: Client, cluster: Cluster, spark: SparkSession
) -> None:
    """What the report shows under a sample (check() does this for every sample): the
    aborted T2's output shows; T2 and its input are found in the history topic, each place
    a client's N-th event, as files give its N-th line."""
    doctored = Run.clean()
    aborted_read(doctored)
    real = await record(client, cluster, doctored, "aborted")
    frames = await asyncio.to_thread(load_topics, spark, cluster.url, "aborted")

    def caught_rows() -> list[Row]:
        return anomaly_frames(frames)["aborted_read"].collect()

    [caught] = await asyncio.to_thread(caught_rows)
    entries = sample_entries(caught.asDict())
    source = real[input_id("k1", 0)]
    assert entries[:2] == ["T2", source]
    assert frames.history is not None
    lines = await asyncio.to_thread(history_lines, frames.history, entries)
    mentions = locate(None, entries, lines).mentions
    p1 = [e for e in doctored.events if e["client"] == "p1"]
    t2 = [f"history/p1:{n}" for n, e in enumerate(p1, start=1) if e["txn"] == "T2"]
    assert [str(p) for p in mentions["T2"].places] == t2[:3]
    sent = mentions[source].history[0]
    assert str(sent) == "history/feeder:3" and source in sent.text  # k1:0 was fed third
    assert mentions[source].total == 5  # sent; received and ended in T2, then in T3


def rows_of(frames: Frames, kind: str) -> list[Row]:
    """The rows that show anomaly ``kind`` (a Spark job: run it off the event loop)."""
    return anomaly_frames(frames)[kind].collect()


@pytest.mark.timeout(1200)  # nine runs, each read back by Spark
async def test_each_anomaly_injected_into_a_run_recorded_in_topics_is_caught(
    client: Client, cluster: Cluster, spark: SparkSession
) -> None:
    for kind, inject in INJECTIONS.items():
        run = Run.clean()
        inject(run)
        name = kind.replace("_", "-")
        await record(client, cluster, run, name)
        frames = await asyncio.to_thread(load_topics, spark, cluster.url, name)
        caught = await asyncio.to_thread(rows_of, frames, kind)
        assert caught, f"{kind} was injected into a run recorded in topics and not caught"
        spark.catalog.clearCache()


async def test_a_run_that_has_not_finished_is_refused(
    client: Client, cluster: Cluster, spark: SparkSession
) -> None:
    topics = await create_topics(client, "unfinished")
    history = await TopicHistory.open(client, topics.history, "p1")
    history.record("begin", session="s1", txn="1:1")
    await history.close()
    with pytest.raises(RunNotRecorded, match="no run event"):
        await asyncio.to_thread(load_topics, spark, cluster.url, "unfinished")


async def test_the_tail_follows_processors_in_the_history_topic(client: Client) -> None:
    topics = await create_topics(client, "tail")
    p1 = await TopicHistory.open(client, topics.history, "p1")
    p2 = await TopicHistory.open(client, topics.history, "p2")
    tail = await TopicTail.follow(client, topics.history, ["p1", "p2", "p3"])
    try:
        p1.record("begin", txn="1:1")
        p2.record("begin", txn="2:1")
        p2.record("committing", txn="2:1")
        await wait_until(lambda: tail.open == {"p1": "1:1", "p2": "2:1", "p3": None})
        await wait_until(lambda: (tail.committing, tail.last_committing) == (1, ("p2", "2:1")))
        p2.record("ended", txn="2:1", outcome="committed")
        await wait_until(lambda: tail.open == {"p1": "1:1", "p2": None, "p3": None})
        await tail.poll()  # its readers are well
    finally:
        await tail.close()
        await p1.close()
        await p2.close()


RECORDER = """
import asyncio, sys
from segtxn.client import Client
from segtxn.verify.history_topic import TopicHistory

async def main() -> None:
    async with Client(sys.argv[1]) as client:
        history = await TopicHistory.open(client, sys.argv[2], "p9")
        for seq in range(50):
            history.record("received", seq=seq)
        await history.durable()
        print("durable", flush=True)
        for seq in range(50, 60):
            history.record("received", seq=seq)  # in doubt when the SIGKILL comes
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def read_all(client: Client, topic: str) -> list[dict[str, Any]]:
    """Every event in the history topic, each segment in order."""
    stats = await client.admin.stats(topic)
    events = []
    for segment in sorted(s["id"] for s in stats["segments"]):
        name = str(TopicName.parse(topic).segment_name(segment))
        reader = await client.create_reader(name, end="latest")
        try:
            while True:
                events.append(msgspec.json.decode((await reader.receive(timeout_s=10)).value))
        except TopicEnded:
            pass
        finally:
            await reader.close()
    return events


@pytest.mark.timeout(180)
async def test_a_sigkilled_recorder_keeps_what_was_durable_and_nothing_twice(
    client: Client, cluster: Cluster
) -> None:
    topics = await create_topics(client, "killed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    recorder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RECORDER, cluster.url, topics.history,
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert recorder.stdout is not None
        async with asyncio.timeout(60):
            assert await recorder.stdout.readline() == b"durable\n"
    finally:
        recorder.send_signal(signal.SIGKILL)
        await recorder.wait()
    seqs = [e["seq"] for e in await read_all(client, topics.history) if e["client"] == "p9"]
    assert seqs[:50] == list(range(50))  # everything durable() covered, in order
    assert seqs == list(range(len(seqs))) and len(seqs) <= 60  # then a prefix, none twice
