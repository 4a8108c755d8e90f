"""A scalable topic deleted while a split of it is in progress: the deletion stops the split
and deletes the children it prepared. Before, it deleted only the segments in the DAG: the
children's ledgers stayed on their broker's disk with nothing left to name them, and a
controller sweep could still complete the split after the deletion had read the record."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from segtxn.broker.controllers import HttpSegmentOps
from segtxn.broker.fanout import HTTP
from segtxn.client import Client, ErrorName, ServerError
from segtxn.ledger.metadata import metadata_key
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import home_key, topic_key
from segtxn.topics.controller import Controller
from segtxn.topics.model import ScalableTopic, decode_topic
from tests.cluster import Cluster

TOPIC = "topic://acme/scale/doomed"
NAME = TopicName.parse(TOPIC)
CHILDREN = [NAME.segment_name(1), NAME.segment_name(2)]


class Stopping:
    """SegmentOps that fail at ``stop`` (``"prepare"``: before the first prepare; ``"seal"``:
    at the first seal): the split stops there with its intent pending, as when its
    controller dies there."""

    def __init__(self, inner: HttpSegmentOps, stop: str) -> None:
        self.inner = inner
        self.stop = stop

    async def subscriptions(self, segment: TopicName) -> list[str]:
        return await self.inner.subscriptions(segment)

    async def prepare(self, segment: TopicName, subscriptions: list[str]) -> None:
        if self.stop == "prepare":
            raise ConnectionError("the controller died here")
        await self.inner.prepare(segment, subscriptions)

    async def seal(self, segment: TopicName) -> None:
        raise ConnectionError("the controller died here")


async def _stop_a_split(cluster: Cluster, stop: str) -> HttpSegmentOps:
    """``TOPIC`` (one segment, a message in it) with a split of it stopped at ``stop``;
    the segment ops to go on with it."""
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC, segments=1)
        producer = await client.create_producer(TOPIC)
        await producer.send(b"m", key="k")
    service = cluster.broker.service
    ops = HttpSegmentOps(service.catalog, cluster.broker.app[HTTP])
    with pytest.raises(ConnectionError):
        await Controller(service.store, service.catalog, Stopping(ops, stop)).split(NAME, 0)
    for child in CHILDREN:  # placed, and with "seal", prepared
        assert await service.store.get(home_key(child)) is not None
        prepared = await service.store.get(metadata_key(str(child))) is not None
        assert prepared is (stop == "seal")
    return ops


def _on_disk(root: Path, segment: TopicName) -> bool:
    return (root / "ledgers" / quote(str(segment), safe="")).exists()


@pytest.mark.parametrize("loaded", [True, False], ids=["loaded", "unloaded"])
async def test_a_deletion_deletes_the_children_a_stopped_split_prepared(
    cluster: Cluster, tmp_path: Path, loaded: bool
) -> None:
    """Prepared children are loaded on their broker, or not (unloaded when idle, or their
    broker restarted): a child that is not is deleted without loading it, sealed or not."""
    await _stop_a_split(cluster, "seal")
    assert all(_on_disk(tmp_path, child) for child in CHILDREN)
    if not loaded:
        for child in CHILDREN:
            await cluster.broker.service.unload(child)
    async with Client(cluster.url) as client:
        await client.admin.delete_topic(TOPIC, force=True)
    store = cluster.broker.service.store
    assert await store.get(topic_key(NAME)) is None
    for segment in [NAME.segment_name(0), *CHILDREN]:
        assert await store.get(metadata_key(str(segment))) is None, segment
        assert await store.get(home_key(segment)) is None, segment
        assert not _on_disk(tmp_path, segment), segment
        assert segment not in cluster.broker.service.topics


async def test_a_marked_topics_split_neither_prepares_nor_completes(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Between the mark and the deletion's end, a controller going on with the split would
    prepare a child the deletion deleted already (made again, left on disk), or complete
    the split (children the deletion read no record of): neither happens."""
    ops = await _stop_a_split(cluster, "prepare")
    service = cluster.broker.service
    assert await service.catalog.mark_deleting(NAME) is not None
    with pytest.raises(ServerError) as refused:
        await ops.prepare(CHILDREN[0], [])
    assert refused.value.name is ErrorName.TOPIC_NOT_FOUND
    assert "is being deleted" in refused.value.message
    assert await service.store.get(metadata_key(str(CHILDREN[0]))) is None
    assert not _on_disk(tmp_path, CHILDREN[0])
    assert await Controller(service.store, service.catalog, ops).finish(NAME) is None
    record = await service.store.get(topic_key(NAME))
    assert record is not None
    topic = decode_topic(record.value)
    assert isinstance(topic, ScalableTopic)
    assert topic.pending is not None and topic.epoch == 0  # not completed
    assert [s.id for s in topic.segments] == [0] and topic.creating() == [1, 2]
    async with Client(cluster.url) as client:
        await client.admin.delete_topic(TOPIC, force=True)  # the children's homes go too
    for child in CHILDREN:
        assert await service.store.get(home_key(child)) is None
