"""Automatic split and merge by load, opt-in per ScalableTopic (segtxn/operator/autoscaling.py):
Kopf against kmock, the daemon reading and changing a real broker's topic on a real etcd
while the test produces load."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from segtxn.client import Client
from segtxn.operator.autoscaling import history
from tests.operator.emulator import Emulator, emulator, operator
from tests.operator.support import WAIT_S, Local, cluster, status
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)
BASE = {"clusterRef": "demo", "tenant": "acme", "namespace": "auto"}
HOT = "topic://acme/auto/hot"
CALM = "topic://acme/auto/calm"
# Past 5 msg/s in is hot (the load below is far above it); the split cooldown is an hour,
# so a topic that stays hot after its first split must wait.
AUTOSCALE = {
    "enabled": True,
    "intervalSeconds": 1,
    "split": {"msgRateIn": 5, "cooldownSeconds": 3600},
    "merge": {"msgRateIn": 1},
}


def autoscaling(emu: Emulator, name: str) -> dict[str, Any]:
    found = [c for c in status(emu, "ScalableTopic", name).get("conditions", [])
             if c["type"] == "AutoScaling"]  # fmt: skip
    return found[0] if found else {}


def decision(emu: Emulator, name: str) -> dict[str, Any]:
    return dict(status(emu, "ScalableTopic", name).get("autoscale", {}).get("lastDecision", {}))


@contextlib.asynccontextmanager
async def load(url: str, *topics: str) -> AsyncIterator[None]:
    """Keyed messages to every segment of ``topics`` (about 100/s each) until exit."""
    stop = asyncio.Event()

    async def produce(client: Client, topic: str) -> None:
        producer = await client.create_producer(topic)
        i = 0
        while not stop.is_set():
            await asyncio.gather(*(producer.send(b"x", key=f"k{i + j}") for j in range(10)))
            i += 10
            await asyncio.sleep(0.1)  # sleep-ok: paces the load, waits for nothing
        await producer.close()

    async with Client(url) as client, asyncio.TaskGroup() as group:
        for topic in topics:
            group.create_task(produce(client, topic), name=f"load on {topic}")
        try:
            yield
        finally:
            stop.set()


async def test_auto_split_past_the_threshold_then_the_cooldown_holds(shared_local: Local) -> None:
    async with emulator() as emu, operator(emu, shared_local.memo()):
        await cluster(emu, shared_local)
        await emu.create("ScalableTopic", "hot", {**BASE, "topic": "hot", "autoscale": AUTOSCALE})
        await emu.create("ScalableTopic", "calm", {**BASE, "topic": "calm"})
        for name in ("hot", "calm"):

            def created(n: str = name) -> bool:
                return bool(status(emu, "ScalableTopic", n).get("activeSegments") == 1)

            await wait_until(created, timeout=WAIT_S, what=f"{name} created")

        async with load(shared_local.broker.url, HOT, CALM):
            await wait_until(lambda: decision(emu, "hot").get("action") == "Split",
                             timeout=WAIT_S, what="an automatic split")  # fmt: skip
            split = decision(emu, "hot")
            assert split["segments"] == [0] and split["reason"] == "HotSegment"
            assert "msg/s in > 5" in split["message"]
            # the children are hot too: the next decision is to wait for the cooldown
            await wait_until(lambda: decision(emu, "hot").get("reason") == "SplitCooldown",
                             timeout=WAIT_S, what="the cooldown holding")  # fmt: skip

        hot = status(emu, "ScalableTopic", "hot")
        assert hot["activeSegments"] == 2 and hot["sealedSegments"] == 1
        assert hot["autoscale"]["lastSplitTime"] == split["time"]
        assert "lastMergeTime" not in hot["autoscale"]
        held = autoscaling(emu, "hot")
        assert (held["status"], held["reason"]) == ("True", "SplitCooldown")
        assert "next in" in held["message"]
        events = [e for e in emu.events("hot") if e[1] == "AutoSplit"]
        assert len(events) == 1 and events[0][0] == "Normal"
        assert events[0][2].startswith(f"{HOT}: segment 0 [0x0000-0xffff] is hot")

        async with Client(shared_local.broker.url) as client:
            assert (await client.admin.stats(HOT))["epoch"] == 1  # one change, no more
            calm = await client.admin.stats(CALM)
        # the opted-out topic took the same load and was left alone
        assert (calm["epoch"], calm["activeSegments"]) == (0, 1)
        assert "autoscale" not in status(emu, "ScalableTopic", "calm")
        assert autoscaling(emu, "calm") == {}
        assert not [e for e in emu.events("calm") if e[1].startswith("Auto")]


async def test_a_policy_that_cannot_work_then_target_segments_then_opting_out(
    shared_local: Local,
) -> None:
    async with emulator() as emu, operator(emu, shared_local.memo()):
        await cluster(emu, shared_local)
        # a split threshold under the default merge one (1000 msg/s): refused
        bad = {**AUTOSCALE, "merge": {}}
        await emu.create("ScalableTopic", "t", {**BASE, "topic": "t", "autoscale": bad})
        await wait_until(lambda: autoscaling(emu, "t").get("reason") == "InvalidPolicy",
                         timeout=WAIT_S, what="the policy refused")  # fmt: skip
        assert autoscaling(emu, "t")["status"] == "False"
        assert "must be below the split threshold" in autoscaling(emu, "t")["message"]
        await wait_until(lambda: any(e[:2] == ("Warning", "InvalidPolicy")
                                     for e in emu.events("t")),
                         timeout=WAIT_S, what="a Warning event")  # fmt: skip

        # the API server refuses autoscale with targetSegments (CEL); without it, the
        # daemon does not fight the target
        await emu.patch("ScalableTopic", "t", {"spec": {"autoscale": AUTOSCALE,
                                                        "targetSegments": 1}})  # fmt: skip
        await wait_until(lambda: autoscaling(emu, "t").get("reason") == "TargetSegmentsSet",
                         timeout=WAIT_S, what="targetSegments said")  # fmt: skip

        await emu.patch("ScalableTopic", "t", {"spec": {"targetSegments": None}})
        await wait_until(lambda: autoscaling(emu, "t").get("status") == "True",
                         timeout=WAIT_S, what="autoscaling at work")  # fmt: skip
        await wait_until(lambda: decision(emu, "t").get("reason") == "WithinThresholds",
                         timeout=WAIT_S, what="an idle topic left as it is")  # fmt: skip
        assert decision(emu, "t")["action"] == "None"

        await emu.patch("ScalableTopic", "t", {"spec": {"autoscale": {"enabled": False}}})
        await wait_until(lambda: autoscaling(emu, "t").get("reason") == "Disabled",
                         timeout=WAIT_S, what="opted out")  # fmt: skip
        assert autoscaling(emu, "t")["status"] == "False"
        assert status(emu, "ScalableTopic", "t")["activeSegments"] == 1


async def test_two_idle_segments_merge_once_cold_for_the_window(shared_local: Local) -> None:
    idle = {**AUTOSCALE, "merge": {"msgRateIn": 1, "windowSeconds": 2, "cooldownSeconds": 0}}
    async with emulator() as emu, operator(emu, shared_local.memo()):
        await cluster(emu, shared_local)
        spec = {**BASE, "topic": "idle", "initialSegments": 2, "autoscale": idle}
        await emu.create("ScalableTopic", "idle", spec)
        await wait_until(lambda: decision(emu, "idle").get("action") == "Merge",
                         timeout=WAIT_S, what="an automatic merge")  # fmt: skip
        merged = decision(emu, "idle")
        assert merged["segments"] == [0, 1] and merged["reason"] == "ColdPair"
        topic = status(emu, "ScalableTopic", "idle")
        assert (topic["activeSegments"], topic["sealedSegments"]) == (1, 2)
        assert topic["autoscale"]["lastMergeTime"] == merged["time"]
        await wait_until(lambda: any(e[:2] == ("Normal", "AutoMerge") for e in emu.events("idle")),
                         timeout=WAIT_S, what="the AutoMerge event")  # fmt: skip
        # one segment left: nothing more to merge, and nothing was split
        await wait_until(lambda: decision(emu, "idle").get("reason") == "WithinThresholds",
                         timeout=WAIT_S, what="left as it is")  # fmt: skip
        async with Client(shared_local.broker.url) as client:
            assert (await client.admin.stats("topic://acme/auto/idle"))["epoch"] == 1


def test_cooldowns_count_from_the_later_of_the_status_and_the_topics_last_change() -> None:
    status_ = {"autoscale": {"lastSplitTime": "2026-01-01T00:00:00Z"}}
    manual = {"lastChange": {"kind": "split", "finishedMs": 1_767_225_660_000}}  # a minute on
    found = history(status_, manual, {3: 1.0})
    assert found.last_split_s == 1_767_225_660.0 and found.last_merge_s is None
    assert found.cold_since_s == {3: 1.0}
    merged = history(status_, {"lastChange": {"kind": "merge", "finishedMs": 5_000}}, {})
    assert (merged.last_split_s, merged.last_merge_s) == (1_767_225_600.0, 5.0)
    assert history({}, {}, {}).last_split_s is None
