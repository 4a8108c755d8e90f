"""``segtxn consume`` keeps acknowledging while earlier acknowledgments await their answers,
a bounded number at once (a real broker whose store holds the cursor's first save, and a
real ``segtxn consume``).

Before, it awaited each acknowledgment's answer before it received the next message: one
round trip per message, about 1,400 msg/s on a memory standalone and 300 on etcd, against
7-9k for produce."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from click.testing import CliRunner, Result

from segtxn.cli.acks import ACKS_IN_FLIGHT
from segtxn.cli.commands import main
from segtxn.client import Client, Consumer, Message
from segtxn.ledger.cursor import cursor_key
from segtxn.protocol.errors import NotAuthorized
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://t/ns/acks-in-flight"
MORE = 10
"""Messages beyond the acknowledgments allowed in flight."""
MESSAGES = ACKS_IN_FLIGHT + MORE


async def _backlog(client: Client) -> int:
    stats = await client.admin.stats(TOPIC)
    return int(stats["segments"][0]["stats"]["subscriptions"]["sub"]["backlog"])


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_consume_acknowledges_on_while_answers_are_awaited(cluster: Cluster) -> None:
    """The broker's store holds the answer of the subscription's first cursor save, so no
    acknowledgment is answered: consume goes on receiving and acknowledging until
    ACKS_IN_FLIGHT of them await their answers (the broker applies each in memory as it
    arrives: the backlog shows them), and no further. Let go, every one is answered and
    consume ends as before: every message received and acknowledged.

    Before, the first acknowledgment's answer stopped it: the backlog stayed at one less
    than the messages sent for as long as the store held the save."""
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC, segments=1)
        await client.admin.create_subscription(TOPIC, "sub", initial_position="earliest")
        producer = await client.create_producer(TOPIC)
        for i in range(MESSAGES):
            await producer.send_async(b"m%d" % i)
        await producer.flush()
        cursors = cursor_key(str(TopicName.parse(TOPIC).segment_name(0)), "sub")
        held = cluster.faults.hold("txn", key_prefix=cursors, times=1)
        command = ["consume", TOPIC, "sub", "-n", str(MESSAGES), "--url", cluster.url]
        consuming = asyncio.create_task(asyncio.to_thread(_invoke, *command))
        try:
            await held.wait_for(1, timeout_s=30)

            async def window_full() -> bool:
                assert not consuming.done(), consuming.result().output
                return await _backlog(client) <= MORE

            await wait_until(window_full, timeout=30, what="acknowledgments while one awaits")
            # the window is full: it waits for the oldest answer before it goes on
            assert await _backlog(client) == MORE
            assert held.parked == 1 and not consuming.done()
        finally:
            held.release()
            result = await consuming
        assert await _backlog(client) == 0
    assert result.exit_code == 0, (result.output, result.stderr)
    assert f"received {MESSAGES} messages" in result.stdout, result.stdout
    assert "acknowledgment" not in result.output, result.output


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_an_acknowledgment_refused_for_good_stops_consume_once_the_rest_are_answered(
    standalone: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fifth acknowledgment is refused (NotAuthorized: not retriable): consume stops
    with that error, having received no more than its window beyond it, and says how far
    it got once the acknowledgments still on their way are answered: every message but
    that one acknowledged, none in doubt."""
    topic = "persistent://t/ns/ack-refused"
    assert _invoke("topics", "create", topic, "--url", standalone).exit_code == 0
    assert _invoke("produce", topic, "-n", "50", "--url", standalone).exit_code == 0
    acknowledge_async = Consumer.acknowledge_async
    acks = 0

    async def refusing(self: Consumer, message: Message, **kwargs: Any) -> asyncio.Future[None]:
        nonlocal acks
        acks += 1
        if acks != 5:
            return await acknowledge_async(self, message, **kwargs)
        refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        refused.set_exception(NotAuthorized("no consume on t/ns"))
        return refused

    monkeypatch.setattr(Consumer, "acknowledge_async", refusing)
    result = _invoke("consume", topic, "sub", "--initial", "earliest", "--url", standalone)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.stderr and "never retrieved" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    said = re.fullmatch(
        r"Error: failed \((\d+) messages received, (\d+) of them acknowledged \(1 "
        r"acknowledgment failed: those messages may be delivered again\)\): NotAuthorized: "
        r"no consume on t/ns",
        line,
    )
    assert said is not None, line
    received, acknowledged = int(said[1]), int(said[2])
    assert 5 <= received <= 5 + ACKS_IN_FLIGHT and acknowledged == received - 1, line
