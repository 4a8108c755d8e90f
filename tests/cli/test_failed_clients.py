"""``segtxn produce`` and ``segtxn consume`` that fail part-way say how far they got in their
one error line (as Ctrl-C does) and exit 1; a consumer whose acknowledgments fail for a
while (the broker's store is down) warns once and goes on, as at-least-once allows."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner, Result

from segtxn.cli.commands import main
from segtxn.client import Client, Message
from segtxn.client.consumer import Consumer
from segtxn.ledger.cursor import cursor_key
from segtxn.protocol.errors import TopicNotFound
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.processes import ServerProcess
from tests.waiting import wait_until


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def errors(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    assert "never retrieved" not in stderr, stderr[:3000]
    return [line for line in stderr.splitlines() if line.startswith("Error: ")]


async def _stored(url: str, topic: str) -> int:
    async with Client(url) as client:
        stats = await client.admin.stats(topic)
    return sum(int((s["stats"] or {}).get("msgInCounter", 0)) for s in stats["segments"])


def test_produce_whose_segment_broker_stays_down_says_how_many_were_stored(
    own_standalone: ServerProcess,
) -> None:
    """The broker goes away mid-run for longer than the send timeout: one error line with
    the count stored, not a traceback per send in flight (trial 2, S2)."""
    topic, url = "topic://t/ns/down", own_standalone.url
    assert invoke("topics", "create", topic, "--segments", "2", "--url", url).exit_code == 0
    producing = subprocess.Popen(
        [sys.executable, "-m", "segtxn.cli", "produce", topic, "-n", "10000000", "--size", "8",
         "--keys", "10", "--send-timeout", "2", "--url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:

        async def under_way() -> bool:
            assert producing.poll() is None, producing.communicate()
            return await _stored(own_standalone.url, topic) > 0

        asyncio.run(wait_until(under_way, timeout=60, what="messages stored"))
        own_standalone.kill()
        _, err = producing.communicate(timeout=90)
    finally:
        producing.kill()
    assert producing.returncode == 1, err
    [line] = errors(err)
    said = re.fullmatch(
        r"Error: failed \(([\d,]+) of 10,000,000 messages stored"
        r"(; [\d,]+ more sent, whether they were stored is unknown)?\): .+",
        line,
    )
    assert said is not None, line
    assert int(said[1].replace(",", "")) > 0


def test_consume_that_fails_says_how_many_it_received(
    own_standalone: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure that is not an acknowledgment's (here the topic goes away under the
    consumer) ends it with what it had received and acknowledged before (trial 2, M3)."""
    topic = "persistent://t/ns/consumed"
    url = own_standalone.url
    assert invoke("topics", "create", topic, "--url", url).exit_code == 0
    assert invoke("produce", topic, "-n", "10", "--url", url).exit_code == 0
    receive = Consumer.receive
    taken = 0

    async def failing(self: Consumer, *args: Any, **kwargs: Any) -> Message:
        nonlocal taken  # (messages, not calls: a call may find none here yet)
        if taken == 4:
            raise TopicNotFound(f"topic {topic} does not exist")
        message = await receive(self, *args, **kwargs)
        taken += 1
        return message

    monkeypatch.setattr(Consumer, "receive", failing)
    result = invoke("consume", topic, "sub", "--url", url)
    assert result.exit_code == 1, result.output
    assert errors(result.stderr) == [
        f"Error: failed (4 messages received and acknowledged): "
        f"TopicNotFound: topic {topic} does not exist"
    ]


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_consume_goes_on_through_failed_acknowledgments(cluster: Cluster) -> None:
    """While the broker cannot save the subscription's cursor, acknowledgments fail
    (ServiceNotReady; the message may come again): consume warns once, counts them and goes
    on to the end, exit 0 (trial 2, M2)."""
    topic = "topic://t/ns/acks"
    async with Client(cluster.url) as client:
        await client.admin.create_topic(topic, segments=1)
        await client.admin.create_subscription(topic, "sub", initial_position="earliest")
        producer = await client.create_producer(topic)
        for i in range(20):
            await producer.send(b"m%d" % i)
    cursors = cursor_key(str(TopicName.parse(topic).segment_name(0)), "sub")
    cluster.faults.fail("txn", key_prefix=cursors, times=3)
    result = await asyncio.to_thread(
        invoke, "consume", topic, "sub", "-n", "20", "--url", cluster.url
    )
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 1, result.stderr
    assert "an acknowledgment failed (ServiceNotReady" in warnings[0]
    assert "may be delivered again" in warnings[0]
    async with Client(cluster.url) as client:  # the failed acks took effect (docs/protocol.md)
        stats = await client.admin.stats(topic)
    assert stats["segments"][0]["stats"]["subscriptions"]["sub"]["backlog"] == 0
    # Three store writes fail. Each cursor save carries every acknowledgment that arrived
    # while the one before was in flight (consume keeps up to ACKS_IN_FLIGHT of them on
    # their way), and a failed save fails them all: from one acknowledgment to all 20.
    said = re.search(r"received 20 messages.*; (\d+) acknowledgments? failed: those messages "
                     r"may be delivered again", result.stdout)  # fmt: skip
    assert said is not None and 1 <= int(said[1]) <= 20, result.stdout
