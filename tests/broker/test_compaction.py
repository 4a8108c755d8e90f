"""The broker's store watches after the store compacted the history they would resume from.

A long-running store keeps only recent history (etcd's auto-compaction; the memory engine's
bounded history). A watch that needs older history ends with ``Compacted``; what a broker
builds on a watch must then re-read and carry on, never stall or fail for good.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import topic_key
from tests.cluster import Cluster

TOPIC = "topic://acme/compact/events"


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    """A client of the cluster (tests/broker's own ``client`` is of a lone broker)."""
    async with Client(cluster.url) as c:
        yield c


async def test_a_lookup_session_on_a_topic_older_than_the_history_pushes_changes(
    client: Client, cluster: Cluster
) -> None:
    """Regression: the session watched from the topic record's own version, the revision it
    was last written at. Once compaction passed it (any topic left alone longer than the
    retention), every session failed right after its first frame, the client reconnected
    every 2 s, and no change was ever pushed."""
    await client.admin.create_topic(TOPIC, segments=1)
    for i in range(5):  # later writes elsewhere: the topic's record is now history
        await cluster.store.put(f"/unrelated/{i}", b"x")
    await cluster.store.compact(await cluster.store.revision())
    topic = TopicName.parse(TOPIC)
    ws = await client.connector.websocket(client.connector.service_url, "lookup", topic, "", {})
    async with ws:
        first = await ws.receive(timeout=10)
        assert first.type is aiohttp.WSMsgType.TEXT
        assert len(json.loads(first.data)["segments"]) == 1
        await client.admin.split(TOPIC, 0)
        while True:  # the split may be pushed in steps: wait for its last one
            pushed = await ws.receive(timeout=10)
            assert pushed.type is aiohttp.WSMsgType.TEXT, pushed  # not a close: it lives on
            dag = json.loads(pushed.data)
            if sum(s["state"] == "ACTIVE" for s in dag["segments"]) == 2:
                break
        assert dag["epoch"] > json.loads(first.data)["epoch"]


async def test_a_lookup_session_cut_off_past_the_history_sends_what_changed_meanwhile(
    client: Client, cluster: Cluster
) -> None:
    """The session's watch is down while the topic is split and the history compacted: when
    it comes back, the session reads the topic again and sends the new DAG."""
    await client.admin.create_topic(TOPIC, segments=1)
    topic = TopicName.parse(TOPIC)
    ws = await client.connector.websocket(client.connector.service_url, "lookup", topic, "", {})
    async with ws:
        first = await ws.receive(timeout=10)
        assert first.type is aiohttp.WSMsgType.TEXT
        cluster.faults.fail("watch", key_prefix=topic_key(topic), times=None)
        assert cluster.faults.drop_watches() >= 1  # the session's, and the broker's own
        await client.admin.split(TOPIC, 0)
        await cluster.store.compact(await cluster.store.revision())
        cluster.faults.clear()
        while True:
            pushed = await ws.receive(timeout=10)
            assert pushed.type is aiohttp.WSMsgType.TEXT, pushed
            dag = json.loads(pushed.data)
            if sum(s["state"] == "ACTIVE" for s in dag["segments"]) == 2:
                break
