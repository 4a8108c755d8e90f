"""``segtxn topics`` when brokers are down or answers are lost: a split or merge whose answer
never came says it may or may not have happened and how to look; ``topics stats`` of a
``topic://`` shows the segments it could reach and marks the others (trial 2, M6 and M7)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from segtxn.cli.commands import main
from segtxn.client import Client
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName
from tests import processes
from tests.processes import ServerProcess

T = "topic://t/ns/lost"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
async def hangs_up() -> AsyncIterator[str]:
    """A server that reads each request and closes the connection without answering, as a
    broker killed after it took a request does."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError):  # a connect-only probe
            await reader.readuntil(b"\r\n\r\n")
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("command", "change"),
    [
        (["split", T, "0"], f"the split of segment 0 of {T}"),
        (["merge", T, "1", "2"], f"the merge of segments 1 and 2 of {T}"),
    ],
)
async def test_a_split_or_merge_whose_answer_is_lost_may_have_happened(
    hangs_up: str, command: list[str], change: str
) -> None:
    result = await asyncio.to_thread(invoke, "topics", *command, "--url", hangs_up)
    assert result.exit_code == 1, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: the answer was lost (ServiceNotReady: cannot reach "), line
    assert "the server closed the connection" in line
    assert line.endswith(
        f"{change} may or may not have happened; 'segtxn topics stats {T}' shows its "
        "segments and last change"
    ), line


async def test_stats_of_a_topic_with_a_segment_broker_down_shows_the_others(
    etcd_server: EtcdServer, tmp_path: Path, started: list[ServerProcess]
) -> None:
    store = etcd_server.url(f"/stats-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    brokers = {f"b{i}": processes.broker(store, tmp_path / f"b{i}", f"b{i}") for i in (1, 2)}
    started += brokers.values()
    for broker in brokers.values():
        broker.start()
    for broker in brokers.values():
        await broker.ready()
    topic = "topic://t/ns/spread"
    async with Client(brokers["b1"].url) as client:
        await client.admin.create_topic(topic, segments=4)
        looked_up = await client.connector.lookup(TopicName.parse(topic))
    on = {int(s["id"]): s["brokerUrl"] for s in looked_up["segments"]}
    down = brokers["b2"] if brokers["b2"].url in on.values() else brokers["b1"]
    up = brokers["b1"] if down is brokers["b2"] else brokers["b2"]
    assert up.url in on.values(), "every segment on one broker: nothing to show"
    down.kill()  # its registration outlives it until its session expires (10 s)

    table = await asyncio.to_thread(invoke, "topics", "stats", topic, "--url", up.url)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    unreachable = sorted(i for i, url in on.items() if url == down.url)
    marked = [line for line in lines if ": unreachable: " in line]
    assert [int(line.split()[1].rstrip(":")) for line in marked] == unreachable, table.stdout
    assert all("connection refused" in line for line in marked), marked

    as_json = await asyncio.to_thread(
        invoke, "topics", "stats", topic, "-o", "json", "--url", up.url
    )
    assert as_json.exit_code == 0, as_json.output
    segments = json.loads(as_json.stdout)["segments"]
    for segment in segments:
        reached = on[int(segment["id"])] == up.url
        assert (segment["stats"] is not None) is reached, segment
        assert ("unreachable" in segment) is not reached, segment
