"""The controllers' sweep (segtxn/broker/controllers.py) past a topic record that does not
decode: the bad record is reported once, by key, and every other topic's pending split or
merge is still finished.

Real components: the cluster's broker on its store (memory and a real etcd), a second
sweeping :class:`TopicControllers` on the broker's own store, session and HTTP session.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from segtxn.broker.controllers import HttpSegmentOps, TopicControllers
from segtxn.broker.fanout import HTTP
from segtxn.client import Client
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import topic_key
from segtxn.topics.controller import Controller
from segtxn.topics.model import ScalableTopic, decode_topic
from tests.cluster import Cluster
from tests.waiting import wait_until

DAMAGED = b'{"type": "scalable", "epoch": "not a number"}'


class SealFailsOnce:
    """Segment operations whose first seal fails after sealing: a controller that died
    half-way through a split, leaving it pending."""

    def __init__(self, inner: HttpSegmentOps) -> None:
        self.inner = inner
        self.failed = False

    async def subscriptions(self, segment: TopicName) -> list[str]:
        return await self.inner.subscriptions(segment)

    async def prepare(self, segment: TopicName, subscriptions: list[str]) -> None:
        await self.inner.prepare(segment, subscriptions)

    async def seal(self, segment: TopicName) -> None:
        await self.inner.seal(segment)
        if not self.failed:
            self.failed = True
            raise ConnectionError("the controller died here")


async def test_the_sweep_reports_a_damaged_record_once_and_finishes_the_others(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    service = cluster.broker.service
    http = cluster.broker.app[HTTP]
    namespace = f"topic://acme/sweep-{uuid.uuid4().hex[:8]}"  # a key ERROR-logged once per process
    damaged_topic = f"{namespace}/a-damaged"  # listed before the stuck one
    stuck = TopicName.parse(f"{namespace}/b-stuck")
    damaged_key = topic_key(TopicName.parse(damaged_topic))
    async with Client(cluster.url) as client:
        await client.admin.create_topic(damaged_topic, segments=1)
        await client.admin.create_topic(str(stuck), segments=1)
    ops = SealFailsOnce(HttpSegmentOps(service.catalog, http))
    with pytest.raises(ConnectionError):
        await Controller(service.store, service.catalog, ops).split(stuck, 0)
    await service.store.put(damaged_key, DAMAGED)

    async def finished() -> bool:
        record = await service.store.get(topic_key(stuck))
        assert record is not None
        topic = decode_topic(record.value)
        return isinstance(topic, ScalableTopic) and topic.pending is None

    assert not await finished()
    sweeping = TopicControllers(
        service.store,
        service.catalog,
        advertise_url=service.settings.advertise_url,
        sweep_s=0.05,
        session=service.session,
        metrics=service.metrics,
    )
    with caplog.at_level(logging.DEBUG, logger="segtxn.broker.controllers"):
        sweeping.start(http)
        try:
            await wait_until(finished, what="the stuck split finished by the sweep")
            rounds = len([r for r in caplog.records if damaged_key in r.getMessage()])
            await wait_until(  # a few more rounds meet the damaged record again
                lambda: (
                    len([r for r in caplog.records if damaged_key in r.getMessage()]) >= rounds + 2
                ),
                what="more sweep rounds",
            )
        finally:
            await sweeping.stop()
    sweep = [r for r in caplog.records if r.name == "segtxn.broker.controllers"]
    errors = [r.getMessage() for r in sweep if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and damaged_key in errors[0], errors
    assert all(r.exc_info is None for r in sweep), "a traceback was logged"
