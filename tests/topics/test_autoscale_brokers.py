"""Load on one segment of a real broker's scalable topic leads to a decision to split that
segment, and only that one: the rates read from the brokers' stats (two readings a window
apart, segtxn/topics/segmentload.py), the decision from segtxn/topics/autoscale.py."""

from __future__ import annotations

import time

import pytest

from segtxn.client import Client
from segtxn.protocol.hashing import key_hash
from segtxn.topics.autoscale import Action, History, Policy, Why, decide, segments_of
from segtxn.topics.segmentload import Load, rates, reading
from tests.cluster import Cluster

TOPIC = "topic://acme/autoscale/clicks"
# 200 messages over any window shorter than 200 s are past 1 msg/s: holds on a busy machine
POLICY = Policy(split=Load(1, 10**9, 1, 10**9), merge=Load(0.1, 1, 0.1, 1))


async def test_load_on_one_segment_leads_to_splitting_it(cluster: Cluster) -> None:
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC, segments=2)
        consumer = await client.subscribe(TOPIC, "readers", subscription_type="Shared")
        producer = await client.create_producer(TOPIC)
        first = await client.admin.stats(TOPIC)
        upper = next(s for s in first["segments"] if s["range"][0] == 0x8000)
        keys = [k for k in (f"user-{i}" for i in range(200)) if key_hash(k) >= 0x8000][:10]
        before = reading(first, time.monotonic())
        sent = 200
        for i in range(sent):
            await producer.send(f"click {i}".encode(), key=keys[i % len(keys)])
        for _ in range(sent):
            await consumer.acknowledge(await consumer.receive(timeout_s=20))
        second = await client.admin.stats(TOPIC)
        after = reading(second, time.monotonic())
        await producer.close()
        await consumer.close()

    loads = rates(before, after)
    window = after.at_s - before.at_s
    hot, other = loads[upper["id"]], next(v for k, v in loads.items() if k != upper["id"])
    assert hot.msg_in_per_s * window == pytest.approx(
        sent
    )  # every message counted once, on its segment
    assert hot.msg_out_per_s * window == pytest.approx(sent) and hot.bytes_out_per_s > 0
    assert other == Load(0, 0, 0, 0)
    print(f"hot segment over {window:.2f} s: {hot.describe()}")

    decision = decide(segments_of(second), loads, POLICY, History(), time.time())
    assert (decision.action, decision.segments, decision.why) == (
        Action.SPLIT,
        (upper["id"],),
        Why.HOT,
    )
