"""A retire (or a prune) landing between a split's or merge's read of the topic's record and
its plan's compare-and-set: the change is planned again on the record read afresh instead
of failing with TopicBusy, a bounded number of times, and only when the active segments
are as they were (segtxn/topics/controller.py). The race is forced: the controller's read
is held (``FaultInjector.hold``) while the sweep retires and prunes a sealed segment."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.broker.retire import retire_segments
from segtxn.client import Client
from segtxn.topics.catalog import topic_key
from segtxn.topics.controller import PLAN_ATTEMPTS, Controller, TopicBusy
from segtxn.topics.model import SegmentState
from tests.cluster import Cluster
from tests.topics.test_retire import LATER_MS, SEALED, _split_with_data
from tests.topics.test_retire_positions import NAME, _consume_all

KEY = topic_key(NAME)


def _controller(cluster: Cluster) -> Controller:
    service = cluster.broker.service
    return Controller(cluster.store, service.catalog, service.controllers.segment_ops())


async def _ready_to_retire(client: Client) -> None:
    """0 split into 1 and 2, every message of 0 acknowledged: a sweep retires 0."""
    await _split_with_data(client)
    await _consume_all(client)


async def test_a_split_whose_read_a_retire_overtakes_is_planned_again(
    cluster: Cluster, client: Client
) -> None:
    await _ready_to_retire(client)
    held = cluster.faults.hold("range", key_prefix=KEY, times=1)
    split = asyncio.create_task(_controller(cluster).split(NAME, 1))
    await held.wait_for(1)  # the split has read the record (0 still in it)...
    assert await retire_segments(cluster.broker.service, LATER_MS) == [SEALED]  # ...0 goes
    held.release()
    done = await split
    assert done.segment(0) is None  # planned on the record without 0
    one = done.segment(1)
    assert one is not None and one.state is SegmentState.SEALED and len(one.children) == 2
    assert [s.id for s in done.active()] == [3, 4, 2]


async def test_a_merge_whose_read_a_retire_overtakes_is_planned_again(
    cluster: Cluster, client: Client
) -> None:
    await _ready_to_retire(client)
    held = cluster.faults.hold("range", key_prefix=KEY, times=1)
    merge = asyncio.create_task(_controller(cluster).merge(NAME, 1, 2))
    await held.wait_for(1)
    assert await retire_segments(cluster.broker.service, LATER_MS) == [SEALED]
    held.release()
    done = await merge
    assert done.segment(0) is None
    assert [(s.id, s.lo, s.hi) for s in done.active()] == [(3, 0, 0xFFFF)]


async def test_a_split_that_a_completed_split_overtakes_is_still_topic_busy(
    cluster: Cluster, client: Client
) -> None:
    """Not planned again: the active segments changed (the epoch moved)."""
    await _split_with_data(client)
    held = cluster.faults.hold("range", key_prefix=KEY, times=1)
    split = asyncio.create_task(_controller(cluster).split(NAME, 1))
    await held.wait_for(1)
    await _controller(cluster).split(NAME, 2)
    held.release()
    with pytest.raises(TopicBusy, match="changed meanwhile"):
        await split


async def test_planning_again_is_bounded(cluster: Cluster, client: Client) -> None:
    """A record that changes between every read and its compare-and-set (here, written
    again unchanged) ends in TopicBusy after PLAN_ATTEMPTS plans."""
    await _split_with_data(client)
    record = await cluster.store.get(KEY)
    assert record is not None
    held = cluster.faults.hold("range", key_prefix=KEY, times=PLAN_ATTEMPTS)
    split = asyncio.create_task(_controller(cluster).split(NAME, 1))
    for call in range(PLAN_ATTEMPTS):
        await held.wait_for(call + 1)
        await cluster.store.put(KEY, record.value)  # a new version, no read: not held
        held.release(call)
    with pytest.raises(TopicBusy, match="changed meanwhile"):
        await split
    after = await cluster.store.get(KEY)
    assert after is not None and after.value == record.value  # nothing was planned
