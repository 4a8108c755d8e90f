"""`segtxn topics autoscale`: automatic split/merge once, without Kubernetes, against
`segtxn standalone` as a user runs it (measure over --window, decide, --apply)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from segtxn.client import Client
from tests.cli.test_txn_cli import segtxn, standalone

assert standalone  # the fixture
pytestmark = pytest.mark.timeout(120)
IDLE = "topic://acme/cli/idle"
BUSY = "topic://acme/cli/busy"


@contextlib.asynccontextmanager
async def load(url: str, topic: str) -> AsyncIterator[None]:
    """Messages with one key (one segment) until exit."""
    stop = asyncio.Event()

    async def produce(client: Client) -> None:
        producer = await client.create_producer(topic)
        while not stop.is_set():
            await asyncio.gather(*(producer.send(b"x", key="one-key") for _ in range(10)))
            await asyncio.sleep(0.05)  # sleep-ok: paces the load, waits for nothing
        await producer.close()

    async with Client(url) as client, asyncio.TaskGroup() as group:
        group.create_task(produce(client), name="load")
        try:
            yield
        finally:
            stop.set()


async def test_autoscale_says_and_applies_a_decision(standalone: str) -> None:
    async with Client(standalone) as client:
        await client.admin.create_topic(IDLE, segments=2)
        await client.admin.create_topic(BUSY, segments=2)

    # two idle adjacent segments, cold over the whole window: merged with --apply
    policy = json.dumps({"merge": {"windowSeconds": 0}})
    code, out = await segtxn("topics", "autoscale", "--url", standalone, IDLE, "--window", "0.5",
                             "--policy", policy, "--apply")  # fmt: skip
    assert code == 0, out
    assert f"merged segments 0 [0x0000-0x7fff] and 1 [0x8000-0xffff] of {IDLE} into 2" in out

    # one hot segment: a split said, not made without --apply
    policy = json.dumps({"split": {"msgRateIn": 2}, "merge": {"msgRateIn": 1}})
    async with load(standalone, BUSY):
        code, out = await segtxn("topics", "autoscale", "--url", standalone, BUSY,
                                 "--window", "2", "--policy", policy, "-o", "json")  # fmt: skip
    assert code == 0, out
    said = json.loads(out)
    assert (said["action"], said["reason"], said["dag"]) == ("Split", "HotSegment", None)
    (hot,) = said["segments"]
    assert said["loads"][str(hot)]["msg_in_per_s"] > 2
    assert said["loads"][str(1 - hot)]["msg_in_per_s"] == 0
    async with Client(standalone) as client:
        assert (await client.admin.stats(BUSY))["epoch"] == 0  # said, not made

    code, out = await segtxn("topics", "autoscale", "--url", standalone, BUSY,
                             "--policy", '{"split": {"msgRateIn": 10}}')  # fmt: skip
    assert code == 2 and "must be below the split threshold" in out

    # nothing to do: said in words, not as the action's name
    code, out = await segtxn("topics", "autoscale", "--url", standalone, BUSY, "--window", "0.5")
    assert code == 0, out
    assert out.splitlines()[-1].startswith("no change (NotColdLongEnough): "), out
