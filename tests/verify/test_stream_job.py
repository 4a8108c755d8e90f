"""``segtxn verify stream``: it refuses, in one line, a run whose topics are not on the
cluster (before it starts Spark), and reads a run that has ended to its end, once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from segtxn.cli.commands import main
from segtxn.client import Client
from segtxn.verify.history import InputRecord, encode
from segtxn.verify.processor import Topics
from segtxn.verify.stream_job import StreamSettings, follow_run, summary
from tests.cluster import Cluster


async def test_stream_names_the_topics_it_waited_for(cluster: Cluster, tmp_path: Path) -> None:
    args = ["verify", "stream", "--url", cluster.url, "--run", "absent"]
    args += ["--run-dir", str(tmp_path), "--wait", "0.5"]
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "topic://verify/absent/input, topic://verify/absent/out-a" in lines[0]
    assert "after 0.5 s (is run 'absent' started, on this cluster?)" in lines[0]


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)  # Spark's time is the cost
@pytest.mark.timeout(300)
async def test_a_run_that_ended_is_read_to_its_end_once(
    client: Client, cluster: Cluster, spark: SparkSession, tmp_path: Path
) -> None:
    topics = Topics.for_run("ended")
    for topic in (topics.input, topics.out_a, topics.out_b):
        await client.admin.create_topic(topic, segments=2)
    feeder = await client.create_producer(topics.input)
    for seq in range(5):
        await feeder.send(encode(InputRecord("k", seq)), key="k")
    await feeder.send(encode(InputRecord("k", 2)), key="k")  # out of order
    (tmp_path / "run.json").write_text("{}")  # the run has ended: one last read, then stop
    settings = StreamSettings(cluster.url, "ended", tmp_path, tmp_path / "ckpt", trigger_s=0.2)
    lines: list[str] = []
    check = await asyncio.to_thread(follow_run, spark, settings, lines.append)
    assert sum(int(line.split()[2]) for line in lines) == 6, lines
    assert check.counts["order_violation"] == 1
    assert "order_violation       1" in summary(check)
