"""Calls that find a topic unloaded at the same moment load it once. ``serve`` reads the
topic's home before it loads; a call whose read was slow used to find the load of a faster
call finished (no load in flight, the topic not checked again) and load a second instance
over the first: two dispatchers for one subscription, each delivering the same messages to
its own consumer and each accepting their acknowledgments (the soak's seed 97000, after a
segment moved: 110 inputs processed twice, and order broken)."""

from __future__ import annotations

import asyncio

from segtxn.client import Client
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import home_key
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "persistent://acme/loads/once"


async def test_a_call_whose_home_read_was_slow_gets_the_topic_already_loaded(
    cluster: Cluster,
) -> None:
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    await service.unload(name)
    assert name not in service.topics
    assert await service.catalog.home_of(name) == service.broker_id
    held = cluster.faults.hold("range", key_prefix=home_key(name), times=1)
    slow = asyncio.create_task(service.serve(name))  # its home read is held
    await held.wait_for(1)
    first = await service.serve(name)  # reads the home, loads, done
    held.release(0)
    assert await slow is first  # not a second instance
    assert service.topics[name] is first
    await wait_until(lambda: not service.is_loading(name), what="no load in flight")
